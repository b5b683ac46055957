"""spec.serving.canary.capacity fromBaseline through decide(): the baseline gives up the canary's pods first and gets
them back on every way out, so baseline + canary pods never exceed what the baseline had (the cluster's GPUs)."""

from dataclasses import dataclass
from typing import Any

from kvcal.core.decide import decide
from kvcal.core.deletion import decide_deletion
from kvcal.core.manifests.traffic import TrafficPlan, plan_from_baseline
from kvcal.core.observations import Apply, ApplyOwnedFields, Decision, Delete, Observations, ScaleBaseline
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import CanaryStatus, KVCalibrationStatus
from tests.support.decide import CANARY, NOW, P, baseline, canary, observations, spec, started

FROM_BASELINE = spec(
    serving={"baseline": {"deployment": "llm", "service": "llm"}, "canary": {"capacity": "fromBaseline"}}
)


@dataclass
class Cluster:
    """The two workloads' replicas as the API holds them, changed only by the decisions' actions."""

    baseline: int
    canary: int | None = None
    promoted: bool = False

    def observe(self, **fields: Any) -> Observations:
        canary_state = canary(self.canary, self.canary) if self.canary is not None else None
        return observations(baseline=baseline(self.baseline, promoted=self.promoted), canary=canary_state, **fields)

    def act(self, decision: Decision) -> None:
        for action in decision.actions:
            match action:
                case ScaleBaseline(replicas=replicas):
                    self.baseline = replicas
                case Apply(manifest=m) if m["kind"] == "Deployment" and m["metadata"]["name"] == CANARY:
                    self.canary = m["spec"]["replicas"]
                case Delete(kind="Deployment", name=name) if name == CANARY:
                    self.canary = None
                case ApplyOwnedFields():
                    self.promoted = True


def run(
    cluster: Cluster, status: KVCalibrationStatus, passes: int, the_spec: KVCalibrationSpec = FROM_BASELINE
) -> list[tuple[str, int, int]]:
    """Passes of decide() against the cluster; (phase, baseline pods, canary pods) after each."""
    seen = []
    for _ in range(passes):
        decision = decide(the_spec, status, cluster.observe(), NOW)
        cluster.act(decision)
        status = decision.status
        seen.append((str(status.phase), cluster.baseline, cluster.canary or 0))
    return seen


def test_the_baseline_gives_up_the_canarys_pods_before_the_canary_exists() -> None:
    cluster = Cluster(baseline=4)
    seen = run(cluster, started(P.DEPLOYING), 3)
    assert seen == [("Deploying", 2, 0), ("Deploying", 2, 2), ("Analyzing", 2, 2)]
    assert all(b + c <= 4 for _, b, c in seen)


def test_a_rollback_gives_the_pods_back_with_the_canarys_deletes() -> None:
    cluster = Cluster(baseline=2, canary=2)
    status = started(P.ROLLING_BACK).model_copy(update={"canary": CanaryStatus(baseline_replicas=4)})
    decision = decide(FROM_BASELINE, status, cluster.observe(), NOW)
    names = [type(a).__name__ for a in decision.actions]
    assert names.index("ScaleBaseline") > names.index("Delete")  # the canary's pods go first, then the baseline's come
    assert ScaleBaseline("Deployment", "llm", 4) in decision.actions
    assert decision.status.canary.baseline_replicas is None  # given back once, not on every pass
    cluster.act(decision)
    assert (cluster.baseline, cluster.canary) == (4, None)
    assert run(cluster, decision.status, 1)[-1] == ("RolledBack", 4, 0)


def test_promotion_takes_the_canarys_gpus_first_then_rolls_and_restores_the_baseline() -> None:
    cluster = Cluster(baseline=2, canary=2)
    status = started(P.PROMOTING).model_copy(update={"canary": CanaryStatus(deployment=CANARY, baseline_replicas=4)})
    seen = run(cluster, status, 4)
    # 1: the canary goes, the baseline is left as it is (the old template must not take the GPUs back); 2: the
    # calibrated template on the 2 pods it kept (the canary's GPUs take its surge); 3: rolled out, the 2 pods back;
    # 4: rolled out on all 4.
    assert seen == [("Promoting", 2, 0), ("Promoting", 2, 0), ("Promoting", 4, 0), ("Succeeded", 4, 0)]
    assert cluster.promoted


def test_a_delete_mid_rollout_gives_the_pods_back() -> None:
    cluster = Cluster(baseline=2, canary=2)
    status = started(P.ANALYZING).model_copy(update={"canary": CanaryStatus(deployment=CANARY, baseline_replicas=4)})
    decision = decide_deletion(FROM_BASELINE, status, cluster.observe(), NOW)
    assert ScaleBaseline("Deployment", "llm", 4) in decision.actions


def test_an_autoscaled_or_single_pod_baseline_is_refused_before_any_canary() -> None:
    for replicas, autoscaler, why in [
        (4, "llm-hpa", "HorizontalPodAutoscaler llm-hpa owns the replicas of the baseline Deployment llm"),
        (1, None, "the baseline Deployment llm runs 1 pod and must keep one: scale it to 2 or more"),
    ]:
        cluster = Cluster(baseline=replicas)
        decision = decide(FROM_BASELINE, started(P.DEPLOYING), cluster.observe(baseline_autoscaler=autoscaler), NOW)
        assert decision.actions == ()
        ready = next(c for c in decision.status.conditions if c.type == "CanaryReady")
        assert ready.reason == "CannotTakeFromBaseline" and why in ready.message
        assert "capacity surge" in ready.message


def test_surge_never_scales_the_baseline() -> None:
    cluster = Cluster(baseline=4)
    surge = spec()
    seen = run(cluster, started(P.DEPLOYING), 2, surge)
    assert [b for _, b, _ in seen] == [4, 4]


def test_the_plan_splits_the_baselines_pods() -> None:
    # replicas router: the canary's share is its part of the total.
    assert plan_from_baseline(TrafficPlan(33, 2, 4, 10), "replicas", 4) == TrafficPlan(25, 1, 3, 10)
    assert plan_from_baseline(TrafficPlan(50, 4, 4, 100), "replicas", 4) == TrafficPlan(75, 3, 1, 100)
    # weight routers: the weight is the route's; the canary keeps its pods but the baseline keeps one.
    assert plan_from_baseline(TrafficPlan(50, 2, 4, 50), "gateway-api", 4) == TrafficPlan(50, 2, 2, 50)
    assert plan_from_baseline(TrafficPlan(90, 3, 3, 90), "gateway-api", 3) == TrafficPlan(90, 2, 1, 90)


def test_the_canary_waits_until_the_baselines_pods_are_gone_not_only_asked_to_go() -> None:
    # Scaled to 2 already, but one pod still terminating (it holds its GPU until it ends).
    status = started(P.DEPLOYING).model_copy(update={"canary": CanaryStatus(baseline_replicas=4)})
    for leaving in (baseline(2, pods=3), baseline(2, pods=2, terminating=1)):
        decision = decide(FROM_BASELINE, status, observations(baseline=leaving), NOW)
        assert decision.actions == () and "scaled to 2" in decision.status.message
    gone = decide(FROM_BASELINE, status, observations(baseline=baseline(2, pods=2, terminating=0)), NOW)
    assert [type(a).__name__ for a in gone.actions] == ["Apply", "Apply"]  # the canary and its Service
