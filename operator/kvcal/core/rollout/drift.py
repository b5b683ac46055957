"""After a promotion: is the calibration still current for what the baseline serves? Pure like decide.

Scales are observed on the calibration data's contexts and judged against the longest context the baseline served
then (`--max-model-len`, status.calibration.servedContextTokens). Whoever owns the baseline may raise it later; K and
V on longer contexts can exceed what the scales cover and clip, and vLLM says nothing. kvcal then says so: the
CalibrationCurrent condition turns False with the two lengths and a Warning event names the fix (`kvcal
recalibrate`). Nothing re-rolls by itself: the promotion stands until a person decides. (A new vLLM image or
attention backend is re-verified by core.rollout.serving instead: a runtime check can prove it, a context cannot.)
"""

from kvcal.core.artifact.context import served_context
from kvcal.core.manifests import is_promoted
from kvcal.core.status.builder import Builder
from kvcal.core.status.conditions import get_condition
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import ConditionType

CONDITION: ConditionType = "CalibrationCurrent"


def watch_context(draft: Builder, spec: KVCalibrationSpec) -> None:
    """In Succeeded: CalibrationCurrent=False (and one Warning event) while the baseline serves a longer context
    than the calibration was judged against; back to True once it no longer does."""
    baseline, calibration = draft.obs.baseline, draft.status.calibration
    if baseline is None or calibration.spec_hash is None:
        return
    if not is_promoted(baseline.manifest, draft.obs.owner, calibration.spec_hash):
        return  # reverted or replaced: core.rollout.reverts reports that
    served = served_context(baseline, spec.serving.baseline.container)
    calibrated = calibration.served_context_tokens
    present = get_condition(draft.status.conditions, CONDITION)
    if served is not None and calibrated is not None and served > calibrated:
        longest = (
            f", its longest sample {calibration.longest_sample_tokens}" if calibration.longest_sample_tokens else ""
        )
        message = (
            f"the baseline now serves --max-model-len {served}, beyond the {calibrated} tokens the calibration was "
            f"judged against{longest}: K/V on longer contexts may exceed the scales and clip. Run `kvcal recalibrate "
            f"{draft.obs.owner.name}` (with data as long as the new context); the promotion stands until then"
        )
        if present is None or present.status != "False" or present.message != message:
            draft.event("Warning", "CalibrationNotCurrent", message)
        draft.condition(CONDITION, "False", "ContextRaised", message)
    elif present is not None and present.status != "True":
        draft.condition(CONDITION, "True", "Current", "the baseline's context is back within the calibrated one")
