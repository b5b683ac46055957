"""Lifecycle events come from status.history: one Event per history entry, named after the object's uid and the
entry, so the reconciler can (re)send them after any restart and the API server's AlreadyExists says "sent"."""

import hashlib

from kvcal.core.observations import Event
from kvcal.models.status import HistoryEntry

_MAX_PREFIX = 200  # Event names are DNS subdomains (253 characters): object name prefix + "." + 16 hex


def history_event(entry: HistoryEntry, warning: bool) -> Event:
    """`warning`: the phase table's column for the entry's phase (kvcal.core.phases), which this wing cannot import."""
    return Event("Warning" if warning else "Normal", entry.reason, entry.message)


def history_event_name(object_name: str, uid: str, entry: HistoryEntry) -> str:
    """Deterministic per (object uid, history entry): the same entry always names the same Event."""
    key = "\x00".join((uid, entry.at, entry.phase, entry.reason, entry.message))
    return f"{object_name[:_MAX_PREFIX]}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"
