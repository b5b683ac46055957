"""Traffic plan of one canary step: how many pods each side runs and which weight the canary really gets.

- ``replicas``: the canary pods carry the baseline Service's selector labels, so the Service spreads requests by
  pod count. The baseline is never scaled down (a rollback must not wait minutes for vLLM pods to start again), so
  the canary gets ``c / (N + c)`` of the traffic with ``c`` canary pods beside ``N`` baseline pods. ``c`` is the
  count nearest the asked weight, at least 1 and at most ``N`` (a canary never outgrows its baseline), so the
  achieved weight can differ from the asked one: with 1 baseline pod every step is 50%. ``TrafficPlan.weight`` is
  the achieved weight; ``requested_weight`` the step from the spec — the operator reports the achieved one.
- ``gateway-api``: HTTPRoute backendRef weights give the asked weight exactly; the canary gets enough pods for its
  share (``ceil(N x w / 100)``, at least 1).
- ``none``: analysis only; the canary (1 pod) gets no user traffic, only probes and whatever load a test sends.
"""

import math
from dataclasses import dataclass

from kvcal.models.spec import TrafficSpec


@dataclass(frozen=True)
class TrafficPlan:
    weight: int  # achieved percentage of user traffic on the canary
    canary_replicas: int
    baseline_replicas: int
    requested_weight: int = 0


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


def plan_step(traffic: TrafficSpec, step_index: int, baseline_replicas: int) -> TrafficPlan:
    weight = _step_weight(traffic, step_index)
    if baseline_replicas < 1:
        raise ValueError(f"baseline replicas {baseline_replicas}: the baseline Deployment must run at least 1 pod")
    if traffic.router == "replicas":
        canary = _replicas_for(weight, baseline_replicas)
        achieved = round(100 * canary / (baseline_replicas + canary))
        return TrafficPlan(achieved, canary, baseline_replicas, requested_weight=weight)
    if traffic.router == "gateway-api":
        canary = max(1, math.ceil(baseline_replicas * weight / 100))
        return TrafficPlan(weight, canary, baseline_replicas, requested_weight=weight)
    return TrafficPlan(0, 1, baseline_replicas, requested_weight=weight)


def backend_weights(plan: TrafficPlan) -> tuple[int, int]:
    """(baseline, canary) HTTPRoute backendRef weights summing to 100."""
    return 100 - plan.weight, plan.weight
