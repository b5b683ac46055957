"""Credentials never reach a status, an event or a log line written from an error or a spec field."""

import re

_URL_CREDENTIALS = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
# A value after a key: quoted (spaces and escaped quotes included) or up to the next separator.
_VALUE = r"(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|(?:(?:bearer|basic)\s+)?[^\s,;\"'&}\]]+)"
_SECRET_VALUES = re.compile(
    r"(?i)\b(authorization|bearer|token|password|passwd|secret|api[_-]?key)"  # the key
    r"([\"']?\s*[:=]\s*|\s+)" + _VALUE  # its separator
)
# Compound key names (SecretAccessKey, AccessKeyId, x-api-key, client_secret, X-Auth-Token, aws_session_token, ...):
# any name holding one of these words, followed by : or =. "tokens" is a count, not a credential.
_COMPOUND_KEYS = re.compile(
    r"(?i)([\w.-]*(?:secret|token(?!s)|passw(?:or)?d|api[_-]?key|access[_-]?key|private[_-]?key|credential"
    r"|session|signature|cookie)[\w.-]*)"
    r"([\"']?\s*[:=]\s*)" + _VALUE
)
# Credentials recognisable by their shape alone: AWS access key ids, JSON Web Tokens.
_SHAPED = re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|\beyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]*")


def _masked(match: re.Match[str]) -> str:
    value = match.group(3)
    quote = value[0] if value[:1] in "\"'" and len(value) > 1 else ""
    return f"{match.group(1)}{match.group(2)}{quote}***{quote}"


def redact(text: str) -> str:
    """`text` without credentials: scheme://user:pass@host -> scheme://***@host, token=abc -> token=***,
    {"SecretAccessKey": "abc"} -> {"SecretAccessKey": "***"}."""
    text = _URL_CREDENTIALS.sub(r"\1***@", text)
    text = _SECRET_VALUES.sub(_masked, text)
    text = _COMPOUND_KEYS.sub(_masked, text)
    return _SHAPED.sub("***", text)
