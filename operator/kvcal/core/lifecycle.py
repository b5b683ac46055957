"""The work of each phase, for decide(): one handler per Phase, sharing a Builder that accumulates the next status,
the actions and the events. Pure like decide (no I/O, `now` passed in)."""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kvcal.core.analysis import assess_run
from kvcal.core.capacity import capacity_status, with_capacity
from kvcal.core.conditions import CONDITION_TYPES, get_condition, set_condition
from kvcal.core.context import served_context
from kvcal.core.drain import drain_step
from kvcal.core.events import history_event
from kvcal.core.manifests import (
    build_calibration_configmap,
    build_calibration_job,
    build_canary_deployment,
    build_canary_service,
    build_promoted_baseline,
    build_verification_job,
    calibration_job_name,
    canary_name,
    is_promoted,
    verification_job_name,
)
from kvcal.core.manifests.canary import baseline_container_index
from kvcal.core.observations import (
    PROMOTE_ANNOTATION,
    Action,
    Apply,
    ApplyOwnedFields,
    ClearAnnotations,
    Create,
    Decision,
    Delete,
    Event,
    Observations,
    SetWeight,
)
from kvcal.core.phases import check_transition
from kvcal.core.policy import extra_args_violations
from kvcal.core.timestamps import parse_rfc3339, rfc3339
from kvcal.core.traffic import plan_step
from kvcal.core.verification import verification_result
from kvcal.models.spec import AnalysisSpec, KVCalibrationSpec
from kvcal.models.status import (
    CALIBRATION_SUMMARY_FIELDS,
    MAX_HISTORY,
    AnalysisStatus,
    CalibrationStatus,
    CanaryStatus,
    CapacityStatus,
    ConditionType,
    HistoryEntry,
    KVCalibrationStatus,
    Phase,
    ServingStatus,
    VerificationStatus,
)

# How long to wait before looking again when nothing wakes the operator earlier: Job and canary events wake it (so
# those phases poll slowly); the baseline is not watched, so Promoting polls its rollout.
POLL_SECONDS: dict[Phase, float | None] = {
    Phase.PENDING: 1.0,
    Phase.CALIBRATING: 60.0,
    Phase.VERIFYING: 30.0,
    Phase.DEPLOYING: 15.0,
    Phase.ANALYZING: 5.0,
    Phase.AWAITING_PROMOTION: 300.0,
    Phase.PROMOTING: 5.0,
    Phase.ROLLING_BACK: 2.0,
    Phase.SUCCEEDED: None,
    Phase.ROLLED_BACK: None,
    Phase.FAILED: None,
    Phase.INVALID_SPEC: None,
}


def next_measurement_at(spec: AnalysisSpec, status: AnalysisStatus) -> datetime | None:
    """When the next analysis interval is due: warmup after the start, then every interval."""
    if status.last_measured_at:
        return parse_rfc3339(status.last_measured_at) + timedelta(seconds=spec.interval_seconds)
    if status.started_at:
        return parse_rfc3339(status.started_at) + timedelta(seconds=spec.warmup_seconds)
    return None


@dataclass
class Builder:
    """The next status being computed, plus the actions and events that go with it."""

    spec: KVCalibrationSpec | None
    start: KVCalibrationStatus
    obs: Observations
    now: datetime
    status: KVCalibrationStatus = field(init=False)
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue: float | None = None

    def __post_init__(self) -> None:
        self.status = self.start.model_copy(update={"observed_generation": self.obs.generation})
        if not self.status.conditions:
            for t in CONDITION_TYPES:
                self.condition(t, "Unknown", "NotStarted", "")

    @property
    def phase(self) -> Phase:
        return self.status.phase

    def update(self, **fields: Any) -> None:
        self.status = self.status.model_copy(update=fields)

    def condition(self, type_: ConditionType, status: str, reason: str, message: str = "") -> None:
        now, generation = self.now, self.obs.generation
        self.update(conditions=set_condition(self.status.conditions, type_, status, reason, message, now, generation))

    def move(self, phase: Phase, reason: str, message: str) -> None:
        check_transition(self.phase, phase)
        at = rfc3339(self.now)
        entry = HistoryEntry(phase=phase, at=at, reason=reason, message=message[:512])
        self.update(
            phase=phase,
            message=message,
            phase_started_at=at,
            history=[*self.status.history, entry][-MAX_HISTORY:],
        )
        # The reconciler sends this one from status.history (idempotently, surviving a restart); listed here so a
        # decision says everything it announces.
        self.events.append(history_event(entry))

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event("Warning" if type_ == "Warning" else "Normal", reason, message[:1024]))

    def wait(self, message: str, seconds: float | None = None) -> None:
        self.update(message=message)
        self.requeue = seconds

    def do(self, *actions: Action) -> None:
        # An action already queued in this pass is not queued again (e.g. a drained canary's deletes, then starting
        # over, which removes every child): doing it twice would change nothing.
        self.actions.extend(action for action in actions if action not in self.actions)

    def finish(self) -> Decision:
        promoted = get_condition(self.status.conditions, "Promoted")
        reverted = promoted is not None and promoted.status == "False"  # in Succeeded: reverted (core.reverts)
        ready = self.phase == Phase.SUCCEEDED and not reverted
        self.condition("Ready", "True" if ready else "False", str(self.phase), self.status.message or "")
        requeue = self.requeue if self.requeue is not None else POLL_SECONDS[self.phase]
        if self.phase != self.start.phase:
            requeue = 0.0  # act on the new phase at once
        return Decision(self.status, tuple(self.actions), requeue, tuple(self.events))


def start_over(draft: Builder, reason: str, message: str) -> None:
    """Forget every step's result and remove every child, before moving back to Pending (a spec change of the
    calibration inputs, or `kvcal recalibrate`)."""
    remove_children(draft, include_jobs=True)
    draft.update(
        calibration=CalibrationStatus(),
        verification=VerificationStatus(),
        canary=CanaryStatus(),
        analysis=AnalysisStatus(),
        serving=ServingStatus(),
        capacity=CapacityStatus(),
    )
    for step in ("Calibrated", "ScalesVerified", "CanaryReady", "AnalysisPassed", "Promoted"):
        draft.condition(step, "Unknown", reason, message)
    for optional in ("SpecCurrent", "ServingVerified"):
        if get_condition(draft.status.conditions, optional) is not None:
            draft.condition(optional, "Unknown", reason, message)


def remove_children(draft: Builder, *, include_jobs: bool) -> None:
    name = draft.obs.owner.name
    draft.do(SetWeight(0), Delete("Deployment", canary_name(name)), Delete("Service", canary_name(name)))
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
    name = canary_name(draft.obs.owner.name)
    draft.do(Delete("Deployment", name), Delete("Service", name))
    return True


def fail(draft: Builder, reason: str, message: str) -> None:
    draft.move(Phase.FAILED, reason, message)


# --- phase handlers -------------------------------------------------------------------------------------------


def _pending(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    job = draft.obs.calibration_job
    name = calibration_job_name(draft.obs.owner.name, current_hash)
    if job is not None and job.deleting:
        draft.wait(f"waiting for the previous calibration Job {name} to be deleted", 2.0)
        return
    if job is None:
        try:
            draft.do(
                Create(build_calibration_configmap(draft.obs.owner, spec, current_hash, _served_context(draft, spec))),
                Create(build_calibration_job(draft.obs.owner, spec, current_hash)),
            )
        except ValueError as e:
            draft.move(Phase.INVALID_SPEC, "InvalidSpec", str(e))
            return
    draft.update(calibration=CalibrationStatus(job=name, spec_hash=current_hash))
    draft.condition("Calibrated", "False", "JobRunning", f"calibration Job {name} is running")
    draft.move(Phase.CALIBRATING, "CalibrationStarted", f"calibration Job {name} created")
    draft.update(message=f"calibration Job {name} is running")  # what the next passes say: no second write


def _served_context(draft: Builder, spec: KVCalibrationSpec) -> int | None:
    return served_context(draft.obs.baseline, spec.serving.baseline.container)


def _calibrating(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    job = draft.obs.calibration_job
    if job is None:
        draft.do(
            Create(build_calibration_configmap(draft.obs.owner, spec, current_hash, _served_context(draft, spec))),
            Create(build_calibration_job(draft.obs.owner, spec, current_hash)),
        )
        draft.wait("calibration Job missing: re-created it")
        return
    if job.state == "Running":
        draft.wait(f"calibration Job {job.name} is running")
        return
    if job.state == "Failed":
        why = job.message.strip() or "no message"
        draft.update(calibration=draft.status.calibration.model_copy(update={"message": why[:1024]}))
        draft.condition("Calibrated", "False", job.reason or "JobFailed", why)
        fail(draft, "CalibrationFailed", f"calibration Job {job.name} failed ({job.reason or 'Failed'}): {why}")
        return
    try:
        summary = json.loads(job.message)
        if not isinstance(summary, dict):
            raise ValueError("not a JSON object")
        fields = {k: v for k, v in summary.items() if k in CALIBRATION_SUMMARY_FIELDS}
        calibration = CalibrationStatus.model_validate(
            {**fields, "job": job.name, "specHash": current_hash, "artifact": spec.calibration.output}
        )
    except ValueError as e:
        draft.condition("Calibrated", "False", "BadSummary", str(e))
        fail(draft, "CalibrationFailed", f"calibration Job {job.name} succeeded but its summary is unreadable: {e}")
        return
    draft.update(calibration=calibration)
    if calibration.context_warning:
        draft.event("Warning", "CalibrationContextShort", calibration.context_warning)
    draft.condition("Calibrated", "True", "JobSucceeded", _calibration_message(calibration))
    draft.move(Phase.VERIFYING, "Calibrated", _calibration_message(calibration))


def _calibration_message(c: CalibrationStatus) -> str:
    parts = [f"{c.samples} samples, {c.tokens} tokens", f"kScaleMax {c.k_scale_max}, vScaleMax {c.v_scale_max}"]
    if c.top1_agreement_calibrated is not None:
        parts.append(f"top-1 agreement {c.top1_agreement_default} (default) -> {c.top1_agreement_calibrated}")
    if c.context_warning:
        parts.append(f"warning: {c.context_warning}")
    return "; ".join(parts)


def _verifying(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    job = draft.obs.verification_job
    name = verification_job_name(draft.obs.owner.name, current_hash)
    baseline = draft.obs.baseline
    if job is None:
        if baseline is None:
            draft.condition("ScalesVerified", "Unknown", "BaselineNotFound", _no_baseline(spec))
            draft.wait(_no_baseline(spec), 30.0)
            return
        pod = baseline.manifest["spec"]["template"]["spec"]
        container = pod["containers"][baseline_container_index(baseline.manifest, spec.serving.baseline.container)]
        draft.do(Create(build_verification_job(draft.obs.owner, spec, current_hash, container, pod)))
        draft.update(verification=VerificationStatus(job=name))
        draft.condition("ScalesVerified", "Unknown", "JobRunning", f"verification Job {name} is running")
        draft.wait(f"verification Job {name} is running")
        return
    if job.state == "Running":
        draft.update(verification=VerificationStatus(job=job.name))
        draft.wait(f"verification Job {job.name} is running")
        return
    verification, ok = verification_result(job)
    draft.update(verification=verification)
    if not ok:
        why = verification.message or "no message"
        reason = "ScalesMismatch" if verification.mismatches else "VerificationFailed"
        draft.condition("ScalesVerified", "False", reason, why)
        fail(draft, reason, f"verification Job {job.name}: vLLM did not load the calibrated scales: {why}")
        return
    message = f"vLLM loaded the calibrated scales of {verification.layers} layers, 0 mismatches"
    draft.condition("ScalesVerified", "True", "ScalesLoaded", message)
    draft.move(Phase.DEPLOYING, "ScalesVerified", message)


def _no_baseline(spec: KVCalibrationSpec) -> str:
    return f"waiting for the baseline Deployment {spec.serving.baseline.deployment}"


def _deploying(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    baseline = draft.obs.baseline
    if baseline is None:
        draft.condition("CanaryReady", "False", "BaselineNotFound", _no_baseline(spec))
        draft.wait(_no_baseline(spec), 30.0)
        return
    step = draft.status.canary.step_index
    plan = plan_step(spec.serving.traffic, step, baseline.replicas)
    name = canary_name(draft.obs.owner.name)
    canary = draft.obs.canary
    if canary is None or canary.replicas != plan.canary_replicas:
        draft.do(Apply(build_canary_deployment(draft.obs.owner, spec, baseline.manifest, plan.canary_replicas)))
        if draft.obs.baseline_service is not None:
            draft.do(Apply(build_canary_service(draft.obs.owner, draft.obs.baseline_service)))
    ready = canary.ready_replicas if canary is not None else 0
    draft.update(
        canary=CanaryStatus(deployment=name, weight=draft.status.canary.weight, step_index=step, ready_replicas=ready)
    )
    if canary is not None and canary.progress_deadline_exceeded:
        draft.condition("CanaryReady", "False", "ProgressDeadlineExceeded", f"canary {name} did not become ready")
        draft.move(Phase.ROLLING_BACK, "CanaryNotReady", f"canary {name} did not become ready: rolling back")
        _rolling_back(draft, spec, current_hash)
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


def _analyzing(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    canary = draft.obs.canary
    if canary is None:
        draft.condition("CanaryReady", "False", "Missing", "the canary Deployment disappeared")
        draft.move(Phase.DEPLOYING, "CanaryMissing", "the canary Deployment disappeared: re-creating it")
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
        _rolling_back(draft, spec, current_hash)
        return
    drift = _reassert_weight(draft, spec)
    if verdict.outcome == "Running":
        due = next_measurement_at(spec.analysis, draft.status.analysis)
        wait = max(1.0, (due - draft.now).total_seconds()) if due else POLL_SECONDS[Phase.ANALYZING]
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
    _promoting(draft, spec, current_hash)


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


def _awaiting_promotion(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    if draft.obs.gates.get(PROMOTE_ANNOTATION):
        draft.do(ClearAnnotations((PROMOTE_ANNOTATION,)))
        draft.move(Phase.PROMOTING, "Promoting", "promoted by the kvcal.dev/promote annotation")
        _promoting(draft, spec, current_hash)
        return
    baseline = draft.obs.baseline
    if baseline is not None and is_promoted(baseline.manifest, draft.obs.owner, current_hash):
        # `kvcal promotion-patch` committed to Git and synced: the baseline already carries the promotion.
        draft.move(Phase.PROMOTING, "PromotedThroughGit", "the baseline carries the promotion (from Git): rolling out")
        _promoting(draft, spec, current_hash)
        return
    name = draft.obs.owner.name
    draft.wait(f"waiting for `kvcal promote {name}`, or `kvcal promotion-patch {name}` committed to Git")


def _promoting(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    baseline = draft.obs.baseline
    if baseline is None:
        draft.condition("Promoted", "False", "BaselineNotFound", _no_baseline(spec))
        fail(draft, "PromotionFailed", f"the baseline Deployment {spec.serving.baseline.deployment} disappeared")
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


def _rolling_back(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    for job in (draft.obs.calibration_job, draft.obs.verification_job):
        if job is not None and job.state == "Running":
            draft.do(Delete("Job", job.name))
    if not remove_canary(draft, spec):
        return
    if draft.obs.canary is not None:
        draft.wait("removing the canary", POLL_SECONDS[Phase.ROLLING_BACK])
        return
    draft.condition("Promoted", "False", "RolledBack", "the baseline was left untouched")
    draft.move(
        Phase.ROLLED_BACK,
        "RolledBack",
        f"rolled back: {draft.status.history[-1].message if draft.status.history else ''}",
    )


def _terminal(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    draft.wait(draft.status.message or "", None)


Handler = Callable[[Builder, KVCalibrationSpec, str], None]
HANDLERS: dict[Phase, Handler] = {
    Phase.PENDING: _pending,
    Phase.CALIBRATING: _calibrating,
    Phase.VERIFYING: _verifying,
    Phase.DEPLOYING: _deploying,
    Phase.ANALYZING: _analyzing,
    Phase.AWAITING_PROMOTION: _awaiting_promotion,
    Phase.PROMOTING: _promoting,
    Phase.ROLLING_BACK: _rolling_back,
    Phase.SUCCEEDED: _terminal,
    Phase.ROLLED_BACK: _terminal,
    Phase.FAILED: _terminal,
    Phase.INVALID_SPEC: _terminal,
}
