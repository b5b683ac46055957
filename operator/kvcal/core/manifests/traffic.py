"""Traffic plan of one canary step: how many pods each side runs and which weight the canary really gets.

- ``replicas``: the canary pods carry the baseline Service's selector labels, so the Service spreads requests by
  pod count. The baseline is never scaled down (a rollback must not wait minutes for vLLM pods to start again), so
  the canary gets ``c / (N + c)`` of the traffic with ``c`` canary pods beside ``N`` baseline pods. ``c`` is the
  count nearest the asked weight, at least 1 and at most ``N`` (a canary never outgrows its baseline), so the
  achieved weight can differ from the asked one: with 1 baseline pod every step is 50%. ``TrafficPlan.weight`` is
  the achieved weight; ``requested_weight`` the step from the spec — the operator reports the achieved one.
  It is the only router that puts the canary behind the baseline Service (``canary_behind_baseline_service``):
  under the others the canary's pods leave out the Service's selector labels, so the canary gets its HTTPRoute
  weight and nothing more (``gateway-api``), or no user traffic at all (``none``).
- ``gateway-api``: HTTPRoute backendRef weights give the asked weight exactly; the canary gets enough pods for its
  share (``ceil(N x w / 100)``), and at least ``spec.serving.canary.replicas`` (more pods average out one pod's own
  noise in the latency verdict).
- ``inference-pool``: the same, with the weights between the baseline's InferencePool and the canary's own
  (core.rollout.pool).
- ``none``: analysis only; the canary (``spec.serving.canary.replicas`` pods) gets no user traffic, only probes and
  whatever load a test sends.

With ``spec.serving.canary.capacity: fromBaseline`` (clusters without spare GPUs) the baseline IS scaled down: the
canary's pods come out of its ``N`` (``plan_from_baseline``), the baseline keeps ``N - c``, and the rollback waits for
its pods to start again; that is the price of never asking the cluster for more GPUs than the baseline had.

The shadow stage (``spec.serving.traffic.shadow``, gateway-api only) comes before the first step: weight 0, the
route mirrors ``percent`` of its requests to the canary (Gateway API RequestMirror; the gateway drops the mirror's
answers), so the canary is sized like a step of that weight. Not every gateway mirrors: the route's Gateway class
says which features it supports (GatewayClass ``status.supportedFeatures``, Gateway API's conformance names), and a
route with a filter its gateway does not support is rejected whole (Traefik v3.6 answers 404 for every request), so
the operator asks the class before it writes a mirror, and refuses the stage when the class does not list it.
"""

import math
from dataclasses import dataclass

from kvcal.models.spec import Router, ShadowSpec, TrafficSpec

MIRROR_FEATURE = "HTTPRouteRequestMirror"
PERCENTAGE_MIRROR_FEATURE = "HTTPRouteRequestPercentageMirror"


@dataclass(frozen=True)
class TrafficPlan:
    weight: int  # achieved percentage of user traffic on the canary
    canary_replicas: int
    baseline_replicas: int
    requested_weight: int = 0


def canary_behind_baseline_service(router: Router) -> bool:
    """Whether the canary's pods carry the baseline Service's selector labels (so the Service sends them requests)."""
    return router == "replicas"


def _step_weight(traffic: TrafficSpec, step_index: int) -> int:
    if not traffic.steps:
        raise ValueError("spec.serving.traffic.steps: needs at least one weight, e.g. [10, 50]")
    if not 0 <= step_index < len(traffic.steps):
        raise ValueError(f"step index {step_index}: spec.serving.traffic.steps has {len(traffic.steps)} steps")
    weight = traffic.steps[step_index]
    if not 0 < weight <= 100:
        raise ValueError(f"spec.serving.traffic.steps[{step_index}]: {weight} is not a percentage in (0, 100]")
    return weight


def _replicas_for(weight: int, baseline: int) -> int:
    if weight >= 100:
        return baseline
    best = min(range(1, baseline + 1), key=lambda c: (abs(100 * c / (baseline + c) - weight), c))
    return best


def plan_step(traffic: TrafficSpec, step_index: int, baseline_replicas: int, min_canary: int = 1) -> TrafficPlan:
    """``min_canary``: spec.serving.canary.replicas, the fewest canary pods of the weight routers (and none)."""
    weight = _step_weight(traffic, step_index)
    if baseline_replicas < 1:
        raise ValueError(f"baseline replicas {baseline_replicas}: the baseline Deployment must run at least 1 pod")
    if traffic.router == "replicas":
        canary = _replicas_for(weight, baseline_replicas)
        achieved = round(100 * canary / (baseline_replicas + canary))
        return TrafficPlan(achieved, canary, baseline_replicas, requested_weight=weight)
    if traffic.routes:
        canary = max(1, min_canary, math.ceil(baseline_replicas * weight / 100))
        return TrafficPlan(weight, canary, baseline_replicas, requested_weight=weight)
    return TrafficPlan(0, max(1, min_canary), baseline_replicas, requested_weight=weight)


def plan_shadow(shadow: ShadowSpec, baseline_replicas: int, min_canary: int = 1) -> TrafficPlan:
    """The shadow stage: no user-facing weight, and canary pods enough for the mirrored share."""
    if baseline_replicas < 1:
        raise ValueError(f"baseline replicas {baseline_replicas}: the baseline Deployment must run at least 1 pod")
    canary = max(1, min_canary, math.ceil(baseline_replicas * shadow.percent / 100))
    return TrafficPlan(0, canary, baseline_replicas, requested_weight=0)


def plan_from_baseline(plan: TrafficPlan, router: Router, total: int) -> TrafficPlan:
    """spec.serving.canary.capacity fromBaseline: ``plan`` (made for ``total`` baseline pods) with the canary's pods
    taken out of the baseline's, so both together never run more than ``total`` (the cluster's GPUs for this model).
    The baseline keeps at least one pod; under ``replicas`` the canary's share is its part of the total, the pod
    count nearest the asked weight."""
    if total < 2:
        raise ValueError(f"{total} baseline pod: none to take (core.rollout.borrowed refuses this first)")
    if router == "replicas":
        canary = min(range(1, total), key=lambda c: (abs(100 * c / total - plan.requested_weight), c))
        return TrafficPlan(round(100 * canary / total), canary, total - canary, plan.requested_weight)
    canary = min(plan.canary_replicas, total - 1)
    return TrafficPlan(plan.weight, canary, total - canary, plan.requested_weight)


def in_shadow_stage(traffic: TrafficSpec, step_index: int, shadowed: bool) -> bool:
    """The run is in (or about to enter) the shadow stage: configured, not yet passed, before the first step."""
    return traffic.shadow is not None and not shadowed and step_index == 0


def mirror_refusal(shadow: ShadowSpec, http_route: str | None, features: frozenset[str] | None) -> str | None:
    """Why the route's gateway cannot run the shadow stage (None: it can), naming the fix."""
    needed = [MIRROR_FEATURE] + ([PERCENTAGE_MIRROR_FEATURE] if shadow.percent < 100 else [])
    fix = "remove spec.serving.traffic.shadow, or serve the route from a gateway that mirrors"
    if features is None:
        return (
            f"spec.serving.traffic.shadow: cannot tell whether HTTPRoute {http_route}'s gateway mirrors requests "
            f"(no parent Gateway whose GatewayClass lists status.supportedFeatures): {fix}"
        )
    missing = [name for name in needed if name not in features]
    if not missing:
        return None
    return (
        f"spec.serving.traffic.shadow: HTTPRoute {http_route}'s GatewayClass does not list {', '.join(missing)} in "
        f"status.supportedFeatures, and a gateway rejects a route with a filter it does not support: {fix}"
        + (" (or set shadow.percent: 100)" if missing == [PERCENTAGE_MIRROR_FEATURE] else "")
    )
