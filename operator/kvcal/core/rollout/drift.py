"""After a promotion: is the calibration still current for what the baseline serves? Pure like decide.

Scales are observed on the calibration data's contexts and judged against the longest context the baseline served
then (`--max-model-len`, status.calibration.servedContextTokens). Whoever owns the baseline may raise it later; K and
V on longer contexts can exceed what the scales cover and clip, and vLLM says nothing. kvcal then says so: the
CalibrationCurrent condition turns False with the two lengths and a Warning event names the fix (`kvcal
recalibrate`). A chat template other than the one promoted (vLLM's --chat-template) renders prompts unlike the
calibration data, and is reported the same way. Nothing re-rolls by itself: the promotion stands until a person
decides. (A new vLLM image or attention backend is re-verified by core.rollout.serving instead: a runtime check can
prove it, a context or a template cannot.)
"""

from kvcal.core.artifact.context import served_context
from kvcal.core.manifests import BaselineError, is_promoted
from kvcal.core.observations import DeploymentState
from kvcal.core.rollout.serving import chat_template
from kvcal.core.status.builder import Builder
from kvcal.core.status.conditions import get_condition
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import ConditionType

CONDITION: ConditionType = "CalibrationCurrent"


def watch_calibration_current(draft: Builder, spec: KVCalibrationSpec) -> None:
    """In Succeeded: CalibrationCurrent=False (and one Warning event) while the baseline serves a longer context than
    the calibration was judged against, or renders chats with another template than when it was promoted; back to
    True once neither holds."""
    baseline, calibration = draft.obs.baseline, draft.status.calibration
    if baseline is None or calibration.spec_hash is None:
        return
    if not is_promoted(baseline.manifest, draft.obs.owner, calibration.spec_hash):
        return  # reverted or replaced: core.rollout.reverts reports that
    container = spec.serving.baseline.container
    drifts = [drift for drift in (_context(draft, baseline, container), _template(draft, baseline, container)) if drift]
    present = get_condition(draft.status.conditions, CONDITION)
    if drifts:
        reason = drifts[0][0]
        message = "; ".join(text for _, text in drifts) + (
            f". Run `kvcal recalibrate {draft.obs.owner.name}`; the promotion stands until then"
        )
        if present is None or present.status != "False" or present.message != message:
            draft.event("Warning", "CalibrationNotCurrent", message)
        draft.condition(CONDITION, "False", reason, message)
    elif present is not None and present.status != "True":
        draft.condition(CONDITION, "True", "Current", "the baseline serves what was calibrated again")


def _context(draft: Builder, baseline: DeploymentState, container: str | None) -> tuple[str, str] | None:
    served = served_context(baseline, container)
    calibration = draft.status.calibration
    calibrated = calibration.served_context_tokens
    if served is None or calibrated is None or served <= calibrated:
        return None
    longest = f", its longest sample {calibration.longest_sample_tokens}" if calibration.longest_sample_tokens else ""
    return "ContextRaised", (
        f"the baseline now serves --max-model-len {served}, beyond the {calibrated} tokens the calibration was "
        f"judged against{longest}: K/V on longer contexts may exceed the scales and clip (recalibrate with data as "
        "long as the new context)"
    )


def _template(draft: Builder, baseline: DeploymentState, container: str | None) -> tuple[str, str] | None:
    promoted = draft.status.serving.chat_template
    if promoted is None:
        return None  # not recorded yet (core.rollout.serving records it)
    try:
        served = chat_template(baseline.manifest, container)
    except BaselineError:
        return None
    if served == promoted:
        return None
    return "ChatTemplateChanged", (
        f"the baseline now renders chats with {_shown(served)} instead of {_shown(promoted)} (--chat-template): "
        "prompts reach the KV cache unlike the calibration data"
    )


def _shown(template: str) -> str:
    return template or "the model's own template"
