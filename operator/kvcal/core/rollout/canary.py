"""Taking the canary out: route 100% to the baseline, read it back, drain, then delete (core.drain). Rollbacks,
promotions, spec changes and deletes all go through here, so traffic never points at a deleted Service."""

from kvcal.core.draft import Builder
from kvcal.core.drain import drain_step
from kvcal.core.manifests import canary_name
from kvcal.core.observations import Delete, SetWeight
from kvcal.models.spec import KVCalibrationSpec


def canary_deletes(draft: Builder) -> tuple[Delete, Delete]:
    """The canary workload (of the baseline's kind; a Deployment when the spec cannot be read) and its Service."""
    name = canary_name(draft.obs.owner.name)
    kind = draft.spec.serving.baseline.kind if draft.spec is not None else "Deployment"
    return Delete(kind, name), Delete("Service", name)


def remove_children(draft: Builder, *, include_jobs: bool) -> None:
    draft.do(SetWeight(0), *canary_deletes(draft))
    if include_jobs:
        for job in (draft.status.calibration.job, draft.status.verification.job):
            if job:
                draft.do(Delete("Job", job))
        if draft.status.calibration.job:
            draft.do(Delete("ConfigMap", draft.status.calibration.job))


def remove_canary(draft: Builder, spec: KVCalibrationSpec) -> bool:
    """Route 100% to the baseline, read it back, drain, then delete the canary (see core.drain); True once deleting."""
    draft.do(SetWeight(0))
    routed = draft.obs.routed_weight
    drain = drain_step(
        spec.serving.traffic, routed, draft.status.canary.draining_since, draft.obs.canary is not None, draft.now
    )
    weight = routed if routed is not None else (0 if drain.done else draft.status.canary.weight)
    draft.update(
        canary=draft.status.canary.model_copy(update={"weight": weight, "draining_since": drain.draining_since})
    )
    if not drain.done:
        draft.wait(drain.message, drain.wait_seconds)
        return False
    draft.do(*canary_deletes(draft))
    return True
