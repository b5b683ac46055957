"""The rollout machine's phase handlers (see core.phases for what each phase reads, how often it polls and where
it may go): the verified checkpoint (core.artifact.record) as a canary beside the baseline, step by step, analyzed,
then promoted into the baseline or rolled back. Pure like decide (no I/O, `now` passed in)."""

from datetime import timedelta

from kvcal.core.analysis.capacity import capacity_status, with_capacity
from kvcal.core.analysis.schedule import next_measurement_at
from kvcal.core.analysis.share import with_share
from kvcal.core.analysis.verdict import assess_run
from kvcal.core.guard.policy import extra_args_violations
from kvcal.core.manifests import (
    build_canary_service,
    build_canary_workload,
    build_promoted_baseline,
    canary_name,
    is_promoted,
)
from kvcal.core.manifests.canary import keep_existing_selector
from kvcal.core.manifests.traffic import (
    canary_behind_baseline_service,
    in_shadow_stage,
    mirror_refusal,
    plan_from_baseline,
    plan_shadow,
    plan_step,
)
from kvcal.core.manifests.workload import SHORT_NAMES
from kvcal.core.observations import PROMOTE_ANNOTATION, Apply, ApplyOwnedFields, Delete, SetWeight, Unschedulable
from kvcal.core.rollout import borrowed
from kvcal.core.rollout.borrowed import baseline_total, takes_from_baseline
from kvcal.core.rollout.canary import remove_canary
from kvcal.core.rollout.pool import (
    baseline_pool_state,
    bring_up_pool,
    not_serving,
    pool_selector_keys,
    uses_pools,
)
from kvcal.core.status.builder import Builder, StepEntered, blocked, fail, no_baseline, reported
from kvcal.core.timestamps import parse_rfc3339, rfc3339
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import AnalysisStatus, Phase

# How often an unschedulable canary is looked at again (the scheduler retries it on its own; a Node freed or added
# shows within this).
UNSCHEDULABLE_POLL_SECONDS = 15.0


def deploying(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    if _baseline_scaled_to_zero(draft, spec):
        return
    baseline = draft.obs.baseline
    if baseline is None:
        draft.condition("CanaryReady", "False", "BaselineNotFound", no_baseline(spec))
        draft.wait(no_baseline(spec), 30.0)
        return
    step = draft.status.canary.step_index
    traffic, shadow = spec.serving.traffic, spec.serving.traffic.shadow
    shadowing = shadow is not None and in_shadow_stage(traffic, step, draft.status.canary.shadowed)
    if shadow is not None and shadowing:
        refusal = mirror_refusal(shadow, traffic.http_route, draft.obs.gateway_features)
        if refusal is not None:  # asked before any mirror is written: a rejected route would fail every request
            draft.condition("CanaryReady", "False", "MirrorUnsupported", refusal)
            blocked(draft, "MirrorUnsupported", refusal, 30.0)
            return
    taking = takes_from_baseline(spec)
    total = baseline_total(draft, baseline.replicas) if taking else baseline.replicas
    if shadow is not None and shadowing:
        plan = plan_shadow(shadow, total, spec.serving.canary.replicas)
    else:
        plan = plan_step(traffic, step, total, spec.serving.canary.replicas)
    if taking:
        refused = borrowed.refusal(draft, spec, total)
        if refused is not None:
            draft.condition("CanaryReady", "False", "CannotTakeFromBaseline", refused)
            blocked(draft, "CannotTakeFromBaseline", refused, 30.0)
            return
        plan = plan_from_baseline(plan, traffic.router, total)
    mirror = shadow.percent if shadow is not None and shadowing else 0
    name = canary_name(draft.obs.owner.name)
    canary = draft.obs.canary
    service = draft.obs.baseline_service
    if service is None and not canary_behind_baseline_service(spec.serving.traffic.router):
        missing = (
            f"the baseline Service {spec.serving.baseline.service} was not found: the canary's pods must leave out "
            "its selector labels (spec.serving.baseline.service)"
        )
        draft.condition("CanaryReady", "False", "BaselineServiceNotFound", missing)
        draft.wait(missing, 30.0)
        return
    # inference-pool: the baseline pool must exist first; the canary's pods leave out its selector keys too.
    pool_keys = pool_selector_keys(baseline_pool_state(draft, spec)[1]) if uses_pools(spec) else frozenset()
    if taking and not borrowed.take(draft, spec, total, plan.baseline_replicas):
        return  # the baseline gives up its pods first: the canary is sized on the next pass
    if canary is None or canary.replicas != plan.canary_replicas:
        workload = build_canary_workload(
            draft.obs.owner, spec, baseline.manifest, plan.canary_replicas, service, pool_keys
        )
        draft.do(Apply(keep_existing_selector(workload, canary.manifest) if canary is not None else workload))
        if service is not None:
            draft.do(Apply(build_canary_service(draft.obs.owner, service)))
    ready = canary.ready_replicas if canary is not None else 0
    # A copy: the shadow stage's fields (mirror, shadowed) must survive the step's resizing passes.
    draft.update(
        canary=draft.status.canary.model_copy(
            update={"deployment": name, "step_index": step, "ready_replicas": ready, "draining_since": None}
        )
    )
    unplaced = draft.obs.canary_unschedulable
    if canary is not None and unplaced is not None and ready < plan.canary_replicas:
        unschedulable(draft, spec, name, unplaced, current_hash)
        return
    if canary is not None and canary.progress_deadline_exceeded:
        draft.condition("CanaryReady", "False", "ProgressDeadlineExceeded", f"canary {name} did not become ready")
        draft.move(Phase.ROLLING_BACK, "CanaryNotReady", f"canary {name} did not become ready: rolling back")
        rolling_back(draft, spec, current_hash)
        return
    stage = "shadow" if mirror else f"step {step + 1}/{len(traffic.steps)}"
    if canary is None or canary.replicas != plan.canary_replicas or ready < plan.canary_replicas:
        draft.condition("CanaryReady", "False", "Progressing", f"{ready}/{plan.canary_replicas} canary replicas ready")
        draft.wait(f"{stage}: {ready}/{plan.canary_replicas} canary pods ready")
        return
    if uses_pools(spec) and not bring_up_pool(draft, spec):
        return  # the canary pool takes weight only with ready endpoints and a ready picker
    draft.do(SetWeight(plan.weight, mirror=mirror))
    draft.update(
        canary=draft.status.canary.model_copy(update={"weight": plan.weight, "mirror": mirror}),
        analysis=AnalysisStatus(started_at=rfc3339(draft.now), measurements=draft.status.analysis.measurements),
    )
    exposure = (
        f"mirroring {mirror}% of requests to it (users see only the baseline's answers)"
        if mirror
        else f"weight {plan.weight}%"
    )
    message = f"{stage}: {ready} canary pods ready, {exposure}"
    draft.condition("CanaryReady", "True", "Ready", message)
    draft.condition("AnalysisPassed", "Unknown", "Running", "analysis running")
    entered = None if mirror else StepEntered(step + 1, len(traffic.steps), plan.weight)
    draft.move(Phase.ANALYZING, "CanaryReady", message, step=entered)


def unschedulable(
    draft: Builder, spec: KVCalibrationSpec, name: str, unplaced: Unschedulable, current_hash: str
) -> None:
    """Canary pods the scheduler could not place: said at once (condition, one Warning event), then the spec's
    choice once they have waited spec.serving.canary.scheduling.timeout. The Deployment's progress deadline does not
    decide here: the cause is known, and `wait` means waiting past it."""
    scheduling = spec.serving.canary.scheduling
    what = (
        f"{unplaced.pods} canary pod{'s' if unplaced.pods > 1 else ''} of {name} unschedulable since "
        f"{unplaced.since}{unplaced.shortage}: {unplaced.message}"
    )
    since = parse_rfc3339(unplaced.since) if unplaced.since else draft.now
    deadline = since + timedelta(seconds=scheduling.timeout_seconds)
    if scheduling.on_timeout == "rollback" and draft.now >= deadline:
        draft.condition("CanaryReady", "False", "Unschedulable", what)
        draft.move(
            Phase.ROLLING_BACK,
            "CanaryUnschedulable",
            f"{what}: rolling back after {scheduling.timeout} (spec.serving.canary.scheduling)",
        )
        rolling_back(draft, spec, current_hash)
        return
    then = (
        f"rolling back at {rfc3339(deadline)}"
        if scheduling.on_timeout == "rollback"
        else "waiting for capacity (onTimeout wait)"
    )
    message = f"{what}; {then} (spec.serving.canary.scheduling)"
    reported(draft, "CanaryReady", "False", "Unschedulable", message, ("Warning", "CanaryUnschedulable"))
    left = (deadline - draft.now).total_seconds()
    poll = UNSCHEDULABLE_POLL_SECONDS
    draft.wait(message, max(1.0, min(poll, left)) if scheduling.on_timeout == "rollback" else poll)


def analyzing(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    canary = draft.obs.canary
    if canary is None:
        gone = f"the canary {spec.serving.baseline.kind} disappeared"
        draft.condition("CanaryReady", "False", "Missing", gone)
        draft.move(Phase.DEPLOYING, "CanaryMissing", f"{gone}: re-creating it")
        return
    draft.update(canary=draft.status.canary.model_copy(update={"ready_replicas": canary.ready_replicas}))
    if uses_pools(spec) and _pool_lost(draft, spec):
        return
    at, readings = rfc3339(draft.now), draft.obs.kv_cache
    measured = with_capacity(spec.analysis.capacity, readings, list(draft.obs.measurements), at)
    # The share check only on a window counted entirely at this step's weight (started_at: when it was set).
    started = draft.status.analysis.started_at
    window = timedelta(seconds=spec.analysis.interval_seconds)
    at_weight = started is not None and draft.now - parse_rfc3339(started) >= window
    weight, router = draft.status.canary.weight, spec.serving.traffic.router
    mirror = draft.status.canary.mirror  # the shadow stage: the canary also answers the mirrored copies
    measured = with_share(measured, weight, router, at, window_within_step=at_weight, mirror=mirror)
    # Recorded with an assessed interval only: a pass with nothing new writes no status (no self-triggered loop).
    capacity = capacity_status(readings, at) if readings and measured else None
    if capacity is not None:
        draft.update(capacity=capacity)
    shadow = spec.serving.traffic.shadow
    shadowing = shadow is not None and draft.status.canary.mirror > 0
    # The shadow stage passes on its own count of intervals; the verdict's rules are the steps'.
    analysis = (
        spec.analysis.model_copy(update={"successful_intervals": shadow.intervals})
        if shadow is not None and shadowing
        else spec.analysis
    )
    verdict = assess_run(analysis, draft.status.analysis, measured, draft.now)
    draft.update(analysis=verdict.status)
    if verdict.outcome == "Failed":
        draft.condition("AnalysisPassed", "False", "AnalysisFailed", verdict.reason)
        draft.move(Phase.ROLLING_BACK, "AnalysisFailed", verdict.reason)
        rolling_back(draft, spec, current_hash)
        return
    if verdict.outcome == "Undecided":
        _undecided(draft, spec, current_hash, verdict.reason)
        return
    drift = _reassert_weight(draft, spec)
    if verdict.outcome == "Running":
        due = next_measurement_at(spec.analysis, draft.status.analysis)
        wait = max(1.0, (due - draft.now).total_seconds()) if due else draft.lifecycle.poll_seconds(Phase.ANALYZING)
        draft.wait(f"{drift}; {verdict.reason}" if drift else verdict.reason, wait)
        return
    if shadowing:
        # Weights move only now; Deploying sizes the canary for step 1 and replaces the mirror with its weight.
        draft.update(
            canary=draft.status.canary.model_copy(update={"shadowed": True}),
            analysis=AnalysisStatus(measurements=draft.status.analysis.measurements),
        )
        draft.move(Phase.DEPLOYING, "ShadowPassed", f"shadow stage passed on mirrored requests: {verdict.reason}")
        return
    steps = spec.serving.traffic.steps
    step = draft.status.canary.step_index
    if step + 1 < len(steps):
        draft.update(
            canary=draft.status.canary.model_copy(update={"step_index": step + 1}),
            analysis=AnalysisStatus(measurements=draft.status.analysis.measurements),
        )
        draft.move(Phase.DEPLOYING, "StepPassed", f"step {step + 1}/{len(steps)} passed: {verdict.reason}")
        return
    draft.condition("AnalysisPassed", "True", "Passed", verdict.reason)
    if spec.promotion.mode == "manual":
        draft.move(
            Phase.AWAITING_PROMOTION,
            "AwaitingPromotion",
            f"analysis passed ({verdict.reason}); run `kvcal promote {draft.obs.owner.name}` to promote "
            f"(or commit `kvcal promotion-patch {draft.obs.owner.name}` to Git)",
        )
        return
    draft.move(Phase.PROMOTING, "Promoting", f"analysis passed ({verdict.reason}): promoting")
    promoting(draft, spec, current_hash)


def _undecided(draft: Builder, spec: KVCalibrationSpec, current_hash: str, reason: str) -> None:
    """The latency test made its last look without deciding: neither slower nor shown safe. onUndecided: pause
    waits for a person in AwaitingPromotion (traffic stays at this step's weight), rollback rolls back with reason
    AnalysisUndecided (never "slower")."""
    draft.condition("AnalysisPassed", "Unknown", "AnalysisUndecided", reason)
    if spec.analysis.on_undecided == "rollback":
        draft.move(Phase.ROLLING_BACK, "AnalysisUndecided", f"{reason} (onUndecided: rollback)")
        rolling_back(draft, spec, current_hash)
        return
    name = draft.obs.owner.name
    draft.move(
        Phase.AWAITING_PROMOTION,
        "AnalysisUndecided",
        f"{reason}; onUndecided: pause: run `kvcal promote {name}` to promote or `kvcal abort {name}` to roll back",
    )


def _pool_lost(draft: Builder, spec: KVCalibrationSpec) -> bool:
    """Router inference-pool while Analyzing: a canary pool that lost its ready endpoints (or its picker) gets 0% at
    once, and Deploying waits until it has them again (core.rollout.pool)."""
    state, _ = baseline_pool_state(draft, spec)
    why = not_serving(state)
    if why is None:
        return False
    message = f"{why}: its weight is back to 0% until it has ready endpoints and a ready endpoint picker"
    draft.do(SetWeight(0))
    draft.update(canary=draft.status.canary.model_copy(update={"weight": 0}))
    draft.event("Warning", "CanaryPoolNotReady", message)
    draft.condition("CanaryReady", "False", "PoolNotReady", message)
    draft.move(Phase.DEPLOYING, "CanaryPoolNotReady", message)
    return True


def _reassert_weight(draft: Builder, spec: KVCalibrationSpec) -> str:
    """Level-triggered like Argo Rollouts: ask for the step's weight every pass; a route edited behind our back is
    reported (Warning event, message) and put back. The replicas router has no weight to read, so no drift to see."""
    desired, routed = draft.status.canary.weight, draft.obs.routed_weight
    mirror, mirrored = draft.status.canary.mirror, draft.obs.routed_mirror
    draft.do(SetWeight(desired, mirror=mirror))
    route = f"HTTPRoute {spec.serving.traffic.http_route}"
    if routed is not None and routed != desired:
        drift = f"{route} sent {routed}% to the canary, not {desired}%: set it back"
    elif mirrored is not None and mirrored != mirror:
        drift = f"{route} mirrored {mirrored}% of requests to the canary, not {mirror}%: set it back"
    else:
        return ""
    draft.event("Warning", "WeightDrift", drift)
    return drift


def awaiting_promotion(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    if draft.obs.gates.get(PROMOTE_ANNOTATION):
        draft.clear(PROMOTE_ANNOTATION)
        draft.move(Phase.PROMOTING, "Promoting", "promoted by the kvcal.dev/promote annotation")
        promoting(draft, spec, current_hash)
        return
    baseline = draft.obs.baseline
    if baseline is not None and is_promoted(baseline.manifest, draft.obs.owner, current_hash):
        # `kvcal promotion-patch` committed to Git and synced: the baseline already carries the promotion.
        draft.move(Phase.PROMOTING, "PromotedThroughGit", "the baseline carries the promotion (from Git): rolling out")
        promoting(draft, spec, current_hash)
        return
    name = draft.obs.owner.name
    draft.wait(f"waiting for `kvcal promote {name}`, or `kvcal promotion-patch {name}` committed to Git")


def promoting(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    baseline = draft.obs.baseline
    if baseline is None:
        draft.condition("Promoted", "False", "BaselineNotFound", no_baseline(spec))
        fail(draft, "PromotionFailed", f"the baseline {spec.serving.baseline.workload} disappeared")
        return
    name = spec.serving.baseline.deployment
    if not is_promoted(baseline.manifest, draft.obs.owner, current_hash):
        if _promotion_refused(draft, spec):
            return
        if draft.status.canary.baseline_replicas is not None and not _canary_gives_its_gpus(draft, spec):
            return
        draft.do(ApplyOwnedFields(build_promoted_baseline(draft.obs.owner, spec, current_hash, baseline.manifest)))
        draft.condition("Promoted", "False", "RollingOut", f"rolling {name} to the calibrated checkpoint with FP8 KV")
        draft.wait(f"rolling the baseline {name} to the calibrated checkpoint")
        return
    if baseline.progress_deadline_exceeded:
        draft.condition("Promoted", "False", "ProgressDeadlineExceeded", f"{name} did not finish rolling out")
        fail(draft, "PromotionFailed", f"the baseline {name} did not finish rolling out (its old pods keep serving)")
        return
    if not baseline.rolled_out and draft.obs.baseline_unschedulable is not None and draft.obs.canary is not None:
        _canary_makes_room(draft, spec, draft.obs.baseline_unschedulable)
        return
    if not baseline.rolled_out:
        updated, ready = baseline.updated_replicas, baseline.ready_replicas
        message = f"{updated}/{baseline.replicas} baseline pods updated, {ready} ready"
        if baseline.pods is not None and baseline.pods > baseline.replicas:
            message += f", {baseline.pods - baseline.replicas} old still running"
        draft.condition("Promoted", "False", "RollingOut", message)
        draft.wait(message)
        return
    if draft.status.canary.baseline_replicas is not None:
        # Rolled out on the pods it kept: now the ones it gave the canary, each placed where an old pod ended. Not
        # with the template: a rollout asking for them too would wait on GPUs its own old pods hold.
        total = draft.status.canary.baseline_replicas
        borrowed.give_back(draft)
        message = f"{name} serves the calibrated checkpoint on {baseline.replicas} pods: scaling it back to {total}"
        draft.condition("Promoted", "False", "RollingOut", message)
        draft.wait(message)
        return
    if not remove_canary(draft, spec):
        draft.condition("Promoted", "False", "DrainingCanary", draft.status.message or "")
        return
    draft.update(canary=draft.status.canary.model_copy(update={"weight": 0, "ready_replicas": 0}))
    message = f"{name} serves the calibrated checkpoint with FP8 KV on all {baseline.replicas} pods"
    draft.condition("Promoted", "True", "RolledOut", message)
    draft.move(Phase.SUCCEEDED, "Promoted", message)


def _canary_gives_its_gpus(draft: Builder, spec: KVCalibrationSpec) -> bool:
    """capacity fromBaseline: the cluster has no GPU beyond the baseline's and the canary's, so the canary goes
    before the baseline rolls (a surge pod would never be placed); True once it is gone. Its pods are given back
    once the baseline rolled out on the pods it kept: restored before, they would start the old model, and a
    rollout asking for all of them at once waits on GPUs its own old pods hold (maxUnavailable 0)."""
    if not remove_canary(draft, spec, give_back_pods=False):
        draft.condition("Promoted", "False", "DrainingCanary", draft.status.message or "")
        return False
    if draft.obs.canary is not None:
        message = "removing the canary first: the baseline's rollout takes its GPUs (capacity fromBaseline)"
        draft.condition("Promoted", "False", "DrainingCanary", message)
        draft.wait(message, draft.lifecycle.poll_seconds(Phase.PROMOTING))
        return False
    return True


def _canary_makes_room(draft: Builder, spec: KVCalibrationSpec, unplaced: Unschedulable) -> None:
    """The promoted baseline's new pods cannot be placed while the canary holds its GPUs (a surge pod on full
    Nodes, with maxUnavailable 0 no old pod goes first): the canary, which serves the same calibrated model, leaves
    now instead of after the rollout, and its GPUs take the baseline's new pods."""
    message = (
        f"{unplaced.pods} new pod{'s' if unplaced.pods > 1 else ''} of {spec.serving.baseline.workload} "
        f"unschedulable{unplaced.shortage}: removing the canary now, its GPUs go to the rollout"
    )
    reported(draft, "Promoted", "False", "MakingRoom", message, ("Normal", "CanaryMakesRoom"))
    if remove_canary(draft, spec):
        draft.wait(message, draft.lifecycle.poll_seconds(Phase.PROMOTING))


def _promotion_refused(draft: Builder, spec: KVCalibrationSpec) -> bool:
    """Promotion writes the canary's extraArgs into the baseline, which the KVCalibration's author may not be allowed
    to edit: only what the allow-list allows now is written. decide() already rolled back a run that the policy
    refuses before Promoting; this is the write itself (the policy, or the spec, changed since that pass). Nothing of
    the promotion was written (the baseline does not carry it), and Promoting never rolls back, so: the canary is
    drained and removed as in a rollback, then Failed, naming the flag and the chart value; `kvcal retry` re-runs
    the analysis under the policy of then."""
    refused = extra_args_violations(spec.serving.canary.extra_args, draft.obs.policy)
    if not refused:
        return False
    why = "; ".join(str(v) for v in refused)
    reason = "PolicyDenied" if any(v.chart_value for v in refused) else "InvalidSpec"
    draft.condition("Promoted", "False", reason, f"not promoted: {why}")
    if remove_canary(draft, spec):
        baseline = spec.serving.baseline.deployment
        fail(draft, reason, f"promotion refused, the baseline {baseline} was left untouched: {why}")
    return True


def rolling_back(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    for job in (draft.obs.calibration_job, draft.obs.verification_job):
        if job is not None and job.state == "Running":
            draft.do(Delete("Job", job.name))
    if not remove_canary(draft, spec):
        return
    if draft.obs.canary is not None:
        draft.wait("removing the canary", draft.lifecycle.poll_seconds(Phase.ROLLING_BACK))
        return
    draft.condition("Promoted", "False", "RolledBack", "the baseline was left untouched")
    draft.move(
        Phase.ROLLED_BACK,
        "RolledBack",
        f"rolled back: {draft.status.history[-1].message if draft.status.history else ''}",
    )


def _baseline_scaled_to_zero(draft: Builder, spec: KVCalibrationSpec) -> bool:
    """Deploying sizes the canary from the baseline's replicas: at 0 there is nothing to compare against."""
    baseline = draft.obs.baseline
    if baseline is None or baseline.replicas >= 1:
        return False
    ref, ns, name = spec.serving.baseline, draft.obs.owner.namespace, draft.obs.owner.name
    message = (
        f"the baseline {ref.workload} has 0 replicas: scale it up (kubectl scale {SHORT_NAMES[ref.kind]}/"
        f"{ref.deployment} -n {ns} --replicas=N) or abort (kvcal abort {name} -n {ns})"
    )
    draft.condition("CanaryReady", "False", "BaselineScaledToZero", message)
    blocked(draft, "BaselineScaledToZero", message, 30.0)
    return True
