"""Succeeded: the promotion is watched, not left. A revert is reported (core.rollout.reverts); while the promotion
stands, a change of the baseline's vLLM image or attention backend re-runs the artifact machine's verification Job in
the new runtime (core.rollout.serving asks core.artifact.verification for it), and a context raised past the
calibrated one is reported (core.rollout.drift). The rollout machine owns the watch
because only it knows what was promoted where; the artifact machine owns what a verification is."""

from kvcal.core.rollout.drift import watch_calibration_current
from kvcal.core.rollout.reverts import watch_promotion
from kvcal.core.rollout.serving import watch_serving
from kvcal.core.status.builder import Builder
from kvcal.models.spec import KVCalibrationSpec


def watch_promoted(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    draft.wait(draft.status.message or "", None)
    if watch_promotion(draft, spec):
        watch_serving(draft, spec)
        watch_calibration_current(draft, spec)
