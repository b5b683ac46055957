"""Credentials never reach a status, an event or a log line written from an error or a spec field."""

import re

_URL_CREDENTIALS = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
_SECRET_VALUES = re.compile(
    r"(?i)\b(authorization|bearer|token|password|passwd|secret|api[_-]?key)"  # the key
    r"([\"']?\s*[:=]\s*[\"']?|\s+)"  # its separator
    r"(?:(?:bearer|basic)\s+)?[^\s,;\"'&]+"  # the value (an Authorization header's scheme included)
)


def redact(text: str) -> str:
    """`text` without credentials: scheme://user:pass@host -> scheme://***@host, token=abc -> token=***."""
    return _SECRET_VALUES.sub(r"\1\2***", _URL_CREDENTIALS.sub(r"\1***@", text))
