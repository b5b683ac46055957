"""Issue #10 item 4 in the pure core: an operator upgrade never re-runs finished work (spec hash of what the user
declared, terminal phases never restart, `kvcal recalibrate`), never calibrates into what the baseline serves, and
re-verifies after the promoted baseline's vLLM image or attention backend changes."""

import json
from dataclasses import replace
from typing import Any

from kvcal.core.decide import decide
from kvcal.core.guard.inuse import output_in_use
from kvcal.core.manifests import build_promoted_baseline, calibration_job_name, verification_job_name
from kvcal.core.manifests.canary import fp8_pod_spec
from kvcal.core.manifests.common import serving_verification_job_name
from kvcal.core.observations import RECALIBRATE_ANNOTATION, Create, Delete, DeploymentState
from kvcal.core.spechash import effective_spec_hash, legacy_spec_hash, spec_hash
from kvcal.core.status.conditions import get_condition
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import (
    CalibrationStatus,
    KVCalibrationStatus,
    Phase,
    ServingStatus,
    VerificationStatus,
)
from tests.support.decide import NOW, OWNER, SPEC, baseline, job, observations, spec

P = Phase
NO_IMAGE: dict[str, Any] = {**SPEC["calibration"], "job": {"backoffLimit": 0}}  # the user names no image
H = spec_hash(spec())
VERIFIED = VerificationStatus(job=verification_job_name(OWNER.name, H), layers=30, mismatches=0)


def succeeded(calibration_hash: str = H, **fields: Any) -> KVCalibrationStatus:
    calibration = CalibrationStatus(
        job=calibration_job_name(OWNER.name, calibration_hash),
        spec_hash=calibration_hash,
        artifact="pvc://models/smollm2-fp8kv",
    )
    return KVCalibrationStatus(phase=P.SUCCEEDED, calibration=calibration, verification=VERIFIED, **fields)


def promoted(the_spec: KVCalibrationSpec, image: str | None = None, backend: str | None = None) -> DeploymentState:
    """The baseline after the promotion patch of `the_spec`, optionally moved to another image / backend."""
    state = baseline()
    manifest = state.manifest
    applied = build_promoted_baseline(OWNER, the_spec, spec_hash(the_spec), manifest)
    manifest["metadata"]["annotations"] = applied["metadata"]["annotations"]
    manifest["spec"]["template"]["spec"] = fp8_pod_spec(manifest, the_spec)  # what the API server's merge yields
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    if image:
        container["image"] = image
    if backend:
        container["env"] = [{"name": "VLLM_ATTENTION_BACKEND", "value": backend}]
    return replace(state, manifest=manifest)


def condition(status: KVCalibrationStatus, type_: str) -> tuple[str, str, str]:
    found = get_condition(status.conditions, type_)  # type: ignore[arg-type]
    assert found is not None, f"no {type_} condition"
    return found.status, found.reason, found.message


# --- the spec hash covers what the user declared ---------------------------------------------------------------


def test_operator_default_image_is_not_hashed_but_recorded() -> None:
    user_spec = spec(calibration=NO_IMAGE)
    first = decide(user_spec, KVCalibrationStatus(), observations(calibrator_image="calib:1"), NOW)
    (job_create,) = [a for a in first.actions if isinstance(a, Create) and a.manifest["kind"] == "Job"]
    assert job_create.manifest["spec"]["template"]["spec"]["containers"][0]["image"] == "calib:1"
    assert first.status.calibration.spec_hash == spec_hash(user_spec)
    assert first.status.calibration.calibrator_image == "calib:1"
    # The operator upgraded (another default image) while Calibrating: same Job, same provenance.
    running = observations(calibrator_image="calib:2", calibration_job=job(first.status.calibration.job or ""))
    again = decide(user_spec, first.status, running, NOW)
    assert again.status.phase == P.CALIBRATING and not again.actions
    assert again.status.calibration.calibrator_image == "calib:1"


def test_users_own_image_is_hashed() -> None:
    assert spec_hash(spec()) != spec_hash(spec(calibration={"job": {"image": "other:1"}}))


def test_status_recorded_by_an_older_operator_keeps_its_hash() -> None:
    """kvcal <= 0.1 wrote the default image into the spec before hashing; that hash is still recognised."""
    user_spec = spec(calibration=NO_IMAGE)
    legacy = legacy_spec_hash(user_spec, "calib:1")
    assert legacy != spec_hash(user_spec)
    assert effective_spec_hash(user_spec, legacy, "calib:1") == legacy
    assert effective_spec_hash(user_spec, legacy, "calib:2") == spec_hash(user_spec)  # really another image
    status = KVCalibrationStatus(
        phase=P.CALIBRATING,
        calibration=CalibrationStatus(job=calibration_job_name(OWNER.name, legacy), spec_hash=legacy),
    )
    obs = observations(calibrator_image="calib:1", calibration_job=job(calibration_job_name(OWNER.name, legacy)))
    d = decide(user_spec, status, obs, NOW)
    assert d.status.phase == P.CALIBRATING and not d.actions


# --- terminal phases never restart by themselves; `kvcal recalibrate` does -------------------------------------


def test_spec_change_in_a_terminal_phase_restarts_nothing() -> None:
    changed = spec(calibration={"samples": 128})
    for phase in (P.SUCCEEDED, P.ROLLED_BACK, P.FAILED):
        start = succeeded().model_copy(update={"phase": phase})
        d = decide(changed, start, observations(baseline=promoted(spec())), NOW)
        assert d.status.phase == phase and not [a for a in d.actions if not isinstance(a, Create)]
        status, reason, message = condition(d.status, "SpecCurrent")
        assert (status, reason) == ("False", "SpecChanged")
        assert f"kvcal recalibrate {OWNER.name}" in message and H[:8] in message
        assert ("new spec.calibration.output" in message) == (phase == P.SUCCEEDED)
        assert [e.reason for e in d.events] == ["SpecChanged"]
        assert not decide(changed, d.status, observations(baseline=promoted(spec())), NOW).events  # said once


def test_reverting_the_spec_clears_spec_current() -> None:
    changed = decide(spec(calibration={"samples": 128}), succeeded(), observations(baseline=baseline()), NOW)
    reverted = decide(spec(), changed.status, observations(baseline=baseline()), NOW)
    assert condition(reverted.status, "SpecCurrent")[:2] == ("True", "SpecMatches") and not reverted.events


def test_recalibrate_annotation_starts_over_from_a_terminal_phase() -> None:
    gates = {RECALIBRATE_ANNOTATION: "2026-01-02T03:04:05Z"}
    d = decide(spec(), succeeded(), observations(gates=gates), NOW)
    assert d.status.phase == P.PENDING and d.status.calibration == CalibrationStatus()
    assert d.status.serving == ServingStatus()
    assert RECALIBRATE_ANNOTATION in d.cleared_annotations
    assert Delete("Job", calibration_job_name(OWNER.name, H)) in d.actions
    assert d.events[-1].reason == "Recalibrate"


def test_recalibrate_annotation_is_ignored_while_active() -> None:
    start = KVCalibrationStatus(phase=P.CALIBRATING, calibration=CalibrationStatus(job="j", spec_hash=H))
    gates = {RECALIBRATE_ANNOTATION: "x"}
    d = decide(spec(), start, observations(gates=gates, calibration_job=job("j")), NOW)
    assert d.status.phase == P.CALIBRATING and [e.reason for e in d.events] == ["RecalibrateIgnored"]
    assert RECALIBRATE_ANNOTATION in d.cleared_annotations


# --- never calibrate into what the baseline serves --------------------------------------------------------------


def test_output_the_promoted_baseline_serves_is_refused() -> None:
    d = decide(spec(), KVCalibrationStatus(), observations(baseline=promoted(spec())), NOW)
    assert d.status.phase == P.PENDING and not d.actions
    status, reason, message = condition(d.status, "Calibrated")
    assert (status, reason) == ("False", "OutputInUse")
    assert "choose a new spec.calibration.output" in message and "PersistentVolumeClaim models" in message
    assert [e.reason for e in d.events] == ["OutputInUse"]


def test_a_vanished_calibration_job_is_not_recreated_into_the_served_output() -> None:
    start = KVCalibrationStatus(phase=P.CALIBRATING, calibration=CalibrationStatus(job="j", spec_hash=H))
    d = decide(spec(), start, observations(baseline=promoted(spec()), calibration_job=None), NOW)
    assert d.status.phase == P.CALIBRATING and not d.actions
    assert condition(d.status, "Calibrated")[:2] == ("False", "OutputInUse")


def test_output_guard_cases() -> None:
    served = baseline().manifest  # serves /models/smollm2 from PVC models, mounted whole at /models
    assert output_in_use(spec(calibration={"output": "pvc://models/smollm2-fp8kv"}), served) is None  # a sibling
    # The served folder itself (the model declares another source: output == model.source is refused earlier).
    moved = {"source": "pvc://models/base"}
    assert output_in_use(spec(model=moved, calibration={"output": "pvc://models/smollm2"}), served)
    assert output_in_use(spec(calibration={"output": "pvc://models/smollm2/sub"}), served)
    assert output_in_use(spec(calibration={"output": "pvc://models"}), served)  # contains it
    assert output_in_use(spec(calibration={"output": "pvc://other/smollm2"}), served) is None
    assert output_in_use(spec(calibration={"output": "hostpath:///models/smollm2"}), served) is None  # not the PVC
    host = promoted(spec(calibration={"output": "hostpath:///data/out"})).manifest
    assert output_in_use(spec(calibration={"output": "hostpath:///data/out/"}), host)
    assert output_in_use(spec(calibration={"output": "hostpath:///data/out2"}), host) is None


# --- after a promotion: re-verify when the baseline's runtime changes -------------------------------------------


def test_promotion_records_the_runtime_it_verified() -> None:
    d = decide(spec(), succeeded(), observations(baseline=promoted(spec())), NOW)
    assert d.status.serving.image == "vllm/vllm-openai:v0.32.0" and d.status.serving.verification == VERIFIED
    assert condition(d.status, "ServingVerified")[:2] == ("True", "ScalesLoaded")
    assert not d.actions and d.requeue_after is not None


def test_new_baseline_image_reverifies_in_that_image() -> None:
    start = decide(spec(), succeeded(), observations(baseline=promoted(spec())), NOW).status
    moved = promoted(spec(), image="vllm/vllm-openai:v0.33.0", backend="FLASHINFER")
    d = decide(spec(), start, observations(baseline=moved), NOW)
    name = serving_verification_job_name(OWNER.name, H, "vllm/vllm-openai:v0.33.0", "FLASHINFER")
    (create,) = d.actions
    assert isinstance(create, Create) and create.manifest["metadata"]["name"] == name
    container = create.manifest["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "vllm/vllm-openai:v0.33.0"
    assert container["command"][-2:] == ["--attention-backend", "FLASHINFER"]
    assert container["command"][2] == "/kvcal/pvc/models/smollm2-fp8kv"  # the promoted checkpoint
    assert condition(d.status, "ServingVerified")[:2] == ("Unknown", "Reverifying")
    assert d.status.phase == P.SUCCEEDED and [e.reason for e in d.events] == ["Reverifying"]

    summary = json.dumps({"ok": True, "layers": 30, "mismatches": 0})
    done = decide(
        spec(), d.status, observations(baseline=moved, serving_verification_job=job(name, "Succeeded", summary)), NOW
    )
    status, reason, message = condition(done.status, "ServingVerified")
    assert (status, reason) == ("True", "ScalesLoaded") and "30 layers" in message and "v0.33.0" in message
    assert (
        done.status.serving.image == "vllm/vllm-openai:v0.33.0"
        and done.status.serving.attention_backend == "FLASHINFER"
    )
    assert not decide(spec(), done.status, observations(baseline=moved), NOW).actions  # verified once

    bad = json.dumps({"ok": False, "layers": 30, "mismatches": 30, "problems": ["k_scale collapsed"]})
    failed = decide(
        spec(), d.status, observations(baseline=moved, serving_verification_job=job(name, "Failed", bad)), NOW
    )
    status, reason, message = condition(failed.status, "ServingVerified")
    assert (status, reason) == ("False", "ScalesMismatch") and "30 mismatches" in message
    assert "roll the baseline back to vllm/vllm-openai:v0.32.0" in message
    assert [e.type for e in failed.events] == ["Warning"] and failed.status.phase == P.SUCCEEDED


def test_a_baseline_no_longer_promoted_is_not_watched() -> None:
    d = decide(spec(), succeeded(), observations(baseline=baseline()), NOW)
    assert d.status.serving == ServingStatus() and not d.actions


def calibrated_for(tokens: int) -> KVCalibrationStatus:
    """Succeeded, with the served context the calibration was judged against."""
    status = succeeded()
    return status.model_copy(
        update={"calibration": status.calibration.model_copy(update={"served_context_tokens": tokens})}
    )


def with_max_model_len(state: DeploymentState, tokens: str) -> DeploymentState:
    manifest = state.manifest
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["args"] = [*container["args"], "--max-model-len", tokens]
    return replace(state, manifest=manifest)


def test_a_context_raised_past_the_calibrated_one_is_reported_once_and_nothing_rerolls() -> None:
    calibrated = calibrated_for(8192)
    start = decide(spec(), calibrated, observations(baseline=with_max_model_len(promoted(spec()), "8192")), NOW).status
    assert get_condition(start.conditions, "CalibrationCurrent") is None  # within what was calibrated: nothing to say

    raised = with_max_model_len(promoted(spec()), "32k")
    d = decide(spec(), start, observations(baseline=raised), NOW)
    status, reason, message = condition(d.status, "CalibrationCurrent")
    assert (status, reason) == ("False", "ContextRaised")
    assert "--max-model-len 32000" in message and "8192" in message and f"kvcal recalibrate {OWNER.name}" in message
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "CalibrationNotCurrent")]
    assert d.status.phase == P.SUCCEEDED and not d.actions  # no re-rollout, no Job
    again = decide(spec(), d.status, observations(baseline=raised), NOW)
    assert not again.events and condition(again.status, "CalibrationCurrent")[:2] == ("False", "ContextRaised")

    lowered = decide(spec(), again.status, observations(baseline=with_max_model_len(promoted(spec()), "4096")), NOW)
    assert condition(lowered.status, "CalibrationCurrent")[:2] == ("True", "Current")


def test_an_unknown_calibrated_context_or_a_reverted_baseline_says_nothing() -> None:
    raised = with_max_model_len(promoted(spec()), "32768")
    unknown = decide(spec(), succeeded(), observations(baseline=raised), NOW)  # no servedContextTokens recorded
    assert get_condition(unknown.status.conditions, "CalibrationCurrent") is None
    reverted = decide(spec(), calibrated_for(8192), observations(baseline=with_max_model_len(baseline(), "32768")), NOW)
    assert get_condition(reverted.status.conditions, "CalibrationCurrent") is None


def with_chat_template(state: DeploymentState, template: str) -> DeploymentState:
    manifest = state.manifest
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["args"] = [*container["args"], "--chat-template", template]
    return replace(state, manifest=manifest)


def test_a_chat_template_changed_after_the_promotion_is_reported_and_nothing_rerolls() -> None:
    """The promoting pass records the template the baseline serves (the model's own here); another one later makes
    CalibrationCurrent False (reason ChatTemplateChanged) with one Warning; restoring it makes it True again."""
    start = decide(spec(), succeeded(), observations(baseline=promoted(spec())), NOW).status
    assert start.serving.chat_template == ""
    changed = with_chat_template(promoted(spec()), "/templates/tools.jinja")
    d = decide(spec(), start, observations(baseline=changed), NOW)
    status, reason, message = condition(d.status, "CalibrationCurrent")
    assert (status, reason) == ("False", "ChatTemplateChanged")
    assert "/templates/tools.jinja instead of the model's own template" in message
    assert f"kvcal recalibrate {OWNER.name}" in message
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "CalibrationNotCurrent")]
    assert d.status.phase == P.SUCCEEDED and not d.actions
    restored = decide(spec(), d.status, observations(baseline=promoted(spec())), NOW)
    assert condition(restored.status, "CalibrationCurrent")[:2] == ("True", "Current")


def test_a_promotion_from_before_the_template_was_recorded_starts_watching_from_now() -> None:
    """Upgraded from a kvcal that did not record it: what the baseline serves now is taken as promoted."""
    old = decide(spec(), succeeded(), observations(baseline=promoted(spec())), NOW).status
    old = old.model_copy(update={"serving": old.serving.model_copy(update={"chat_template": None})})
    served = with_chat_template(promoted(spec()), "/templates/tools.jinja")
    d = decide(spec(), old, observations(baseline=served), NOW)
    assert d.status.serving.chat_template == "/templates/tools.jinja"
    assert get_condition(d.status.conditions, "CalibrationCurrent") is None and not d.events
