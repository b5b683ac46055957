"""The artifact machine's phase handlers (see core.phases for what each phase reads, how often it polls and where
it may go): Pending creates the calibration Job, Calibrating reads its summary, Verifying runs vLLM on the checkpoint
and reads back the scales it loaded. Pure like decide (no I/O, `now` passed in)."""

import json

from kvcal.core.artifact.context import served_context
from kvcal.core.artifact.verification import verification_result
from kvcal.core.artifact.waiting import waiting_for_a_node
from kvcal.core.guard.inuse import output_in_use
from kvcal.core.manifests import (
    build_calibration_configmap,
    build_calibration_job,
    build_verification_job,
    calibration_job_name,
    verification_job_name,
)
from kvcal.core.manifests.canary import baseline_container_index
from kvcal.core.manifests.jobs import VERIFICATION_DEADLINE_SECONDS
from kvcal.core.observations import Create
from kvcal.core.status.builder import Builder, blocked, fail, no_baseline
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import CALIBRATION_SUMMARY_FIELDS, CalibrationStatus, Phase, VerificationStatus


def pending(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    if refuse_served_output(draft, spec):
        return
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


def calibrating(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    job = draft.obs.calibration_job
    if job is None:
        if refuse_served_output(draft, spec):
            return
        draft.do(
            Create(build_calibration_configmap(draft.obs.owner, spec, current_hash, _served_context(draft, spec))),
            Create(build_calibration_job(draft.obs.owner, spec, current_hash)),
        )
        draft.wait("calibration Job missing: re-created it")
        return
    if job.state == "Running":
        run_seconds = spec.calibration.job.active_deadline_seconds
        if not waiting_for_a_node(draft, job, run_seconds, "Calibrated", "calibration"):
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


def verifying(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    job = draft.obs.verification_job
    name = verification_job_name(draft.obs.owner.name, current_hash)
    baseline = draft.obs.baseline
    if job is None:
        if baseline is None:
            draft.condition("ScalesVerified", "Unknown", "BaselineNotFound", no_baseline(spec))
            draft.wait(no_baseline(spec), 30.0)
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
        if not waiting_for_a_node(draft, job, VERIFICATION_DEADLINE_SECONDS, "ScalesVerified", "verification"):
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


def refuse_served_output(draft: Builder, spec: KVCalibrationSpec) -> bool:
    """Before a calibration Job is created (Pending, or Calibrating re-creating a Job that vanished): refuse an
    output the baseline serves (the calibrator replaces it)."""
    if draft.obs.calibration_job is not None or draft.obs.baseline is None:
        return False
    served = output_in_use(spec, draft.obs.baseline.manifest)
    if served is None:
        return False
    message = (
        f"spec.calibration.output {spec.calibration.output} is in {served} of the baseline "
        f"{spec.serving.baseline.workload}: "
        "calibrating there would overwrite what it serves; choose a new spec.calibration.output"
    )
    draft.condition("Calibrated", "False", "OutputInUse", message)
    blocked(draft, "OutputInUse", message, 60.0)
    return True
