"""Leader election on a coordination.k8s.io Lease: who may act, decided from the lease as read (pure, no clock).

Like client-go's leaderelection, a standby never compares the holder's renewTime with its own clock (clocks of two
nodes differ): a lease has expired when the standby has seen the same resourceVersion for a whole leaseDuration by
its own clock. A holder that stops gracefully releases the lease (empty holderIdentity), which a standby takes at once.
"""

from dataclasses import dataclass
from datetime import datetime
from enum import Enum


class LeaseAction(Enum):
    CREATE = "create"  # no lease yet: create it, held by us
    RENEW = "renew"  # ours: write a fresh renewTime
    TAKE_OVER = "take-over"  # released, or not renewed for a whole leaseDuration: replace the holder by us
    WAIT = "wait"  # another replica holds it


@dataclass(frozen=True)
class LeaseView:
    """The lease as read, and since when (by the reader's clock) it has not changed."""

    holder: str  # "" once released
    duration_seconds: float
    resource_version: str
    unchanged_since: datetime


def decide_lease(lease: LeaseView | None, identity: str, now: datetime) -> LeaseAction:
    if lease is None:
        return LeaseAction.CREATE
    if lease.holder == identity:
        return LeaseAction.RENEW
    if not lease.holder or (now - lease.unchanged_since).total_seconds() >= lease.duration_seconds:
        return LeaseAction.TAKE_OVER
    return LeaseAction.WAIT
