"""Hash of the calibration-relevant part of a KVCalibration spec.

It decides whether a spec change reruns the calibration. Included: the model (source, revision) and the whole
calibration block (dataset, samples, sequence length, holdout, seed, strategy, observer, pipeline, output) plus the
calibrator image (another image may compute other scales). Excluded: the Job's scheduling fields (resources,
nodeSelector, tolerations, activeDeadlineSeconds, backoffLimit: they change where and how long it runs, not what it
computes), serving, analysis thresholds and promotion mode (they apply to the next decision, without recalibrating).
"""

import hashlib
import json

from kvcal.models.spec import KVCalibrationSpec

_SCHEDULING_FIELDS = {"resources", "nodeSelector", "tolerations", "activeDeadlineSeconds", "backoffLimit"}


def calibration_inputs(spec: KVCalibrationSpec) -> dict[str, object]:
    calibration = spec.calibration.model_dump(by_alias=True, mode="json")
    job = calibration.pop("job")
    calibration["image"] = job.get("image")
    model = spec.model.model_dump(by_alias=True, mode="json")
    assert not (_SCHEDULING_FIELDS & calibration.keys())
    return {"model": model, "calibration": calibration}


def spec_hash(spec: KVCalibrationSpec) -> str:
    """Full sha256 hex of the canonical JSON of `calibration_inputs` (names use the first 8 characters)."""
    canonical = json.dumps(calibration_inputs(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
