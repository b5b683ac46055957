"""The shadow stage (spec.serving.traffic.shadow): mirrored before weighted, asked of the gateway before written, and
taken out with the weight. decide() is driven pass by pass; the route edits are the router's pure functions."""

from typing import Any

import pytest
from pydantic import ValidationError

from kvcal.adapters.router import mirror_share, supported_features, weighted_rules
from kvcal.core.decide import decide
from kvcal.core.deletion import decide_deletion
from kvcal.core.manifests import canary_name
from kvcal.core.manifests.traffic import MIRROR_FEATURE, PERCENTAGE_MIRROR_FEATURE, mirror_refusal, plan_shadow
from kvcal.core.observations import Apply, Decision, Delete, DeploymentState, SetWeight
from kvcal.core.spechash import spec_hash
from kvcal.models.spec import ShadowSpec
from kvcal.models.status import AnalysisStatus, CalibrationStatus, CanaryStatus, KVCalibrationStatus, Measurement, Phase
from tests.support.decide import NOW, OWNER, baseline, baseline_service, observations, spec

P = Phase
CANARY = canary_name(OWNER.name)
BOTH = frozenset({MIRROR_FEATURE, PERCENTAGE_MIRROR_FEATURE})


def shadow_spec(percent: int = 25, intervals: int = 2) -> Any:
    return spec(
        serving={
            "baseline": {"deployment": "llm", "service": "llm"},
            "traffic": {
                "router": "gateway-api",
                "httpRoute": "llm",
                "steps": [10, 50],
                "shadow": {"percent": percent, "intervals": intervals},
            },
        }
    )


SHADOW = shadow_spec()


def status(phase: Phase, canary: CanaryStatus | None = None, successes: int = 0) -> KVCalibrationStatus:
    return KVCalibrationStatus(
        phase=phase,
        calibration=CalibrationStatus(job="j", spec_hash=spec_hash(SHADOW)),
        canary=canary or CanaryStatus(deployment=CANARY),
        analysis=AnalysisStatus(started_at="2026-01-02T03:00:00Z", consecutive_successes=successes),
    )


def weights(decision: Decision) -> list[tuple[int, int]]:
    return [(a.weight, a.mirror) for a in decision.actions if isinstance(a, SetWeight)]


def canary(replicas: int, ready: int | None = None) -> DeploymentState:
    return DeploymentState(manifest={}, replicas=replicas, ready_replicas=replicas if ready is None else ready)


def passing() -> tuple[Measurement, ...]:
    return (Measurement(metric="ttft-p95", phase="Successful", at="2026-01-02T03:04:05Z", baseline=0.1, canary=0.1),)


def test_shadow_needs_the_gateway_api_router() -> None:
    with pytest.raises(ValidationError, match="needs router: gateway-api"):
        spec(serving={"baseline": {"deployment": "llm", "service": "llm"}, "traffic": {"shadow": {"percent": 10}}})


def test_the_shadow_canary_is_sized_for_the_mirrored_share() -> None:
    assert plan_shadow(ShadowSpec(percent=25), 8).canary_replicas == 2
    assert plan_shadow(ShadowSpec(percent=1), 8).canary_replicas == 1
    assert plan_shadow(ShadowSpec(percent=100), 3).weight == 0


@pytest.mark.parametrize(
    ("percent", "features", "refused"),
    [
        (25, BOTH, None),
        (100, frozenset({MIRROR_FEATURE}), None),
        (25, frozenset({MIRROR_FEATURE}), "does not list HTTPRouteRequestPercentageMirror"),
        (100, frozenset({"HTTPRouteQueryParamMatching"}), "does not list HTTPRouteRequestMirror"),
        (100, None, "cannot tell whether"),
    ],
)
def test_the_gateway_must_say_it_mirrors(percent: int, features: frozenset[str] | None, refused: str | None) -> None:
    why = mirror_refusal(ShadowSpec(percent=percent), "llm", features)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why and "remove spec.serving.traffic.shadow" in why


def test_a_gateway_that_cannot_mirror_blocks_before_any_canary_exists() -> None:
    obs = observations(baseline=baseline(4), baseline_service=baseline_service(), gateway_features=frozenset())
    decision = decide(SHADOW, status(P.DEPLOYING), obs, NOW)
    assert decision.status.phase == P.DEPLOYING
    assert not [a for a in decision.actions if isinstance(a, (Apply, SetWeight))]
    assert "does not list HTTPRouteRequestMirror" in (decision.status.message or "")
    assert [e.reason for e in decision.events] == ["MirrorUnsupported"]
    ready = next(c for c in decision.status.conditions if c.type == "CanaryReady")
    assert ready.reason == "MirrorUnsupported"


def test_shadow_then_weights_pass_by_pass() -> None:
    base = {"baseline": baseline(8), "baseline_service": baseline_service(), "gateway_features": BOTH}
    # 1. Deploying: the canary sized for 25% of 8 pods, no weight, no mirror yet (pods not ready).
    creating = decide(SHADOW, status(P.DEPLOYING), observations(**base), NOW)
    applied = [a.manifest for a in creating.actions if isinstance(a, Apply) and a.manifest["kind"] == "Deployment"]
    assert applied[0]["spec"]["replicas"] == 2 and weights(creating) == []
    assert "shadow: 0/2 canary pods ready" in (creating.status.message or "")
    # 2. Ready: weight 0, 25% mirrored, Analyzing.
    ready = decide(SHADOW, creating.status, observations(**base, canary=canary(2)), NOW)
    assert weights(ready) == [(0, 25)] and ready.status.phase == P.ANALYZING
    assert ready.status.canary.mirror == 25 and ready.status.canary.weight == 0
    assert "users see only the baseline's answers" in (ready.status.message or "")
    # 3. Analyzing on mirrored load: the mirror re-asserted; shadow.intervals (2) passes the stage, not the
    #    analysis' successfulIntervals.
    running = decide(SHADOW, ready.status, observations(**base, canary=canary(2), measurements=passing()), NOW)
    assert weights(running) == [(0, 25)] and running.status.phase == P.ANALYZING
    passed = decide(
        SHADOW,
        running.status.model_copy(
            update={"analysis": running.status.analysis.model_copy(update={"last_measured_at": None})}
        ),
        observations(**base, canary=canary(2), measurements=passing(), routed_weight=0, routed_mirror=25),
        NOW,
    )
    assert passed.status.phase == P.DEPLOYING and passed.status.canary.shadowed
    assert passed.status.history[-1].reason == "ShadowPassed"
    # 4. Deploying step 1 (10% of 8 pods: 1 canary pod, the shadow stage had 2): resized over passes, still past
    #    the shadow stage; then the mirror goes and the weight comes, in one route write.
    resizing = decide(SHADOW, passed.status, observations(**base, canary=canary(2)), NOW)
    assert resizing.status.phase == P.DEPLOYING and resizing.status.canary.shadowed and weights(resizing) == []
    step = decide(SHADOW, resizing.status, observations(**base, canary=canary(1)), NOW)
    assert weights(step) == [(10, 0)] and step.status.phase == P.ANALYZING
    assert step.status.canary.mirror == 0 and step.status.canary.weight == 10


def test_mirror_drift_is_put_back_and_reported() -> None:
    shadowing = status(P.ANALYZING, CanaryStatus(deployment=CANARY, mirror=25, ready_replicas=2))
    obs = observations(baseline=baseline(8), canary=canary(2), routed_weight=0, routed_mirror=0)
    decision = decide(SHADOW, shadowing, obs, NOW)
    assert weights(decision) == [(0, 25)]
    assert [e.reason for e in decision.events] == ["WeightDrift"]
    assert "mirrored 0% of requests to the canary, not 25%" in (decision.status.message or "")


def test_a_rollback_takes_the_mirror_out_before_the_canary_goes() -> None:
    shadowing = status(P.ROLLING_BACK, CanaryStatus(deployment=CANARY, mirror=25, ready_replicas=2))
    still = decide(SHADOW, shadowing, observations(canary=canary(2), routed_weight=0, routed_mirror=25), NOW)
    assert weights(still) == [(0, 0)] and not [a for a in still.actions if isinstance(a, Delete)]
    assert "reports 25%" in (still.status.message or "")
    gone = decide(SHADOW, still.status, observations(canary=canary(2), routed_weight=0, routed_mirror=0), NOW)
    assert gone.status.canary.mirror == 0 and gone.status.canary.draining_since is not None


def test_a_delete_mid_shadow_waits_for_the_mirror_to_go() -> None:
    shadowing = status(P.ANALYZING, CanaryStatus(deployment=CANARY, mirror=25, ready_replicas=2))
    decision = decide_deletion(
        SHADOW, shadowing, observations(canary=canary(2), routed_weight=0, routed_mirror=25), NOW
    )
    assert weights(decision) == [(0, 0)] and not [a for a in decision.actions if isinstance(a, Delete)]
    assert decision.requeue_after is not None


ROUTE_RULES: list[dict[str, Any]] = [
    {
        "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
        "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "x", "value": "1"}]}}],
        "backendRefs": [{"name": "llm", "port": 8000}],
    },
    {"backendRefs": [{"name": "other", "port": 80}]},
]


def test_the_route_gets_a_mirror_beside_the_users_filters_and_loses_it_again() -> None:
    mirrored = weighted_rules(ROUTE_RULES, "llm", CANARY, 0, mirror=25)
    assert mirrored[0]["backendRefs"] == [{"name": "llm", "port": 8000}]  # no user-facing weight
    assert mirrored[0]["filters"] == [
        ROUTE_RULES[0]["filters"][0],
        {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": CANARY, "port": 8000}, "percent": 25}},
    ]
    assert "filters" not in mirrored[1] and mirror_share(mirrored, CANARY) == 25
    full = weighted_rules(ROUTE_RULES, "llm", CANARY, 0, mirror=100)
    assert "percent" not in full[0]["filters"][1]["requestMirror"] and mirror_share(full, CANARY) == 100
    assert weighted_rules(mirrored, "llm", CANARY, 0) == ROUTE_RULES  # the route as it was
    stepped = weighted_rules(mirrored, "llm", CANARY, 10)
    assert mirror_share(stepped, CANARY) == 0 and stepped[0]["filters"] == ROUTE_RULES[0]["filters"]


def test_mirror_share_reads_a_fraction_and_ignores_other_mirrors() -> None:
    rules = [
        {
            "filters": [
                {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "audit"}}},
                {
                    "type": "RequestMirror",
                    "requestMirror": {"backendRef": {"name": CANARY}, "fraction": {"numerator": 1, "denominator": 8}},
                },
            ],
            "backendRefs": [{"name": "llm"}],
        }
    ]
    assert mirror_share(rules, CANARY) == 12
    assert mirror_share(rules[:0], CANARY) == 0


def test_supported_features_read_both_status_shapes() -> None:
    assert supported_features({"status": {"supportedFeatures": [{"name": MIRROR_FEATURE}]}}) == {MIRROR_FEATURE}
    assert supported_features({"status": {"supportedFeatures": [MIRROR_FEATURE]}}) == {MIRROR_FEATURE}
    assert supported_features({}) == frozenset()
