"""The verification Job's verdict, read one way for the verification before the canary and after a promotion."""

import json
from typing import Any

from kvcal.core.manifests import Manifest, Owner, build_verification_job
from kvcal.core.manifests.canary import baseline_container_index
from kvcal.core.observations import JobState
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import VerificationStatus


def verification_result(job: JobState) -> tuple[VerificationStatus, bool]:
    """The verification Job's summary (its termination message) and whether vLLM loaded every scale."""
    try:
        parsed = json.loads(job.message)
    except ValueError:
        parsed = {}
    summary: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
    raw_problems = summary.get("problems")
    problems: list[Any] = raw_problems if isinstance(raw_problems, list) else []
    verification = VerificationStatus(
        job=job.name,
        layers=summary.get("layers") if isinstance(summary.get("layers"), int) else None,
        mismatches=summary.get("mismatches") if isinstance(summary.get("mismatches"), int) else None,
        message=("; ".join(str(p) for p in problems) or job.message.strip() or job.reason)[:1024] or None,
    )
    ok = job.state == "Succeeded" and summary.get("ok") is True and not verification.mismatches
    return verification, ok


def serving_verification_job(
    owner: Owner,
    spec: KVCalibrationSpec,
    spec_hash: str,
    checkpoint: str,
    baseline: Manifest,
    runtime: tuple[str, str | None],
    name: str,
) -> Manifest:
    """The verification Job of a promoted checkpoint in the baseline's runtime now (its vLLM image, attention
    backend): what core.rollout.watch asks for when that runtime changes."""
    image, backend = runtime
    canary = spec.serving.canary.model_copy(update={"attention_backend": backend})
    serving = spec.serving.model_copy(update={"canary": canary})
    calibration = spec.calibration.model_copy(update={"output": checkpoint})
    promoted = spec.model_copy(update={"serving": serving, "calibration": calibration})
    pod = baseline["spec"]["template"]["spec"]
    container = pod["containers"][baseline_container_index(baseline, spec.serving.baseline.container)]
    return build_verification_job(owner, promoted, spec_hash, {**container, "image": image}, pod, name=name)
