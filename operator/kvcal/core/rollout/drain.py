"""Taking the canary out of traffic before deleting it (rollback, promotion, delete), level-triggered over passes.

gateway-api, inference-pool: ask the HTTPRoute for 0% on the canary (its Service or its InferencePool), wait until
the route READ BACK says 0%, remember when that was first seen (status.canary.drainingSince), and only after
spec.serving.traffic.drainDelay delete the canary (in-flight requests finish; Argo Rollouts waits 30 s the same way).
Every pass re-asks for 0%, so an edit in between is undone.
replicas: there is no weight to set or read — the canary's share IS its pods in the baseline Service, so deleting
the pods is the weight change, and each pod's terminationGracePeriod is its drain. none: no user traffic to drain.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from kvcal.core.timestamps import parse_rfc3339, rfc3339
from kvcal.models.spec import TrafficSpec

ROUTE_POLL_SECONDS = 1.0  # re-read the route this often until it reports 0%


@dataclass(frozen=True)
class Drain:
    done: bool  # the canary may be deleted now
    draining_since: str | None
    wait_seconds: float = 0.0
    message: str = ""


def drain_step(
    traffic: TrafficSpec, routed_weight: int | None, draining_since: str | None, canary_exists: bool, now: datetime
) -> Drain:
    """Where the canary's removal stands, given the weight the router reports now."""
    if not traffic.routes:
        return Drain(done=True, draining_since=None)
    if routed_weight != 0:
        seen = "unreadable" if routed_weight is None else f"{routed_weight}%"
        message = f"waiting for HTTPRoute {traffic.http_route} to send 0% to the canary (it reports {seen})"
        return Drain(done=False, draining_since=None, wait_seconds=ROUTE_POLL_SECONDS, message=message)
    if draining_since is None and not canary_exists:
        return Drain(done=True, draining_since=None)  # no canary pods and no route to them: nothing in flight
    since = draining_since or rfc3339(_next_whole_second(now))  # status keeps whole seconds: never drain less
    left = (parse_rfc3339(since) + timedelta(seconds=traffic.drain_delay_seconds) - now).total_seconds()
    if left > 0:
        message = f"HTTPRoute {traffic.http_route} sends 0% to the canary: draining {left:.0f}s before deleting it"
        return Drain(done=False, draining_since=since, wait_seconds=left, message=message)
    return Drain(done=True, draining_since=since)


def _next_whole_second(moment: datetime) -> datetime:
    return moment if moment.microsecond == 0 else moment.replace(microsecond=0) + timedelta(seconds=1)
