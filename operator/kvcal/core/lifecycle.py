"""The work of each phase, for decide(): one handler per Phase, sharing a Builder that accumulates the next status,
the actions and the events. Pure like decide (no I/O, `now` passed in)."""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kvcal.core.analysis import assess_run
from kvcal.core.conditions import CONDITION_TYPES, set_condition
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
    ClearAnnotations,
    Create,
    Decision,
    Delete,
    Event,
    Observations,
    Patch,
    SetWeight,
)
from kvcal.core.phases import check_transition
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
    ConditionType,
    HistoryEntry,
    KVCalibrationStatus,
    Phase,
    VerificationStatus,
)

P = Phase
# How long to wait before looking again when nothing wakes the operator earlier: Job and canary events wake it (so
# those phases poll slowly); the baseline is not watched, so Promoting polls its rollout.
POLL_SECONDS: dict[Phase, float | None] = {
    P.PENDING: 1.0,
    P.CALIBRATING: 60.0,
    P.VERIFYING: 30.0,
    P.DEPLOYING: 15.0,
    P.ANALYZING: 5.0,
    P.AWAITING_PROMOTION: 300.0,
    P.PROMOTING: 5.0,
    P.ROLLING_BACK: 2.0,
    P.SUCCEEDED: None,
    P.ROLLED_BACK: None,
    P.FAILED: None,
    P.INVALID_SPEC: None,
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
        self.actions.extend(actions)

    def finish(self) -> Decision:
        ready = self.phase == P.SUCCEEDED
        self.condition("Ready", "True" if ready else "False", str(self.phase), self.status.message or "")
        requeue = self.requeue if self.requeue is not None else POLL_SECONDS[self.phase]
        if self.phase != self.start.phase:
            requeue = 0.0  # act on the new phase at once
        return Decision(self.status, tuple(self.actions), requeue, tuple(self.events))


def remove_children(b: Builder, *, include_jobs: bool) -> None:
    name = b.obs.owner.name
    b.do(SetWeight(0), Delete("Deployment", canary_name(name)), Delete("Service", canary_name(name)))
    if include_jobs:
        for job in (b.status.calibration.job, b.status.verification.job):
            if job:
                b.do(Delete("Job", job))
        if b.status.calibration.job:
            b.do(Delete("ConfigMap", b.status.calibration.job))


def remove_canary(b: Builder, spec: KVCalibrationSpec) -> bool:
    """Route 100% to the baseline, read it back, drain, then delete the canary (see core.drain); True once deleting."""
    b.do(SetWeight(0))
    routed = b.obs.routed_weight
    drain = drain_step(spec.serving.traffic, routed, b.status.canary.draining_since, b.obs.canary is not None, b.now)
    weight = routed if routed is not None else (0 if drain.done else b.status.canary.weight)
    b.update(canary=b.status.canary.model_copy(update={"weight": weight, "draining_since": drain.draining_since}))
    if not drain.done:
        b.wait(drain.message, drain.wait_seconds)
        return False
    name = canary_name(b.obs.owner.name)
    b.do(Delete("Deployment", name), Delete("Service", name))
    return True


def fail(b: Builder, reason: str, message: str) -> None:
    b.move(P.FAILED, reason, message)


# --- phase handlers -------------------------------------------------------------------------------------------


def _pending(b: Builder, spec: KVCalibrationSpec, h: str) -> None:
    job = b.obs.calibration_job
    name = calibration_job_name(b.obs.owner.name, h)
    if job is not None and job.deleting:
        b.wait(f"waiting for the previous calibration Job {name} to be deleted", 2.0)
        return
    if job is None:
        try:
            b.do(
                Create(build_calibration_configmap(b.obs.owner, spec, h)),
                Create(build_calibration_job(b.obs.owner, spec, h)),
            )
        except ValueError as e:
            b.move(P.INVALID_SPEC, "InvalidSpec", str(e))
            return
    b.update(calibration=CalibrationStatus(job=name, spec_hash=h))
    b.condition("Calibrated", "False", "JobRunning", f"calibration Job {name} is running")
    b.move(P.CALIBRATING, "CalibrationStarted", f"calibration Job {name} created")
    b.update(message=f"calibration Job {name} is running")  # what the next passes say: no second write


def _calibrating(b: Builder, spec: KVCalibrationSpec, h: str) -> None:
    job = b.obs.calibration_job
    if job is None:
        b.do(
            Create(build_calibration_configmap(b.obs.owner, spec, h)),
            Create(build_calibration_job(b.obs.owner, spec, h)),
        )
        b.wait("calibration Job missing: re-created it")
        return
    if job.state == "Running":
        b.wait(f"calibration Job {job.name} is running")
        return
    if job.state == "Failed":
        why = job.message.strip() or "no message"
        b.update(calibration=b.status.calibration.model_copy(update={"message": why[:1024]}))
        b.condition("Calibrated", "False", job.reason or "JobFailed", why)
        fail(b, "CalibrationFailed", f"calibration Job {job.name} failed ({job.reason or 'Failed'}): {why}")
        return
    try:
        summary = json.loads(job.message)
        if not isinstance(summary, dict):
            raise ValueError("not a JSON object")
        fields = {k: v for k, v in summary.items() if k in CALIBRATION_SUMMARY_FIELDS}
        calibration = CalibrationStatus.model_validate(
            {**fields, "job": job.name, "specHash": h, "artifact": spec.calibration.output}
        )
    except ValueError as e:
        b.condition("Calibrated", "False", "BadSummary", str(e))
        fail(b, "CalibrationFailed", f"calibration Job {job.name} succeeded but its summary is unreadable: {e}")
        return
    b.update(calibration=calibration)
    b.condition("Calibrated", "True", "JobSucceeded", _calibration_message(calibration))
    b.move(P.VERIFYING, "Calibrated", _calibration_message(calibration))


def _calibration_message(c: CalibrationStatus) -> str:
    parts = [f"{c.samples} samples, {c.tokens} tokens", f"kScaleMax {c.k_scale_max}, vScaleMax {c.v_scale_max}"]
    if c.top1_agreement_calibrated is not None:
        parts.append(f"top-1 agreement {c.top1_agreement_default} (default) -> {c.top1_agreement_calibrated}")
    return "; ".join(parts)


def _verifying(b: Builder, spec: KVCalibrationSpec, h: str) -> None:
    job = b.obs.verification_job
    name = verification_job_name(b.obs.owner.name, h)
    baseline = b.obs.baseline
    if job is None:
        if baseline is None:
            b.condition("ScalesVerified", "Unknown", "BaselineNotFound", _no_baseline(spec))
            b.wait(_no_baseline(spec), 30.0)
            return
        pod = baseline.manifest["spec"]["template"]["spec"]
        container = pod["containers"][baseline_container_index(baseline.manifest, spec.serving.baseline.container)]
        b.do(Create(build_verification_job(b.obs.owner, spec, h, container, pod)))
        b.update(verification=VerificationStatus(job=name))
        b.condition("ScalesVerified", "Unknown", "JobRunning", f"verification Job {name} is running")
        b.wait(f"verification Job {name} is running")
        return
    if job.state == "Running":
        b.update(verification=VerificationStatus(job=job.name))
        b.wait(f"verification Job {job.name} is running")
        return
    verification, ok = verification_result(job)
    b.update(verification=verification)
    if not ok:
        why = verification.message or "no message"
        reason = "ScalesMismatch" if verification.mismatches else "VerificationFailed"
        b.condition("ScalesVerified", "False", reason, why)
        fail(b, reason, f"verification Job {job.name}: vLLM did not load the calibrated scales: {why}")
        return
    message = f"vLLM loaded the calibrated scales of {verification.layers} layers, 0 mismatches"
    b.condition("ScalesVerified", "True", "ScalesLoaded", message)
    b.move(P.DEPLOYING, "ScalesVerified", message)


def _no_baseline(spec: KVCalibrationSpec) -> str:
    return f"waiting for the baseline Deployment {spec.serving.baseline.deployment}"


def _deploying(b: Builder, spec: KVCalibrationSpec, h: str) -> None:
    baseline = b.obs.baseline
    if baseline is None:
        b.condition("CanaryReady", "False", "BaselineNotFound", _no_baseline(spec))
        b.wait(_no_baseline(spec), 30.0)
        return
    step = b.status.canary.step_index
    plan = plan_step(spec.serving.traffic, step, baseline.replicas)
    name = canary_name(b.obs.owner.name)
    canary = b.obs.canary
    if canary is None or canary.replicas != plan.canary_replicas:
        b.do(Apply(build_canary_deployment(b.obs.owner, spec, baseline.manifest, plan.canary_replicas)))
        if b.obs.baseline_service is not None:
            b.do(Apply(build_canary_service(b.obs.owner, b.obs.baseline_service)))
    ready = canary.ready_replicas if canary is not None else 0
    b.update(canary=CanaryStatus(deployment=name, weight=b.status.canary.weight, step_index=step, ready_replicas=ready))
    if canary is not None and canary.progress_deadline_exceeded:
        b.condition("CanaryReady", "False", "ProgressDeadlineExceeded", f"canary {name} did not become ready")
        b.move(P.ROLLING_BACK, "CanaryNotReady", f"canary {name} did not become ready: rolling back")
        _rolling_back(b, spec, h)
        return
    if canary is None or canary.replicas != plan.canary_replicas or ready < plan.canary_replicas:
        b.condition("CanaryReady", "False", "Progressing", f"{ready}/{plan.canary_replicas} canary replicas ready")
        b.wait(f"step {step + 1}/{len(spec.serving.traffic.steps)}: {ready}/{plan.canary_replicas} canary pods ready")
        return
    b.do(SetWeight(plan.weight))
    b.update(
        canary=b.status.canary.model_copy(update={"weight": plan.weight}),
        analysis=AnalysisStatus(started_at=rfc3339(b.now), measurements=b.status.analysis.measurements),
    )
    message = f"step {step + 1}/{len(spec.serving.traffic.steps)}: {ready} canary pods ready, weight {plan.weight}%"
    b.condition("CanaryReady", "True", "Ready", message)
    b.condition("AnalysisPassed", "Unknown", "Running", "analysis running")
    b.move(P.ANALYZING, "CanaryReady", message)


def _analyzing(b: Builder, spec: KVCalibrationSpec, h: str) -> None:
    canary = b.obs.canary
    if canary is None:
        b.condition("CanaryReady", "False", "Missing", "the canary Deployment disappeared")
        b.move(P.DEPLOYING, "CanaryMissing", "the canary Deployment disappeared: re-creating it")
        return
    b.update(canary=b.status.canary.model_copy(update={"ready_replicas": canary.ready_replicas}))
    verdict = assess_run(spec.analysis, b.status.analysis, list(b.obs.measurements), b.now)
    b.update(analysis=verdict.status)
    if verdict.outcome == "Failed":
        b.condition("AnalysisPassed", "False", "AnalysisFailed", verdict.reason)
        b.move(P.ROLLING_BACK, "AnalysisFailed", verdict.reason)
        _rolling_back(b, spec, h)
        return
    drift = _reassert_weight(b, spec)
    if verdict.outcome == "Running":
        due = next_measurement_at(spec.analysis, b.status.analysis)
        wait = max(1.0, (due - b.now).total_seconds()) if due else POLL_SECONDS[P.ANALYZING]
        b.wait(f"{drift}; {verdict.reason}" if drift else verdict.reason, wait)
        return
    steps = spec.serving.traffic.steps
    step = b.status.canary.step_index
    if step + 1 < len(steps):
        b.update(
            canary=b.status.canary.model_copy(update={"step_index": step + 1}),
            analysis=AnalysisStatus(measurements=b.status.analysis.measurements),
        )
        b.move(P.DEPLOYING, "StepPassed", f"step {step + 1}/{len(steps)} passed: {verdict.reason}")
        return
    b.condition("AnalysisPassed", "True", "Passed", verdict.reason)
    if spec.promotion.mode == "manual":
        b.move(
            P.AWAITING_PROMOTION,
            "AwaitingPromotion",
            f"analysis passed ({verdict.reason}); run `kvcal promote {b.obs.owner.name}` to promote",
        )
        return
    b.move(P.PROMOTING, "Promoting", f"analysis passed ({verdict.reason}): promoting")
    _promoting(b, spec, h)


def _reassert_weight(b: Builder, spec: KVCalibrationSpec) -> str:
    """Level-triggered like Argo Rollouts: ask for the step's weight every pass; a route edited behind our back is
    reported (Warning event, message) and put back. The replicas router has no weight to read, so no drift to see."""
    desired, routed = b.status.canary.weight, b.obs.routed_weight
    b.do(SetWeight(desired))
    if routed is None or routed == desired:
        return ""
    drift = f"HTTPRoute {spec.serving.traffic.http_route} sent {routed}% to the canary, not {desired}%: set it back"
    b.event("Warning", "WeightDrift", drift)
    return drift


def _awaiting_promotion(b: Builder, spec: KVCalibrationSpec, h: str) -> None:
    if b.obs.gates.get(PROMOTE_ANNOTATION):
        b.do(ClearAnnotations((PROMOTE_ANNOTATION,)))
        b.move(P.PROMOTING, "Promoting", "promoted by the kvcal.dev/promote annotation")
        _promoting(b, spec, h)
        return
    b.wait(f"waiting for `kvcal promote {b.obs.owner.name}` (or the kvcal.dev/promote annotation)")


def _promoting(b: Builder, spec: KVCalibrationSpec, h: str) -> None:
    baseline = b.obs.baseline
    if baseline is None:
        b.condition("Promoted", "False", "BaselineNotFound", _no_baseline(spec))
        fail(b, "PromotionFailed", f"the baseline Deployment {spec.serving.baseline.deployment} disappeared")
        return
    name = spec.serving.baseline.deployment
    if not is_promoted(baseline.manifest, b.obs.owner, h):
        b.do(Patch("Deployment", name, build_promoted_baseline(b.obs.owner, spec, h, baseline.manifest)))
        b.condition("Promoted", "False", "RollingOut", f"rolling {name} to the calibrated checkpoint with FP8 KV")
        b.wait(f"rolling the baseline {name} to the calibrated checkpoint")
        return
    if baseline.progress_deadline_exceeded:
        b.condition("Promoted", "False", "ProgressDeadlineExceeded", f"{name} did not finish rolling out")
        fail(b, "PromotionFailed", f"the baseline {name} did not finish rolling out (its old pods keep serving)")
        return
    if not baseline.rolled_out:
        updated, ready = baseline.updated_replicas, baseline.ready_replicas
        message = f"{updated}/{baseline.replicas} baseline pods updated, {ready} ready"
        b.condition("Promoted", "False", "RollingOut", message)
        b.wait(message)
        return
    if not remove_canary(b, spec):
        b.condition("Promoted", "False", "DrainingCanary", b.status.message or "")
        return
    b.update(canary=b.status.canary.model_copy(update={"weight": 0, "ready_replicas": 0}))
    message = f"{name} serves the calibrated checkpoint with FP8 KV on all {baseline.replicas} pods"
    b.condition("Promoted", "True", "RolledOut", message)
    b.move(P.SUCCEEDED, "Promoted", message)


def _rolling_back(b: Builder, spec: KVCalibrationSpec, h: str) -> None:
    for job in (b.obs.calibration_job, b.obs.verification_job):
        if job is not None and job.state == "Running":
            b.do(Delete("Job", job.name))
    if not remove_canary(b, spec):
        return
    if b.obs.canary is not None:
        b.wait("removing the canary", POLL_SECONDS[P.ROLLING_BACK])
        return
    b.condition("Promoted", "False", "RolledBack", "the baseline was left untouched")
    b.move(P.ROLLED_BACK, "RolledBack", f"rolled back: {b.status.history[-1].message if b.status.history else ''}")


def _terminal(b: Builder, spec: KVCalibrationSpec, h: str) -> None:
    b.wait(b.status.message or "", None)


Handler = Callable[[Builder, KVCalibrationSpec, str], None]
HANDLERS: dict[Phase, Handler] = {
    P.PENDING: _pending,
    P.CALIBRATING: _calibrating,
    P.VERIFYING: _verifying,
    P.DEPLOYING: _deploying,
    P.ANALYZING: _analyzing,
    P.AWAITING_PROMOTION: _awaiting_promotion,
    P.PROMOTING: _promoting,
    P.ROLLING_BACK: _rolling_back,
    P.SUCCEEDED: _terminal,
    P.ROLLED_BACK: _terminal,
    P.FAILED: _terminal,
    P.INVALID_SPEC: _terminal,
}
