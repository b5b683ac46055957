"""spec.serving.canary.protectedLayers through decide(): the calibration summary's sensitive layers reach status,
and with fromReport they (plus the listed layers) become one --kv-cache-dtype-skip-layers list on the verification
Job, the canary and the promoted baseline; without a summary that names them, nothing is built."""

import json
from typing import Any

from kvcal.core.decide import decide
from kvcal.core.manifests import build_verification_job, calibration_job_name
from kvcal.core.observations import Apply, ApplyOwnedFields, Create
from kvcal.core.spechash import spec_hash
from kvcal.models.status import CalibrationStatus, KVCalibrationStatus, Phase
from tests.support.decide import (
    CANARY,
    NOW,
    OWNER,
    SUMMARY,
    baseline,
    baseline_manifest,
    canary,
    job,
    observations,
    spec,
    status,
)

FROM_REPORT = spec(
    serving={
        "baseline": {"deployment": "llm", "service": "llm"},
        "canary": {"protectedLayers": {"layers": [29], "fromReport": True}},
    }
)
H = spec_hash(FROM_REPORT)
CALIB = calibration_job_name(OWNER.name, H)


def _skip_list(argv: list[str]) -> list[str]:
    assert argv.count("--kv-cache-dtype-skip-layers") == 1, argv
    values = argv[argv.index("--kv-cache-dtype-skip-layers") + 1 :]
    return values[: next((i for i, v in enumerate(values) if v.startswith("-")), len(values))]


def _argv(manifest: dict[str, Any]) -> list[str]:
    pod = manifest["spec"]["template"]["spec"]
    container = pod["containers"][0]
    return [*container.get("command", []), *container.get("args", [])]


def _calibrated() -> KVCalibrationStatus:
    summary = json.dumps(json.loads(SUMMARY) | {"sensitiveLayers": [3, 0]})
    start = status(Phase.CALIBRATING, calibration=CalibrationStatus(job=CALIB, spec_hash=H))
    d = decide(FROM_REPORT, start, observations(calibration_job=job(CALIB, "Succeeded", summary)), NOW)
    assert d.status.phase == Phase.VERIFYING
    assert d.status.calibration.sensitive_layers == [3, 0]
    return d.status


def test_spec_hash_is_unchanged_by_the_new_fields_at_their_defaults() -> None:
    # As kvcal before queryScales computed it (commit 5f8f13a): an upgrade must not restart calibrations.
    assert spec_hash(spec()) == "129247129612e352d9557cf0ae45656cf341a483b567da569e7c92ee026ad3d5"
    assert spec_hash(spec(calibration={**spec().calibration.model_dump(by_alias=True), "queryScales": True})) != (
        spec_hash(spec())
    )


def test_report_layers_reach_the_verification_job_the_canary_and_the_promotion() -> None:
    verifying = _calibrated()
    d = decide(FROM_REPORT, verifying, observations(baseline=baseline()), NOW)
    verify_job = next(a.manifest for a in d.actions if isinstance(a, Create) and a.manifest["kind"] == "Job")
    assert _skip_list(verify_job["spec"]["template"]["spec"]["containers"][0]["command"]) == ["0", "3", "29"]

    deploying = verifying.model_copy(update={"phase": Phase.DEPLOYING})
    d = decide(FROM_REPORT, deploying, observations(baseline=baseline()), NOW)
    deployment = next(a.manifest for a in d.actions if isinstance(a, Apply) and a.manifest["kind"] == "Deployment")
    assert deployment["metadata"]["name"] == CANARY
    assert _skip_list(_argv(deployment)) == ["0", "3", "29"]

    promoting = verifying.model_copy(update={"phase": Phase.PROMOTING})
    d = decide(FROM_REPORT, promoting, observations(baseline=baseline(), canary=canary()), NOW)
    owned = next(a for a in d.actions if isinstance(a, ApplyOwnedFields)).manifest
    assert _skip_list(_argv(owned)) == ["0", "3", "29"]


def test_from_report_without_sensitive_layers_builds_nothing_and_says_why() -> None:
    verifying = status(Phase.VERIFYING, calibration=CalibrationStatus(job=CALIB, spec_hash=H))
    d = decide(FROM_REPORT, verifying, observations(baseline=baseline()), NOW)
    assert not [a for a in d.actions if isinstance(a, Create | Apply)]
    assert "protectedLayers.fromReport" in (d.status.message or ""), d.status.message


def test_query_scales_and_listed_layers_reach_the_verify_command() -> None:
    asked = spec(
        calibration={**spec().calibration.model_dump(by_alias=True), "queryScales": True},
        serving={"baseline": {"deployment": "llm", "service": "llm"}, "canary": {"protectedLayers": {"layers": [5]}}},
    )
    pod = baseline_manifest()["spec"]["template"]["spec"]
    command = build_verification_job(OWNER, asked, spec_hash(asked), pod["containers"][0], pod)["spec"]["template"][
        "spec"
    ]["containers"][0]["command"]
    assert "--query-scales" in command and _skip_list(command) == ["5"]
