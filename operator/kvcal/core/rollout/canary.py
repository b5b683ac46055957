"""Taking the canary out: route 100% to the baseline, read it back, drain, then delete (core.rollout.drain). Rollbacks,
promotions, spec changes and deletes all go through here, so traffic never points at a deleted Service."""

from kvcal.core.manifests import canary_name
from kvcal.core.observations import Delete, SetWeight
from kvcal.core.rollout.borrowed import give_back
from kvcal.core.rollout.drain import drain_step
from kvcal.core.rollout.pool import pool_deletes
from kvcal.core.status.builder import Builder
from kvcal.models.spec import KVCalibrationSpec


def canary_deletes(draft: Builder) -> tuple[Delete, ...]:
    """The canary workload (of the baseline's kind; a Deployment when the spec cannot be read) and its Service; with
    router inference-pool, its pool and endpoint picker first (the route no longer names the pool by then)."""
    name = canary_name(draft.obs.owner.name)
    kind = draft.spec.serving.baseline.kind if draft.spec is not None else "Deployment"
    return *pool_deletes(draft), Delete(kind, name), Delete("Service", name)


def remove_children(draft: Builder, *, include_jobs: bool) -> None:
    draft.do(SetWeight(0), *canary_deletes(draft))
    give_back(draft)
    if include_jobs:
        for job in (draft.status.calibration.job, draft.status.verification.job):
            if job:
                draft.do(Delete("Job", job))
        if draft.status.calibration.job:
            draft.do(Delete("ConfigMap", draft.status.calibration.job))


def remove_canary(draft: Builder, spec: KVCalibrationSpec, *, give_back_pods: bool = True) -> bool:
    """Route 100% to the baseline, read it back, drain, then delete the canary (see core.rollout.drain); True once
    deleting. The baseline gets back the pods taken for the canary (core.rollout.borrowed) with the deletes, unless
    `give_back_pods` is False (the promotion gives them back with its own apply)."""
    draft.do(SetWeight(0))  # and no mirror: a mirror naming a deleted Service breaks the route on some gateways
    obs, canary = draft.obs, draft.status.canary
    drain = drain_step(
        spec.serving.traffic, obs.canary_exposure, canary.draining_since, obs.canary is not None, draft.now
    )
    # What the route reports; unread (replicas, none): 0 once drained, else what was last set.
    weight = obs.routed_weight if obs.routed_weight is not None else (0 if drain.done else canary.weight)
    mirror = obs.routed_mirror if obs.routed_mirror is not None else (0 if drain.done else canary.mirror)
    update = {"weight": weight, "mirror": mirror, "draining_since": drain.draining_since}
    draft.update(canary=canary.model_copy(update=update))
    if not drain.done:
        draft.wait(drain.message, drain.wait_seconds)
        return False
    draft.do(*canary_deletes(draft))
    if give_back_pods:
        give_back(draft)
    return True
