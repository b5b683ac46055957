"""Taking the canary out of traffic, pass by pass: 0% asked, 0% read back from the router, drainDelay, delete — on
rollback, promotion and delete; the weight re-asserted (and drift reported) while Analyzing."""

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from kvcal.adapters.router import canary_share
from kvcal.core.decide import decide
from kvcal.core.deletion import decide_deletion
from kvcal.core.manifests import canary_name
from kvcal.core.observations import DeploymentState
from kvcal.core.spechash import spec_hash
from kvcal.models.status import AnalysisStatus, CalibrationStatus, CanaryStatus, KVCalibrationStatus, Phase
from kvcal.ports import MetricsSource, Probes, Router, Routing, Target
from kvcal.services.reconciler import Reconciler
from tests.support.decide import NOW, OWNER, actions, baseline, observations, spec
from tests.support.fakekube import FakeKube, kvcal

P = Phase
CANARY = canary_name(OWNER.name)
GATEWAY = spec(
    serving={
        "baseline": {"deployment": "llm", "service": "llm"},
        "traffic": {"router": "gateway-api", "httpRoute": "llm", "steps": [50], "drainDelay": "30s"},
    }
)
DELETES = [f"Delete Deployment/{CANARY}", f"Delete Service/{CANARY}"]


def canary() -> DeploymentState:
    return DeploymentState(manifest={}, replicas=1, ready_replicas=1)


def start(phase: Phase, weight: int = 50) -> KVCalibrationStatus:
    return KVCalibrationStatus(
        phase=phase,
        calibration=CalibrationStatus(job="j", spec_hash=spec_hash(GATEWAY)),
        canary=CanaryStatus(deployment=CANARY, weight=weight, ready_replicas=1),
        analysis=AnalysisStatus(started_at="2026-01-02T03:00:00Z"),
    )


def test_rollback_routes_to_the_baseline_reads_it_back_drains_then_deletes() -> None:
    status = start(P.ROLLING_BACK)
    asked = decide(GATEWAY, status, observations(canary=canary(), routed_weight=50), NOW)
    assert actions(asked) == ["SetWeight 0"] and asked.status.phase == P.ROLLING_BACK
    assert asked.status.canary.draining_since is None and "reports 50%" in (asked.status.message or "")

    seen = decide(GATEWAY, asked.status, observations(canary=canary(), routed_weight=0), NOW)
    assert actions(seen) == ["SetWeight 0"] and seen.requeue_after == 30.0
    assert seen.status.canary.draining_since == "2026-01-02T03:04:05Z" and seen.status.canary.weight == 0

    later = NOW + timedelta(seconds=20)
    draining = decide(GATEWAY, seen.status, observations(canary=canary(), routed_weight=0), later)
    assert actions(draining) == ["SetWeight 0"] and draining.requeue_after == 10.0

    done = NOW + timedelta(seconds=30)
    deleting = decide(GATEWAY, draining.status, observations(canary=canary(), routed_weight=0), done)
    assert actions(deleting) == ["SetWeight 0", *DELETES] and deleting.status.phase == P.ROLLING_BACK

    gone = decide(GATEWAY, deleting.status, observations(routed_weight=0), done)
    assert gone.status.phase == P.ROLLED_BACK and actions(gone) == ["SetWeight 0", *DELETES]


def test_the_drain_is_never_shorter_than_drain_delay() -> None:
    status = start(P.ROLLING_BACK, weight=0)
    later = NOW + timedelta(milliseconds=900)  # status times are whole seconds: rounded up, not down
    d = decide(GATEWAY, status, observations(canary=canary(), routed_weight=0), later)
    assert d.status.canary.draining_since == "2026-01-02T03:04:06Z" and d.requeue_after == pytest.approx(30.1)


def test_a_route_put_back_on_the_canary_restarts_the_drain() -> None:
    old = start(P.ROLLING_BACK, weight=0)
    draining = old.model_copy(
        update={"canary": old.canary.model_copy(update={"draining_since": "2026-01-02T03:00:00Z"})}
    )
    d = decide(GATEWAY, draining, observations(canary=canary(), routed_weight=10), NOW)
    assert actions(d) == ["SetWeight 0"] and d.status.canary.draining_since is None


def test_rollback_without_a_canary_does_not_wait_for_the_drain() -> None:
    d = decide(GATEWAY, start(P.ROLLING_BACK, weight=0), observations(routed_weight=0), NOW)
    assert d.status.phase == P.ROLLED_BACK


def test_replicas_router_has_no_weight_to_read_the_pods_are_the_weight() -> None:
    d = decide(spec(), start(P.ROLLING_BACK), observations(canary=canary()), NOW)
    assert actions(d) == ["SetWeight 0", *DELETES] and d.status.canary.weight == 0


def test_promotion_drains_the_canary_before_succeeding() -> None:
    rolled_out = baseline(promoted=True)
    assert rolled_out.manifest["metadata"]["annotations"]  # the promotion of spec() == of GATEWAY: same hash
    first = decide(
        GATEWAY, start(P.PROMOTING), observations(canary=canary(), baseline=rolled_out, routed_weight=50), NOW
    )
    assert actions(first) == ["SetWeight 0"] and first.status.phase == P.PROMOTING
    promoted = next(c for c in first.status.conditions if c.type == "Promoted")
    assert (promoted.status, promoted.reason) == ("False", "DrainingCanary")
    obs = observations(canary=canary(), baseline=rolled_out, routed_weight=0)
    second = decide(GATEWAY, first.status, obs, NOW)
    assert actions(second) == ["SetWeight 0"] and second.status.phase == P.PROMOTING
    third = decide(GATEWAY, second.status, obs, NOW + timedelta(seconds=30))
    assert actions(third) == ["SetWeight 0", *DELETES] and third.status.phase == P.SUCCEEDED


def test_analyzing_reasserts_the_weight_and_reports_drift() -> None:
    steady = decide(GATEWAY, start(P.ANALYZING), observations(canary=canary(), routed_weight=50), NOW)
    assert actions(steady) == ["SetWeight 50"] and steady.events == ()
    drifted = decide(GATEWAY, start(P.ANALYZING), observations(canary=canary(), routed_weight=30), NOW)
    assert actions(drifted) == ["SetWeight 50"]
    (event,) = drifted.events
    assert (event.type, event.reason) == ("Warning", "WeightDrift") and "sent 30%" in event.message
    assert "not 50%: set it back" in (drifted.status.message or "")


def test_deletion_mid_analysis_drains_before_deleting() -> None:
    status = start(P.ANALYZING)
    asked = decide_deletion(GATEWAY, status, observations(canary=canary(), routed_weight=50), NOW)
    assert actions(asked) == ["SetWeight 0"] and asked.requeue_after == 1.0
    seen = decide_deletion(GATEWAY, asked.status, observations(canary=canary(), routed_weight=0), NOW)
    assert actions(seen) == ["SetWeight 0"] and seen.requeue_after == 30.0
    done = decide_deletion(
        GATEWAY, seen.status, observations(canary=canary(), routed_weight=0), NOW + timedelta(seconds=30)
    )
    assert actions(done) == ["SetWeight 0", *DELETES] and done.requeue_after is None


def test_deletion_of_an_unreadable_spec_removes_at_once() -> None:
    d = decide_deletion(None, start(P.INVALID_SPEC), observations(), NOW)
    assert d.actions == () and d.requeue_after is None


def route(*refs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"backendRefs": list(refs)}]


def test_canary_share_read_from_the_route() -> None:
    assert canary_share(route({"name": "llm"}), "llm", "c") == 0
    assert canary_share(route({"name": "llm", "weight": 70}, {"name": "c", "weight": 30}), "llm", "c") == 30
    assert canary_share(route({"name": "llm", "weight": 0}, {"name": "c", "weight": 5}), "llm", "c") == 100
    other = [{"backendRefs": [{"name": "other"}, {"name": "c"}]}]
    assert canary_share(other + route({"name": "llm", "weight": 9}, {"name": "c", "weight": 1}), "llm", "c") == 10


class FakeRoute:
    """A router whose weight lands when set and can be read back."""

    def __init__(self, weight: int, mirror: int = 0) -> None:
        self.weight, self.mirror = weight, mirror

    def set_weight(self, target: Target, weight: int, mirror: int = 0, seen: Routing | None = None) -> None:
        self.weight, self.mirror = weight, mirror

    def get_weight(self, target: Target) -> int | None:
        return self.weight

    def get_mirror(self, target: Target) -> int | None:
        return self.mirror

    def gateway_features(self, target: Target) -> frozenset[str] | None:
        return None


@dataclass
class RouteOnly:
    route: FakeRoute

    def metrics_source(self, target: Target) -> MetricsSource | None:
        return None

    def probes(self, target: Target) -> Probes | None:
        return None

    def router(self, target: Target) -> Router | None:
        return self.route


def test_reconciler_cleanup_keeps_the_drain_in_status_until_it_may_delete() -> None:
    obj = kvcal()
    obj["spec"] = GATEWAY.to_wire()
    obj["status"] = start(P.ANALYZING).to_wire()
    canary_deployment = {"kind": "Deployment", "metadata": {"name": CANARY}, "spec": {"replicas": 1}}
    kube = FakeKube([obj, canary_deployment, {"kind": "Service", "metadata": {"name": CANARY}}])
    route, clock = FakeRoute(50), [NOW]
    reconciler = Reconciler(kube, clock=lambda: clock[0], backends=RouteOnly(route))
    first = reconciler.cleanup("llm", "smollm2")
    assert route.weight == 0 and first.retry_after == 1.0 and first.removed == []
    second = reconciler.cleanup("llm", "smollm2")  # a restarted operator reads the drain start from status
    assert second.retry_after == 30.0 and ("Service", CANARY) in kube.objects
    assert kube.objects[("KVCalibration", "smollm2")]["status"]["canary"]["drainingSince"] == "2026-01-02T03:04:05Z"
    clock[0] = NOW + timedelta(seconds=30)
    done = Reconciler(kube, clock=lambda: clock[0], backends=RouteOnly(route)).cleanup("llm", "smollm2")
    assert done.retry_after is None and ("Service", CANARY) not in kube.objects


def test_a_spec_change_drains_the_canary_before_starting_over() -> None:
    changed = GATEWAY.model_copy(
        update={"calibration": GATEWAY.calibration.model_copy(update={"samples": GATEWAY.calibration.samples + 1})}
    )
    status = start(P.ANALYZING, weight=50)
    asked = decide(changed, status, observations(canary=canary(), routed_weight=50), NOW)
    assert actions(asked) == ["SetWeight 0"] and asked.status.phase == P.ANALYZING
    assert "calibration inputs changed" in (asked.status.message or "")
    read_back = decide(changed, asked.status, observations(canary=canary(), routed_weight=0), NOW)
    assert actions(read_back) == ["SetWeight 0"] and read_back.status.canary.draining_since is not None
    drained = decide(
        changed, read_back.status, observations(canary=canary(), routed_weight=0), NOW + timedelta(seconds=31)
    )
    assert actions(drained)[:3] == ["SetWeight 0", *DELETES] and drained.status.phase == P.PENDING
