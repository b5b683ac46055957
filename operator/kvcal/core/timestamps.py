"""Kubernetes' timestamp formats, written and read here only: Time (RFC 3339, second precision, Z suffix) and
MicroTime (the same with microseconds)."""

from datetime import UTC, datetime

FORMAT = "%Y-%m-%dT%H:%M:%SZ"
MICRO_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def rfc3339(moment: datetime) -> str:
    """'2026-01-02T03:04:05Z'; a naive datetime is taken as UTC."""
    return (moment.astimezone(UTC) if moment.tzinfo else moment).strftime(FORMAT)


def micro_time(moment: datetime) -> str:
    """'2026-01-02T03:04:05.123456Z', the API's MicroTime (Lease renewTime, Event eventTime); naive is UTC."""
    return (moment.astimezone(UTC) if moment.tzinfo else moment).strftime(MICRO_FORMAT)


def parse_rfc3339(value: str) -> datetime:
    """An aware datetime from what rfc3339() (or the API server) wrote."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
