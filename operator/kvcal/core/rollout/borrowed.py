"""spec.serving.canary.capacity fromBaseline: the canary's pods (and the GPUs they ask for) are taken out of the
baseline's, so a rollout never asks the cluster for more than the baseline had.

The order is what keeps the count constant: the baseline is scaled down first and the canary sized after; when the
canary goes (rollback, delete, a restart of the run) the baseline's replicas are restored in the same pass as the
canary's deletes, so its new pods take the GPUs the canary frees (the scheduler places them as those pods end). The
replicas before the first scale-down are kept in status.canary.baselineReplicas until they are restored: a restart
of the operator, or a later step asking for more canary pods, counts from them. Promotion gives the canary's GPUs to
the rolling baseline first (core.rollout.machine.promoting): a surge pod on full Nodes would never be placed.

An autoscaler owning the baseline's replicas would undo the scale-down (or scale past it into the canary's GPUs), so
a baseline with a HorizontalPodAutoscaler is refused with the reason, before any canary exists.
"""

from kvcal.core.observations import ScaleBaseline
from kvcal.core.status.builder import Builder
from kvcal.models.spec import KVCalibrationSpec


def takes_from_baseline(spec: KVCalibrationSpec) -> bool:
    return spec.serving.canary.capacity == "fromBaseline"


def baseline_total(draft: Builder, current: int) -> int:
    """The baseline's replicas before any were taken: recorded once taken, else what it runs now."""
    recorded = draft.status.canary.baseline_replicas
    return recorded if recorded is not None else current


def refusal(draft: Builder, spec: KVCalibrationSpec, total: int) -> str | None:
    """Why the baseline's pods cannot be taken (None: they can), naming the fix."""
    if total < 2:
        return (
            f"spec.serving.canary.capacity fromBaseline: the baseline {spec.serving.baseline.workload} runs {total} "
            "pod and must keep one: scale it to 2 or more, or use capacity surge"
        )
    autoscaler = draft.obs.baseline_autoscaler
    if autoscaler is None:
        return None
    return (
        f"spec.serving.canary.capacity fromBaseline: HorizontalPodAutoscaler {autoscaler} owns the replicas of the "
        f"baseline {spec.serving.baseline.workload} and would undo taking pods from it: use capacity surge, or "
        "remove the autoscaler for the rollout"
    )


def take(draft: Builder, spec: KVCalibrationSpec, total: int, keep: int) -> bool:
    """Scale the baseline down to `keep` of its `total` pods before the canary grows; True once it runs no more."""
    baseline = draft.obs.baseline
    assert baseline is not None
    draft.update(canary=draft.status.canary.model_copy(update={"baseline_replicas": total}))
    # Until its pods are gone, not just asked to go: a pod being deleted still holds its GPU, and a canary pod
    # created meanwhile would be reported unschedulable for nothing.
    gone = (baseline.pods is None or baseline.pods <= keep) and not baseline.terminating
    if baseline.replicas <= keep and gone:
        return True
    ref = spec.serving.baseline
    if baseline.replicas > keep:
        draft.do(ScaleBaseline(ref.kind, ref.deployment, keep))
    draft.wait(
        f"taking {total - keep} of the baseline's {total} pods for the canary (spec.serving.canary.capacity "
        f"fromBaseline): {ref.workload} scaled to {keep}",
        2.0,
    )
    return False


def give_back(draft: Builder) -> None:
    """Restore the baseline's replicas taken for the canary (nothing when none were taken)."""
    total = draft.status.canary.baseline_replicas
    if total is None or draft.spec is None:
        return
    ref = draft.spec.serving.baseline
    draft.do(ScaleBaseline(ref.kind, ref.deployment, total))
    draft.update(canary=draft.status.canary.model_copy(update={"baseline_replicas": None}))
