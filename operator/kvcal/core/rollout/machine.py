"""The rollout machine's phase handlers (see core.phases for what each phase reads, how often it polls and where
it may go): the verified checkpoint (core.artifact.record) as a canary beside the baseline, step by step, analyzed,
then promoted into the baseline or rolled back. Pure like decide (no I/O, `now` passed in)."""

from datetime import datetime, timedelta

from kvcal.core.analysis import assess_run
from kvcal.core.capacity import capacity_status, with_capacity
from kvcal.core.draft import Builder, blocked, fail, no_baseline
from kvcal.core.manifests import (
    build_canary_service,
    build_canary_workload,
    build_promoted_baseline,
    canary_name,
    is_promoted,
)
from kvcal.core.manifests.workload import SHORT_NAMES
from kvcal.core.observations import PROMOTE_ANNOTATION, Apply, ApplyOwnedFields, Delete, SetWeight
from kvcal.core.policy import extra_args_violations
from kvcal.core.rollout.canary import remove_canary
from kvcal.core.timestamps import parse_rfc3339, rfc3339
from kvcal.core.traffic import plan_step
from kvcal.models.spec import AnalysisSpec, KVCalibrationSpec
from kvcal.models.status import AnalysisStatus, CanaryStatus, Phase


def next_measurement_at(spec: AnalysisSpec, status: AnalysisStatus) -> datetime | None:
    """When the next analysis interval is due: warmup after the start, then every interval."""
    if status.last_measured_at:
        return parse_rfc3339(status.last_measured_at) + timedelta(seconds=spec.interval_seconds)
    if status.started_at:
        return parse_rfc3339(status.started_at) + timedelta(seconds=spec.warmup_seconds)
    return None


def deploying(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    if _baseline_scaled_to_zero(draft, spec):
        return
    baseline = draft.obs.baseline
    if baseline is None:
        draft.condition("CanaryReady", "False", "BaselineNotFound", no_baseline(spec))
        draft.wait(no_baseline(spec), 30.0)
        return
    step = draft.status.canary.step_index
    plan = plan_step(spec.serving.traffic, step, baseline.replicas)
    name = canary_name(draft.obs.owner.name)
    canary = draft.obs.canary
    if canary is None or canary.replicas != plan.canary_replicas:
        draft.do(Apply(build_canary_workload(draft.obs.owner, spec, baseline.manifest, plan.canary_replicas)))
        if draft.obs.baseline_service is not None:
            draft.do(Apply(build_canary_service(draft.obs.owner, draft.obs.baseline_service)))
    ready = canary.ready_replicas if canary is not None else 0
    draft.update(
        canary=CanaryStatus(deployment=name, weight=draft.status.canary.weight, step_index=step, ready_replicas=ready)
    )
    if canary is not None and canary.progress_deadline_exceeded:
        draft.condition("CanaryReady", "False", "ProgressDeadlineExceeded", f"canary {name} did not become ready")
        draft.move(Phase.ROLLING_BACK, "CanaryNotReady", f"canary {name} did not become ready: rolling back")
        rolling_back(draft, spec, current_hash)
        return
    if canary is None or canary.replicas != plan.canary_replicas or ready < plan.canary_replicas:
        draft.condition("CanaryReady", "False", "Progressing", f"{ready}/{plan.canary_replicas} canary replicas ready")
        draft.wait(
            f"step {step + 1}/{len(spec.serving.traffic.steps)}: {ready}/{plan.canary_replicas} canary pods ready"
        )
        return
    draft.do(SetWeight(plan.weight))
    draft.update(
        canary=draft.status.canary.model_copy(update={"weight": plan.weight}),
        analysis=AnalysisStatus(started_at=rfc3339(draft.now), measurements=draft.status.analysis.measurements),
    )
    message = f"step {step + 1}/{len(spec.serving.traffic.steps)}: {ready} canary pods ready, weight {plan.weight}%"
    draft.condition("CanaryReady", "True", "Ready", message)
    draft.condition("AnalysisPassed", "Unknown", "Running", "analysis running")
    draft.move(Phase.ANALYZING, "CanaryReady", message)


def analyzing(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    canary = draft.obs.canary
    if canary is None:
        gone = f"the canary {spec.serving.baseline.kind} disappeared"
        draft.condition("CanaryReady", "False", "Missing", gone)
        draft.move(Phase.DEPLOYING, "CanaryMissing", f"{gone}: re-creating it")
        return
    draft.update(canary=draft.status.canary.model_copy(update={"ready_replicas": canary.ready_replicas}))
    at, readings = rfc3339(draft.now), draft.obs.kv_cache
    measured = with_capacity(spec.analysis.capacity, readings, list(draft.obs.measurements), at)
    # Recorded with an assessed interval only: a pass with nothing new writes no status (no self-triggered loop).
    capacity = capacity_status(readings, at) if readings and measured else None
    if capacity is not None:
        draft.update(capacity=capacity)
    verdict = assess_run(spec.analysis, draft.status.analysis, measured, draft.now)
    draft.update(analysis=verdict.status)
    if verdict.outcome == "Failed":
        draft.condition("AnalysisPassed", "False", "AnalysisFailed", verdict.reason)
        draft.move(Phase.ROLLING_BACK, "AnalysisFailed", verdict.reason)
        rolling_back(draft, spec, current_hash)
        return
    drift = _reassert_weight(draft, spec)
    if verdict.outcome == "Running":
        due = next_measurement_at(spec.analysis, draft.status.analysis)
        wait = max(1.0, (due - draft.now).total_seconds()) if due else draft.lifecycle.poll_seconds(Phase.ANALYZING)
        draft.wait(f"{drift}; {verdict.reason}" if drift else verdict.reason, wait)
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


def _reassert_weight(draft: Builder, spec: KVCalibrationSpec) -> str:
    """Level-triggered like Argo Rollouts: ask for the step's weight every pass; a route edited behind our back is
    reported (Warning event, message) and put back. The replicas router has no weight to read, so no drift to see."""
    desired, routed = draft.status.canary.weight, draft.obs.routed_weight
    draft.do(SetWeight(desired))
    if routed is None or routed == desired:
        return ""
    drift = f"HTTPRoute {spec.serving.traffic.http_route} sent {routed}% to the canary, not {desired}%: set it back"
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
        draft.do(ApplyOwnedFields(build_promoted_baseline(draft.obs.owner, spec, current_hash, baseline.manifest)))
        draft.condition("Promoted", "False", "RollingOut", f"rolling {name} to the calibrated checkpoint with FP8 KV")
        draft.wait(f"rolling the baseline {name} to the calibrated checkpoint")
        return
    if baseline.progress_deadline_exceeded:
        draft.condition("Promoted", "False", "ProgressDeadlineExceeded", f"{name} did not finish rolling out")
        fail(draft, "PromotionFailed", f"the baseline {name} did not finish rolling out (its old pods keep serving)")
        return
    if not baseline.rolled_out:
        updated, ready = baseline.updated_replicas, baseline.ready_replicas
        message = f"{updated}/{baseline.replicas} baseline pods updated, {ready} ready"
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
