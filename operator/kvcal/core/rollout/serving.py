"""After a promotion: the scales are re-verified when the baseline's vLLM image or attention backend changes.

A new vLLM may load (or ignore, or collapse per head) the calibrated scales differently, and it logs nothing when it
does; so a Succeeded object watches what its promoted baseline runs, and on a change runs the verification Job (the
runtime read-back) again in the new image, with the new backend, and reports it in the ServingVerified condition.
The image and backend last verified are recorded in status.serving. Pure like decide.
"""

from kvcal import vllm_flags
from kvcal.core.artifact.record import checkpoint
from kvcal.core.artifact.verification import serving_verification_job, verification_result
from kvcal.core.manifests import BaselineError, Manifest, is_promoted
from kvcal.core.manifests.canary import baseline_container_index
from kvcal.core.manifests.common import serving_verification_job_name
from kvcal.core.observations import Create
from kvcal.core.status.builder import Builder
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import ServingStatus, VerificationStatus

# The baseline's watch events wake the operator (handlers.operator); this is the floor when none comes.
WATCH_SECONDS = 300.0
RUNNING_POLL_SECONDS = 30.0
BACKEND_ENV = "VLLM_ATTENTION_BACKEND"


def serving_runtime(baseline: Manifest, container: str | None) -> tuple[str, str | None]:
    """(image, attention backend) of the baseline's vLLM container; the backend from its args, else its env."""
    pod = baseline["spec"]["template"]["spec"]
    vllm = pod["containers"][baseline_container_index(baseline, container)]
    args = [str(a) for a in [*(vllm.get("command") or []), *(vllm.get("args") or [])]]
    backend = vllm_flags.attention_backend(args)
    if backend is None:
        backend = next((str(e.get("value")) for e in vllm.get("env") or [] if e.get("name") == BACKEND_ENV), None)
    return str(vllm.get("image", "")), backend


def chat_template(baseline: Manifest, container: str | None) -> str:
    """The baseline vLLM's --chat-template ('' when it serves the model's own)."""
    vllm = baseline["spec"]["template"]["spec"]["containers"][baseline_container_index(baseline, container)]
    args = [str(a) for a in [*(vllm.get("command") or []), *(vllm.get("args") or [])]]
    given = vllm_flags.find(args, vllm_flags.CHAT_TEMPLATE)
    return given.value if given else ""


def _describe(image: str, backend: str | None) -> str:
    return f"{image}" + (f" (attention backend {backend})" if backend else "")


def watch_serving(draft: Builder, spec: KVCalibrationSpec) -> None:
    """In Succeeded: record what the promoted baseline runs; re-verify when its image or attention backend changes."""
    baseline, recorded_hash = draft.obs.baseline, draft.status.calibration.spec_hash
    if baseline is None or recorded_hash is None or not is_promoted(baseline.manifest, draft.obs.owner, recorded_hash):
        return  # deleted, or no longer serving this calibration: nothing of ours runs there
    try:
        image, backend = serving_runtime(baseline.manifest, spec.serving.baseline.container)
        template = chat_template(baseline.manifest, spec.serving.baseline.container)
    except BaselineError:
        return
    serving = draft.status.serving
    if serving.image is not None and serving.chat_template is None:  # promoted before kvcal recorded it: from now
        serving = serving.model_copy(update={"chat_template": template})
        draft.update(serving=serving)
    if serving.image is None:  # the promoting pass: the canary's verification ran in this image
        verified = draft.status.verification
        draft.update(
            serving=ServingStatus(image=image, attention_backend=backend, verification=verified, chat_template=template)
        )
        message = f"{_describe(image, backend)}: the verification before the canary loaded the calibrated scales"
        message += f" of {verified.layers} layers, {verified.mismatches or 0} mismatches"
        draft.condition("ServingVerified", "True", "ScalesLoaded", message)
        draft.requeue = WATCH_SECONDS
        return
    if (image, backend) == (serving.image, serving.attention_backend):
        draft.requeue = WATCH_SECONDS
        return
    name = serving_verification_job_name(draft.obs.owner.name, recorded_hash, image, backend)
    job = draft.obs.serving_verification_job
    change = f"the baseline now runs {_describe(image, backend)} (verified: {_describe(serving.image, None)}"
    change += f", {serving.attention_backend or 'default backend'})"
    if job is None or job.name != name:
        output = checkpoint(draft.status, spec.calibration.output)
        job_manifest = serving_verification_job(
            draft.obs.owner, spec, recorded_hash, output, baseline.manifest, (image, backend), name
        )
        draft.do(Create(job_manifest))
        draft.update(serving=serving.model_copy(update={"verification": VerificationStatus(job=name)}))
        draft.condition("ServingVerified", "Unknown", "Reverifying", f"{change}: verification Job {name} is running")
        draft.event("Normal", "Reverifying", f"{change}: re-verifying the calibrated scales (Job {name})")
        draft.requeue = RUNNING_POLL_SECONDS
        return
    if job.state == "Running":
        draft.requeue = RUNNING_POLL_SECONDS
        return
    verification, ok = verification_result(job)
    draft.update(
        serving=ServingStatus(
            image=image, attention_backend=backend, verification=verification, chat_template=serving.chat_template
        )
    )
    draft.requeue = WATCH_SECONDS
    if ok:
        message = f"{_describe(image, backend)}: vLLM loaded the calibrated scales of {verification.layers} layers"
        draft.condition("ServingVerified", "True", "ScalesLoaded", f"{message}, 0 mismatches")
        draft.event("Normal", "ServingVerified", f"{message}, 0 mismatches")
        return
    why = verification.message or "no message"
    mismatches = f"{verification.mismatches} mismatches" if verification.mismatches is not None else "no read-back"
    message = (
        f"{_describe(image, backend)} does not serve the calibrated scales as verified ({mismatches}): {why}; "
        f"roll the baseline back to {serving.image} or recalibrate (kvcal recalibrate {draft.obs.owner.name})"
    )
    draft.condition(
        "ServingVerified", "False", "ScalesMismatch" if verification.mismatches else "VerificationFailed", message
    )
    draft.event("Warning", "ServingVerificationFailed", message)
