"""Router inference-pool in the rollout machine (core.manifests.pool builds the objects).

The canary's InferencePool and its endpoint picker come up only once the canary pods are Ready, and weight moves to
the canary pool only while that pool has ready endpoints and a ready picker: an HTTPRoute rule with a weighted pool
that has no endpoints (or no picker to ask) can answer 503 for every request of the rule, not just the pool's share.
Should the canary pool lose them while it takes traffic, its weight goes back to 0% at once and Deploying waits for
them again. Taking the canary out (core.rollout.canary) deletes the pool and the picker with it, after the route
reads back 0% on the canary pool. Pure like decide.
"""

from kvcal.core.manifests.common import Manifest, match_labels
from kvcal.core.manifests.pool import (
    POOL_FIELD,
    build_canary_picker,
    build_canary_picker_service,
    build_canary_pool,
    canary_picker_name,
    canary_pool_name,
    picker_deployment,
    picker_service_name,
)
from kvcal.core.observations import Create, Delete, PoolState
from kvcal.core.problems import NeedsFix
from kvcal.core.status.builder import Builder
from kvcal.models.spec import KVCalibrationSpec

POOL_POLL_SECONDS = 5.0  # pods, pools and pickers are not watched: look again this often while waiting on them


def uses_pools(spec: KVCalibrationSpec | None) -> bool:
    return spec is not None and spec.serving.traffic.router == "inference-pool"


def baseline_pool_state(draft: Builder, spec: KVCalibrationSpec) -> tuple[PoolState, Manifest]:
    """The pools as observed, with the baseline's pool (NeedsFix when it cannot be read or does not exist)."""
    state = draft.obs.inference_pool or PoolState(error="the InferencePools were not read")
    if state.error:
        raise NeedsFix(f"{POOL_FIELD}: {state.error}")
    if state.baseline_pool is None:
        raise NeedsFix(
            f"{POOL_FIELD}: InferencePool {spec.serving.traffic.inference_pool} was not found in namespace "
            f"{draft.obs.owner.namespace}: name the pool that spec.serving.traffic.httpRoute routes to"
        )
    return state, state.baseline_pool


def pool_selector_keys(baseline_pool: Manifest) -> frozenset[str]:
    """The baseline pool's matchLabels keys: the canary's pods leave them out, or the baseline pool would pick them."""
    return frozenset(match_labels(baseline_pool))


def not_serving(state: PoolState) -> str | None:
    """Why the canary pool must not take weight now; None: it may (it exists, has a ready picker and endpoints)."""
    name = "the canary InferencePool"
    if state.canary_pool is None:
        return f"{name} does not exist yet"
    picker = state.canary_picker
    if picker is None or picker.ready_replicas < 1:
        return f"{name}'s endpoint picker is not ready"
    if state.ready_endpoints < 1:
        return f"{name} has no ready endpoints"
    return None


def bring_up_pool(draft: Builder, spec: KVCalibrationSpec) -> bool:
    """In Deploying, once the canary pods are Ready: create the canary's pool, picker and picker Service (each if
    absent). True once the pool may take weight; else the draft waits, saying on what."""
    state, baseline_pool = baseline_pool_state(draft, spec)
    owner = draft.obs.owner
    selector = match_labels(baseline_pool)
    canary = draft.obs.canary
    pod_labels = canary.manifest["spec"]["template"].get("metadata", {}).get("labels", {}) if canary else {}
    if selector and all(pod_labels.get(k) == v for k, v in selector.items()):
        raise NeedsFix(
            f"{POOL_FIELD}: InferencePool {spec.serving.traffic.inference_pool} selects the canary's pods too "
            f"(matchLabels {selector}): the canary would get the baseline pool's traffic; re-create the canary "
            "(kvcal retry) so that its pods leave out the pool's labels"
        )
    if state.canary_pool is None:
        draft.do(Create(build_canary_pool(owner, baseline_pool)))
    if state.canary_picker is None:
        service_name = picker_service_name(baseline_pool)
        if state.picker_service is None:
            raise NeedsFix(
                f"{POOL_FIELD}: the endpoint picker Service {service_name} of InferencePool "
                f"{spec.serving.traffic.inference_pool} was not found: kvcal copies the picker behind it"
            )
        picker = picker_deployment(state.picker_service, state.deployments)
        draft.do(
            Create(build_canary_picker(owner, picker)), Create(build_canary_picker_service(owner, state.picker_service))
        )
    why = not_serving(state)
    if why is None:
        return True
    message = f"{why}: no weight moves to it until it has ready endpoints and a ready endpoint picker"
    draft.condition("CanaryReady", "False", "PoolNotReady", message)
    draft.wait(message, POOL_POLL_SECONDS)
    return False


def pool_deletes(draft: Builder) -> tuple[Delete, ...]:
    """The canary's pool, picker and picker Service; none unless this spec made them (inference-pool, allowed)."""
    if not uses_pools(draft.spec) or not draft.obs.policy.inference_pool:
        return ()
    name = draft.obs.owner.name
    picker = canary_picker_name(name)
    return Delete("InferencePool", canary_pool_name(name)), Delete("Deployment", picker), Delete("Service", picker)
