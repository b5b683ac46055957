"""Kubernetes' timestamp format (RFC 3339, second precision, Z suffix): written and read here only."""

from datetime import UTC, datetime

FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def rfc3339(moment: datetime) -> str:
    """'2026-01-02T03:04:05Z'; a naive datetime is taken as UTC."""
    return (moment.astimezone(UTC) if moment.tzinfo else moment).strftime(FORMAT)


def parse_rfc3339(value: str) -> datetime:
    """An aware datetime from what rfc3339() (or the API server) wrote."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
