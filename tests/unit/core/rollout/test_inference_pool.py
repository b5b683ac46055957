"""Router inference-pool in the pure core: the canary's InferencePool and endpoint picker come up only once its pods
are Ready, weight moves step by step only to a pool with ready endpoints and a ready picker, and rollback, abort and
delete route 100% to the baseline pool, read it back, then delete the pool, the picker and the canary in that order;
the operator refuses the router unless the chart allows it (rbac.inferencePool)."""

import copy
from datetime import timedelta
from typing import Any

import pytest

from kvcal.adapters.router import INFERENCE_POOL, SERVICE, canary_share, weighted_rules
from kvcal.core.decide import decide
from kvcal.core.deletion import decide_deletion
from kvcal.core.guard.policy import Policy
from kvcal.core.manifests import build_canary_workload, canary_name
from kvcal.core.manifests.pool import (
    build_canary_picker,
    build_canary_pool,
    canary_picker_name,
    picker_deployment,
    picker_service_name,
)
from kvcal.core.manifests.traffic import plan_step
from kvcal.core.observations import Delete, DeploymentState, PoolState, SetWeight
from kvcal.core.problems import NeedsFix
from kvcal.core.spechash import spec_hash
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import AnalysisStatus, CalibrationStatus, CanaryStatus, KVCalibrationStatus, Phase
from tests.support.decide import (
    NOW,
    OWNER,
    POLICY,
    actions,
    baseline,
    baseline_manifest,
    baseline_service,
    observations,
    spec,
)
from tests.support.pool import POOL_SPEC, baseline_pool, picker, picker_service

P = Phase
CANARY = canary_name(OWNER.name)
PICKER = canary_picker_name(OWNER.name)
ALLOWED = POLICY.model_copy(update={"inference_pool": True})
# Taken out: route back to the baseline pool first, then the pool, its picker and the canary go.
DELETES = [
    f"Delete InferencePool/{CANARY}",
    f"Delete Deployment/{PICKER}",
    f"Delete Service/{PICKER}",
    f"Delete Deployment/{CANARY}",
    f"Delete Service/{CANARY}",
]


def canary_state(ready: int = 1, manifest: dict[str, Any] | None = None) -> DeploymentState:
    keys = frozenset({"tier"})
    built = manifest or build_canary_workload(OWNER, POOL_SPEC, baseline_manifest(), 1, baseline_service(), keys)
    return DeploymentState(manifest=built, replicas=1, ready_replicas=ready)


def pools(*, canary_pool: bool = True, picker_ready: int = 1, endpoints: int = 1) -> PoolState:
    return PoolState(
        baseline_pool=baseline_pool(),
        picker_service=picker_service(),
        deployments=(baseline_manifest(), picker()),
        canary_pool=build_canary_pool(OWNER, baseline_pool()) if canary_pool else None,
        canary_picker=DeploymentState(manifest={}, replicas=1, ready_replicas=picker_ready) if canary_pool else None,
        ready_endpoints=endpoints,
    )


def obs(**fields: Any) -> Any:
    fields.setdefault("policy", ALLOWED)
    fields.setdefault("inference_pool", pools())
    return observations(**fields)


def start(
    phase: Phase, weight: int = 30, step: int = 0, the_spec: KVCalibrationSpec = POOL_SPEC
) -> KVCalibrationStatus:
    return KVCalibrationStatus(
        phase=phase,
        calibration=CalibrationStatus(job="j", spec_hash=spec_hash(the_spec)),
        canary=CanaryStatus(deployment=CANARY, weight=weight, ready_replicas=1, step_index=step),
        analysis=AnalysisStatus(started_at="2026-01-02T03:00:00Z"),
    )


# --- weights per step ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("step", "weight", "canary_pods"), [(0, 30, 2), (1, 60, 3)])
def test_each_step_asks_its_weight_exactly_like_gateway_api(step: int, weight: int, canary_pods: int) -> None:
    plan = plan_step(POOL_SPEC.serving.traffic, step, 4)
    assert (plan.weight, plan.canary_replicas, plan.baseline_replicas) == (weight, canary_pods, 4)


def test_deploying_moves_the_step_weight_once_the_pool_serves() -> None:
    for step, weight in ((0, 30), (1, 60)):
        ready = canary_state(ready=1 if step == 0 else 2)
        ready = DeploymentState(
            manifest=ready.manifest, replicas=ready.ready_replicas, ready_replicas=ready.ready_replicas
        )
        d = decide(POOL_SPEC, start(P.DEPLOYING, weight=0, step=step), obs(canary=ready, baseline=baseline(2)), NOW)
        assert actions(d) == [f"SetWeight {weight}"] and d.status.phase == P.ANALYZING
        assert d.status.canary.weight == weight


# --- never route to a pool without ready endpoints ---------------------------------------------------------------


def test_the_canary_pool_is_created_only_once_its_pods_are_ready() -> None:
    absent = pools(canary_pool=False)
    waiting = decide(
        POOL_SPEC, start(P.DEPLOYING, weight=0), obs(canary=canary_state(ready=0), inference_pool=absent), NOW
    )
    assert actions(waiting) == [] and waiting.status.phase == P.DEPLOYING

    ready = decide(POOL_SPEC, start(P.DEPLOYING, weight=0), obs(canary=canary_state(), inference_pool=absent), NOW)
    assert actions(ready) == [
        f"Create InferencePool/{CANARY}",
        f"Create Deployment/{PICKER}",
        f"Create Service/{PICKER}",
    ]
    assert ready.status.phase == P.DEPLOYING and "SetWeight" not in str(actions(ready))
    condition = next(c for c in ready.status.conditions if c.type == "CanaryReady")
    assert (condition.status, condition.reason) == ("False", "PoolNotReady")


@pytest.mark.parametrize(
    ("state", "why"),
    [
        (pools(picker_ready=0), "endpoint picker is not ready"),
        (pools(endpoints=0), "has no ready endpoints"),
    ],
)
def test_no_weight_moves_to_a_pool_without_ready_endpoints_or_picker(state: PoolState, why: str) -> None:
    d = decide(POOL_SPEC, start(P.DEPLOYING, weight=0), obs(canary=canary_state(), inference_pool=state), NOW)
    assert not [a for a in d.actions if isinstance(a, SetWeight)]
    assert d.status.phase == P.DEPLOYING and why in (d.status.message or "")


def test_a_pool_that_loses_its_endpoints_mid_analysis_gets_zero_at_once() -> None:
    steady = decide(POOL_SPEC, start(P.ANALYZING), obs(canary=canary_state()), NOW)
    assert actions(steady) == ["SetWeight 30"] and steady.status.phase == P.ANALYZING
    lost = decide(POOL_SPEC, start(P.ANALYZING), obs(canary=canary_state(), inference_pool=pools(endpoints=0)), NOW)
    assert actions(lost) == ["SetWeight 0"] and lost.status.phase == P.DEPLOYING
    assert lost.status.canary.weight == 0
    assert [e.reason for e in lost.events if e.type == "Warning"] == ["CanaryPoolNotReady"]


# --- rollback, abort, delete: 100% baseline pool, read back, then delete in order ----------------------------------


def test_rollback_routes_everything_to_the_baseline_pool_then_deletes_pool_picker_and_canary() -> None:
    asked = decide(POOL_SPEC, start(P.ROLLING_BACK), obs(canary=canary_state(), routed_weight=30), NOW)
    assert actions(asked) == ["SetWeight 0"] and asked.status.phase == P.ROLLING_BACK
    seen = decide(POOL_SPEC, asked.status, obs(canary=canary_state(), routed_weight=0), NOW)
    assert actions(seen) == ["SetWeight 0"]  # drainDelay (30s by default) before anything is deleted
    done = decide(POOL_SPEC, seen.status, obs(canary=canary_state(), routed_weight=0), NOW + timedelta(seconds=30))
    assert actions(done) == ["SetWeight 0", *DELETES]
    gone = decide(POOL_SPEC, done.status, obs(routed_weight=0), NOW + timedelta(seconds=31))
    assert gone.status.phase == P.ROLLED_BACK


def test_abort_rolls_back_through_the_same_drain() -> None:
    aborted = decide(
        POOL_SPEC, start(P.ANALYZING), obs(canary=canary_state(), routed_weight=30, gates={"kvcal.dev/abort": "1"}), NOW
    )
    assert aborted.status.phase == P.ROLLING_BACK and not [a for a in aborted.actions if isinstance(a, Delete)]
    asked = decide(POOL_SPEC, aborted.status, obs(canary=canary_state(), routed_weight=30), NOW)
    assert actions(asked) == ["SetWeight 0"]


def test_delete_mid_analysis_drains_before_deleting_pool_picker_and_canary() -> None:
    status = start(P.ANALYZING)
    asked = decide_deletion(POOL_SPEC, status, obs(canary=canary_state(), routed_weight=30), NOW)
    assert actions(asked) == ["SetWeight 0"] and asked.requeue_after == 1.0
    seen = decide_deletion(POOL_SPEC, asked.status, obs(canary=canary_state(), routed_weight=0), NOW)
    done = decide_deletion(
        POOL_SPEC, seen.status, obs(canary=canary_state(), routed_weight=0), NOW + timedelta(seconds=30)
    )
    assert actions(done) == ["SetWeight 0", *DELETES] and done.requeue_after is None


def test_promotion_leaves_the_baseline_pool_and_removes_the_canary_pool() -> None:
    rolled = baseline(promoted=True)
    status = start(P.PROMOTING).model_copy(
        update={"calibration": CalibrationStatus(job="j", spec_hash=spec_hash(spec()))}
    )
    first = decide(POOL_SPEC, status, obs(canary=canary_state(), baseline=rolled, routed_weight=30), NOW)
    assert actions(first) == ["SetWeight 0"] and first.status.phase == P.PROMOTING
    later = obs(canary=canary_state(), baseline=rolled, routed_weight=0)
    second = decide(POOL_SPEC, first.status, later, NOW)
    third = decide(POOL_SPEC, second.status, later, NOW + timedelta(seconds=30))
    assert actions(third) == ["SetWeight 0", *DELETES] and third.status.phase == P.SUCCEEDED
    assert "Delete InferencePool/llm-pool" not in actions(third)


# --- what the chart allows -------------------------------------------------------------------------------------------


def test_refused_unless_the_chart_allows_it() -> None:
    d = decide(POOL_SPEC, KVCalibrationStatus(), observations(policy=POLICY), NOW)
    assert d.status.phase == P.INVALID_SPEC and d.actions == ()
    assert "rbac.inferencePool=true" in (d.status.message or "")
    condition = next(c for c in d.status.conditions if c.type == "Calibrated")
    assert condition.reason == "PolicyDenied"


def test_a_refused_spec_deletes_no_pool_it_never_made() -> None:
    d = decide_deletion(POOL_SPEC, start(P.ANALYZING, weight=0), observations(policy=Policy(), routed_weight=0), NOW)
    assert not [a for a in d.actions if isinstance(a, Delete) and a.kind == "InferencePool"]


# --- the label bug, twice: the baseline pool must never pick a canary pod ------------------------------------------


def test_canary_pods_leave_out_the_baseline_pool_and_service_selector_keys() -> None:
    labels = canary_state().manifest["spec"]["template"]["metadata"]["labels"]
    assert "tier" not in labels and "app" not in labels
    assert build_canary_pool(OWNER, baseline_pool())["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_a_canary_the_baseline_pool_selects_is_refused_before_its_pool_exists() -> None:
    old = build_canary_workload(OWNER, spec(), baseline_manifest(), 1)  # every baseline label kept (router replicas)
    d = decide(
        POOL_SPEC,
        start(P.DEPLOYING, weight=0),
        obs(canary=canary_state(manifest=old), inference_pool=pools(canary_pool=False)),
        NOW,
    )
    assert d.status.phase == P.DEPLOYING and not d.actions
    assert "selects the canary's pods too" in (d.status.message or "")


def test_a_missing_baseline_pool_blocks_naming_the_field() -> None:
    d = decide(POOL_SPEC, start(P.DEPLOYING, weight=0), obs(inference_pool=PoolState()), NOW)
    assert not d.actions and "spec.serving.traffic.inferencePool: InferencePool llm-pool was not found" in (
        d.status.message or ""
    )


# --- the picker copy -------------------------------------------------------------------------------------------------


def test_the_picker_copy_serves_the_canary_pool_under_the_baseline_pickers_identity() -> None:
    copied = build_canary_picker(OWNER, picker())
    pod = copied["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "llm-epp"
    assert pod["containers"][0]["image"] == picker()["spec"]["template"]["spec"]["containers"][0]["image"]
    assert pod["containers"][0]["args"][:2] == ["--pool-name", CANARY]
    assert copied["spec"]["replicas"] == 1
    labels = copied["spec"]["template"]["metadata"]["labels"]
    assert "app" not in labels  # the baseline picker Service never selects it
    pool_selector = build_canary_pool(OWNER, baseline_pool())["spec"]["selector"]["matchLabels"]
    assert not pool_selector.items() <= labels.items()  # nor does the canary pool


def test_picker_args_inline_form() -> None:
    inline = picker()
    inline["spec"]["template"]["spec"]["containers"][0]["args"] = ["--pool-name=llm-pool"]
    assert build_canary_picker(OWNER, inline)["spec"]["template"]["spec"]["containers"][0]["args"] == [
        f"--pool-name={CANARY}"
    ]


def test_what_kvcal_cannot_copy_is_named() -> None:
    no_flag = picker()
    no_flag["spec"]["template"]["spec"]["containers"][0]["args"] = []
    with pytest.raises(NeedsFix, match="--pool-name"):
        build_canary_picker(OWNER, no_flag)
    with pytest.raises(NeedsFix, match="exactly one Deployment"):
        picker_deployment(picker_service(), [picker(), copy.deepcopy(picker())])
    with pytest.raises(NeedsFix, match="found: none"):
        picker_deployment(picker_service(), [baseline_manifest()])
    other = baseline_pool()
    other["spec"]["endpointPickerRef"] = {"group": "example.com", "kind": "Picker", "name": "p"}
    with pytest.raises(NeedsFix, match="core Service"):
        picker_service_name(other)
    assert picker_deployment(picker_service(), [baseline_manifest(), picker()])["metadata"]["name"] == "llm-epp"


# --- the HTTPRoute's InferencePool backendRefs ---------------------------------------------------------------------

POOL_REF = {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "llm-pool"}
RULES = [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": [POOL_REF]}]


def test_route_weights_move_between_the_two_pools_and_back() -> None:
    thirty = weighted_rules(RULES, "llm-pool", CANARY, 30, INFERENCE_POOL)
    assert thirty[0]["backendRefs"] == [{**POOL_REF, "weight": 70}, {**POOL_REF, "name": CANARY, "weight": 30}]
    assert canary_share(thirty, "llm-pool", CANARY, INFERENCE_POOL) == 30
    sixty = weighted_rules(thirty, "llm-pool", CANARY, 60, INFERENCE_POOL)
    assert canary_share(sixty, "llm-pool", CANARY, INFERENCE_POOL) == 60
    assert weighted_rules(sixty, "llm-pool", CANARY, 0, INFERENCE_POOL) == RULES


def test_a_service_of_the_pools_name_is_not_the_pool() -> None:
    with pytest.raises(ValueError, match="InferencePool 'llm-pool'"):
        weighted_rules([{"backendRefs": [{"name": "llm-pool", "port": 80}]}], "llm-pool", CANARY, 30, INFERENCE_POOL)
    assert canary_share(RULES, "llm-pool", CANARY, SERVICE) == 0
    # weight 0 on a route that never routed to the baseline: nothing routes to the canary either
    assert weighted_rules([{"backendRefs": [{"name": "x"}]}], "llm-pool", CANARY, 0, INFERENCE_POOL) == [
        {"backendRefs": [{"name": "x"}]}
    ]
