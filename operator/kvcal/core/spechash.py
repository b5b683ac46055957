"""Hash of the calibration-relevant part of a KVCalibration spec.

It decides whether a spec change reruns the calibration. Included: the model (source, revision) and the whole
calibration block (dataset, samples, sequence length, holdout, seed, strategy, observer, pipeline, output) plus the
calibrator image the USER declared (another image may compute other scales). Never an operator default: the
operator's own calibrator image (chart value jobImages.calibrator) is provenance, recorded in
status.calibration.calibratorImage, so upgrading the operator never restarts a calibration. Excluded: the Job's
scheduling fields (resources, nodeSelector, tolerations, activeDeadlineSeconds, backoffLimit: they change where and
how long it runs, not what it computes), serving, analysis thresholds and promotion mode (they apply to the next
decision, without recalibrating).
"""

import hashlib
import json

from kvcal.models.spec import KVCalibrationSpec

_SCHEDULING_FIELDS = {"resources", "nodeSelector", "tolerations", "activeDeadlineSeconds", "backoffLimit"}


def calibration_inputs(spec: KVCalibrationSpec) -> dict[str, object]:
    calibration = spec.calibration.model_dump(by_alias=True, mode="json")
    job = calibration.pop("job")
    calibration["image"] = job.get("image")
    if not calibration.get("queryScales"):  # added later: off, it leaves the hash of every existing spec as it was
        calibration.pop("queryScales", None)
    model = spec.model.model_dump(by_alias=True, mode="json")
    assert not (_SCHEDULING_FIELDS & calibration.keys())
    return {"model": model, "calibration": calibration}


def legacy_spec_hash(spec: KVCalibrationSpec, default_image: str | None) -> str:
    """The hash kvcal <= 0.1 recorded: the operator's default image was written into the spec before hashing."""
    if spec.calibration.job.image or not default_image:
        return spec_hash(spec)
    job = spec.calibration.job.model_copy(update={"image": default_image})
    return spec_hash(spec.model_copy(update={"calibration": spec.calibration.model_copy(update={"job": job})}))


def effective_spec_hash(spec: KVCalibrationSpec, recorded: str | None, default_image: str | None) -> str:
    """The identity of the calibration inputs: a status recorded by an older operator keeps its hash (and so its
    children's names) when only the way the default image was hashed differs."""
    current = spec_hash(spec)
    if recorded is not None and recorded != current and recorded == legacy_spec_hash(spec, default_image):
        return recorded
    return current


def spec_hash(spec: KVCalibrationSpec) -> str:
    """Full sha256 hex of the canonical JSON of `calibration_inputs` (names use the first 8 characters)."""
    canonical = json.dumps(calibration_inputs(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
