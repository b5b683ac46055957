"""Leader election: read the Lease -> core.leadership decides -> create / renew / take over / wait.

Only the holder runs the operator. It renews every `retry_seconds`; when it has not renewed for `renew_deadline_seconds`
(API server unreachable, or another replica took the lease) it must stop acting, and the process exits so it restarts
as a standby. A standby takes over a lease that has not changed for its whole leaseDuration, i.e. within
duration + retry seconds of the holder's death; a graceful stop releases the lease, and a standby takes it at once.
"""

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from kvcal.core.leadership import LeaseAction, LeaseView, decide_lease
from kvcal.core.timestamps import micro_time
from kvcal.ports import Conflict, Leases, Manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ElectionTiming:
    # client-go's defaults: takeover within ~17 s of a holder's death, 1 write per 2 s by the holder.
    lease_seconds: int = 15
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0


class LeaderElector:
    def __init__(
        self,
        leases: Leases,
        namespace: str,
        name: str,
        identity: str,
        clock: Callable[[], datetime],
        timing: ElectionTiming = ElectionTiming(),
    ) -> None:
        self.leases, self.namespace, self.name, self.identity = leases, namespace, name, identity
        self.clock, self.timing = clock, timing
        self._seen: tuple[str, datetime] | None = None  # (resourceVersion, when this process first read it)

    def try_acquire_or_renew(self) -> bool:
        """One round; True when this process holds the lease afterwards."""
        now = self.clock()
        lease = self.leases.read_lease(self.namespace, self.name)
        action = decide_lease(self._view(lease, now), self.identity, now)
        try:
            match action:
                case LeaseAction.CREATE:
                    return self.leases.create_lease(self._lease(None, now, acquired=True))
                case LeaseAction.RENEW:
                    self.leases.replace_lease(self._lease(lease, now, acquired=False))
                    return True
                case LeaseAction.TAKE_OVER:
                    previous = (lease or {}).get("spec", {}).get("holderIdentity") or "nobody (released)"
                    self.leases.replace_lease(self._lease(lease, now, acquired=True))
                    log.info("took over lease %s/%s from %s", self.namespace, self.name, previous)
                    return True
                case LeaseAction.WAIT:
                    return False
        except Conflict:  # another replica wrote it first
            return False
        raise AssertionError(action)

    def wait_for_leadership(self, stop: threading.Event) -> bool:
        """Block until this process holds the lease (True) or `stop` is set (False)."""
        log.info("standing by for lease %s/%s as %s", self.namespace, self.name, self.identity)
        while not stop.is_set():
            if self._attempt():
                log.info("leading as %s (lease %s/%s)", self.identity, self.namespace, self.name)
                return True
            stop.wait(self.timing.retry_seconds)
        return False

    def hold(self, stop: threading.Event, on_lost: Callable[[], None]) -> None:
        """Renew until `stop` is set; call on_lost() and return once a renewal has failed for the renew deadline."""
        last_renewed = self.clock()
        while not stop.wait(self.timing.retry_seconds):
            if self._attempt():
                last_renewed = self.clock()
            elif (self.clock() - last_renewed).total_seconds() >= self.timing.renew_deadline_seconds:
                log.error(
                    "lost lease %s/%s: not renewed for %.0fs",
                    self.namespace,
                    self.name,
                    self.timing.renew_deadline_seconds,
                )
                on_lost()
                return

    def release(self) -> None:
        """Graceful stop: hand the lease back so a standby takes over at once, not after leaseDuration."""
        try:
            lease = self.leases.read_lease(self.namespace, self.name)
            if lease is None or lease.get("spec", {}).get("holderIdentity") != self.identity:
                return
            spec = {k: v for k, v in lease["spec"].items() if k not in ("holderIdentity", "acquireTime")}
            self.leases.replace_lease({**lease, "spec": {**spec, "renewTime": micro_time(self.clock())}})
            log.info("released lease %s/%s", self.namespace, self.name)
        except Exception:  # best effort: the standby takes over after leaseDuration anyway
            log.exception("could not release lease %s/%s", self.namespace, self.name)

    def _attempt(self) -> bool:
        try:
            return self.try_acquire_or_renew()
        except Exception as e:  # the API may be unreachable: a failed round, the deadlines decide what it means
            log.warning("lease %s/%s: %s: %s", self.namespace, self.name, type(e).__name__, e)
            return False

    def _view(self, lease: Manifest | None, now: datetime) -> LeaseView | None:
        if lease is None:
            return None
        version = lease["metadata"]["resourceVersion"]
        if self._seen is None or self._seen[0] != version:
            self._seen = (version, now)
        spec = lease.get("spec") or {}
        return LeaseView(
            holder=spec.get("holderIdentity") or "",
            duration_seconds=float(spec.get("leaseDurationSeconds") or self.timing.lease_seconds),
            resource_version=version,
            unchanged_since=self._seen[1],
        )

    def _lease(self, current: Manifest | None, now: datetime, *, acquired: bool) -> Manifest:
        spec = dict((current or {}).get("spec") or {})
        metadata: Manifest = {"name": self.name, "namespace": self.namespace}
        if current is not None:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=self.timing.lease_seconds,
            renewTime=micro_time(now),
        )
        if acquired:
            spec["acquireTime"] = micro_time(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (current is not None)
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}
