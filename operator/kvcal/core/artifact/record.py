"""The verified-artifact record: the one thing the artifact machine hands the rollout machine.

A checkpoint is verified when the calibration Job wrote it from these calibration inputs (their spec hash) and vLLM
loaded every one of its scales (the verification Job's read-back, zero mismatches). The rollout machine deploys,
promotes and watches exactly this checkpoint, and nothing without it.
"""

from dataclasses import dataclass

from kvcal.models.status import KVCalibrationStatus


@dataclass(frozen=True)
class VerifiedArtifact:
    spec_hash: str  # the calibration inputs it was made from: names the canary's promotion marker
    checkpoint: str  # storage URI of the calibrated checkpoint (status.calibration.artifact)
    layers: int | None  # layers whose scales vLLM loaded


def checkpoint(status: KVCalibrationStatus, output: str) -> str:
    """Where the calibrated checkpoint is: as the calibrator recorded it, else the spec's calibration.output."""
    return status.calibration.artifact or output


def verified_artifact(status: KVCalibrationStatus, output: str) -> VerifiedArtifact | None:
    """The record in `status`, or None while there is none (not calibrated, not verified, or a mismatch).
    `output` is the spec's calibration.output, for statuses written before the artifact was recorded."""
    calibration, verification = status.calibration, status.verification
    if calibration.spec_hash is None or verification.mismatches != 0:
        return None
    return VerifiedArtifact(calibration.spec_hash, checkpoint(status, output), verification.layers)
