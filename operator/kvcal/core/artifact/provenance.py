"""The calibrator image: resolved for the Job (the user's, else the operator's default), recorded as provenance,
never hashed (core.spechash), so an operator upgrade that changes the default restarts nothing."""

from kvcal.core.observations import Observations
from kvcal.core.status.builder import Builder
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import Phase


def calibrator_image(spec: KVCalibrationSpec, obs: Observations) -> str:
    return spec.calibration.job.image or obs.policy.calibrator_image


def with_calibrator_image(spec: KVCalibrationSpec, image: str) -> KVCalibrationSpec:
    """The spec the Job builders see: the resolved image in place (the hash saw only what the user declared)."""
    job = spec.calibration.job.model_copy(update={"image": image})
    return spec.model_copy(update={"calibration": spec.calibration.model_copy(update={"job": job})})


def record_calibrator_image(draft: Builder, image: str) -> None:
    """Provenance: the image that computed the scales, recorded by the pass that creates the calibration Job."""
    calibration = draft.status.calibration
    if calibration.job is None or calibration.calibrator_image:
        return
    carried = draft.start.calibration.calibrator_image if draft.start.calibration.job == calibration.job else None
    if carried or draft.start.phase == Phase.PENDING:
        draft.update(calibration=calibration.model_copy(update={"calibrator_image": carried or image}))
