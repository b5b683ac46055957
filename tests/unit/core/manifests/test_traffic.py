"""Unit tests of traffic plans: asked vs achieved weights per router."""

import pytest

from kvcal.core.manifests.traffic import plan_shadow, plan_step
from kvcal.models.spec import ServingSpec, ShadowSpec, TrafficSpec


@pytest.mark.parametrize(
    ("steps", "index", "baseline", "weight", "canary"),
    [
        ([10, 50], 0, 9, 10, 1),  # 1 / (9 + 1) is exactly 10%
        ([10, 50], 1, 9, 50, 9),
        ([10, 50], 0, 1, 50, 1),  # one baseline pod: the replica ratio cannot go below 50%
        ([25], 0, 4, 20, 1),  # 1/5 = 20% is nearer 25% than 2/6 = 33%
        ([100], 0, 3, 50, 3),  # never more canary pods than baseline pods
    ],
)
def test_replicas_router_reports_the_achieved_weight(
    steps: list[int], index: int, baseline: int, weight: int, canary: int
) -> None:
    plan = plan_step(TrafficSpec(router="replicas", steps=steps), index, baseline)
    assert (plan.weight, plan.canary_replicas, plan.baseline_replicas) == (weight, canary, baseline)
    assert plan.requested_weight == steps[index]


def test_gateway_router_gives_the_asked_weight_and_enough_pods() -> None:
    traffic = TrafficSpec(router="gateway-api", steps=[10, 50], http_route="llama")
    first, second = plan_step(traffic, 0, 4), plan_step(traffic, 1, 4)
    assert (first.weight, first.canary_replicas, first.baseline_replicas) == (10, 1, 4)
    assert (second.weight, second.canary_replicas) == (50, 2)


def test_none_router_sends_no_user_traffic() -> None:
    plan = plan_step(TrafficSpec(router="none", steps=[10]), 0, 3)
    assert (plan.weight, plan.canary_replicas, plan.baseline_replicas) == (0, 1, 3)


@pytest.mark.parametrize(
    ("index", "baseline", "error"), [(2, 1, "has 2 steps"), (-1, 1, "has 2 steps"), (0, 0, "at least 1 pod")]
)
def test_bad_input_names_the_problem(index: int, baseline: int, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        plan_step(TrafficSpec(steps=[10, 50]), index, baseline)


def test_canary_replicas_is_the_fewest_canary_pods_of_weight_routers() -> None:
    """spec.serving.canary.replicas: more canary pods average out one pod's own noise in the latency verdict; the
    step's share still asks for more where it needs them."""
    traffic = TrafficSpec(router="gateway-api", steps=[10, 50], http_route="llama")
    first, second = plan_step(traffic, 0, 4, min_canary=3), plan_step(traffic, 1, 8, min_canary=3)
    assert (first.weight, first.canary_replicas) == (10, 3)
    assert (second.weight, second.canary_replicas) == (50, 4)
    assert plan_step(TrafficSpec(router="none", steps=[10]), 0, 3, min_canary=2).canary_replicas == 2
    shadow = plan_shadow(ShadowSpec(percent=10), 4, min_canary=2)
    assert shadow.canary_replicas == 2


def test_canary_replicas_is_refused_where_the_weight_sets_the_pod_count() -> None:
    baseline = {"deployment": "llm", "service": "llm"}
    with pytest.raises(ValueError, match=r"spec.serving.canary.replicas: router replicas sets"):
        ServingSpec.model_validate({"baseline": baseline, "canary": {"replicas": 2}})
    assert ServingSpec.model_validate({"baseline": baseline, "canary": {"replicas": 1}}).canary.replicas == 1
