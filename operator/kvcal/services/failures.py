"""A failed reconcile pass, told where users look: the ReconcileError condition, a Warning event, a metric.

The pass that failed wrote nothing (decide's status is written only after every action succeeded), so the
reconciler writes this condition itself. The message is what the user needs, with no credentials: URLs lose their
user:password, token-like values are masked, and a Kubernetes API error is reduced to its status and message.
"""

import json

from kubernetes.client.exceptions import ApiException

from kvcal.core.guard.redact import redact

MAX_MESSAGE = 512


def describe_failure(error: BaseException) -> tuple[str, str]:
    """(reason, message) for the condition and the event: the exception's class, then one redacted line."""
    if isinstance(error, ApiException):
        try:
            detail = str(json.loads(error.body or "{}").get("message") or "")
        except (ValueError, AttributeError):
            detail = ""
        text = f"Kubernetes API error {error.status} {error.reason}" + (f": {detail}" if detail else "")
    else:
        lines = str(error).strip().splitlines()
        text = f"{type(error).__name__}: {lines[0] if lines else 'no message'}"
    reason = type(error).__name__ if type(error).__name__[:1].isupper() else "ReconcileError"
    return reason, redact(text)[:MAX_MESSAGE]
