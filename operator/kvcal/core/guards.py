"""Checks before a phase handler acts, for problems the user must fix: each becomes a status that says what to do
(a condition, the message, one Warning event), never an exception."""

from kvcal.core.inuse import output_in_use
from kvcal.core.lifecycle import Builder
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import Phase


def blocked(draft: Builder, reason: str, message: str, seconds: float) -> None:
    """Wait with `message` in the status; a Warning event only when the message is new (not on every pass)."""
    if draft.start.message != message:
        draft.event("Warning", reason, message)
    draft.wait(message, seconds)


def refuse_served_output(draft: Builder, spec: KVCalibrationSpec) -> bool:
    """Before a calibration Job is created (Pending, or Calibrating re-creating a Job that vanished): refuse an
    output the baseline serves (the calibrator replaces it)."""
    creates_job = draft.phase in (Phase.PENDING, Phase.CALIBRATING) and draft.obs.calibration_job is None
    if not creates_job or draft.obs.baseline is None:
        return False
    served = output_in_use(spec, draft.obs.baseline.manifest)
    if served is None:
        return False
    deployment = spec.serving.baseline.deployment
    message = (
        f"spec.calibration.output {spec.calibration.output} is in {served} of the baseline Deployment {deployment}: "
        "calibrating there would overwrite what it serves; choose a new spec.calibration.output"
    )
    draft.condition("Calibrated", "False", "OutputInUse", message)
    blocked(draft, "OutputInUse", message, 60.0)
    return True


def baseline_scaled_to_zero(draft: Builder, spec: KVCalibrationSpec) -> bool:
    """Deploying sizes the canary from the baseline's replicas: at 0 there is nothing to compare against."""
    baseline = draft.obs.baseline
    if draft.phase != Phase.DEPLOYING or baseline is None or baseline.replicas >= 1:
        return False
    deployment, ns, name = spec.serving.baseline.deployment, draft.obs.owner.namespace, draft.obs.owner.name
    message = (
        f"the baseline Deployment {deployment} has 0 replicas: scale it up "
        f"(kubectl scale deploy/{deployment} -n {ns} --replicas=N) or abort (kvcal abort {name} -n {ns})"
    )
    draft.condition("CanaryReady", "False", "BaselineScaledToZero", message)
    blocked(draft, "BaselineScaledToZero", message, 30.0)
    return True
