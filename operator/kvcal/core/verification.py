"""The verification Job's verdict, read one way for the verification before the canary and after a promotion."""

import json
from typing import Any

from kvcal.core.observations import JobState
from kvcal.models.status import VerificationStatus


def verification_result(job: JobState) -> tuple[VerificationStatus, bool]:
    """The verification Job's summary (its termination message) and whether vLLM loaded every scale."""
    try:
        parsed = json.loads(job.message)
    except ValueError:
        parsed = {}
    summary: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
    raw_problems = summary.get("problems")
    problems: list[Any] = raw_problems if isinstance(raw_problems, list) else []
    verification = VerificationStatus(
        job=job.name,
        layers=summary.get("layers") if isinstance(summary.get("layers"), int) else None,
        mismatches=summary.get("mismatches") if isinstance(summary.get("mismatches"), int) else None,
        message=("; ".join(str(p) for p in problems) or job.message.strip() or job.reason)[:1024] or None,
    )
    ok = job.state == "Succeeded" and summary.get("ok") is True and not verification.mismatches
    return verification, ok
