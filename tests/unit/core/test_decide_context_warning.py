"""Calibration far below the served context: the summary's warning reaches status, condition and an event."""

import json

import pytest

from kvcal.calibrator.config import CalibrationConfig
from kvcal.calibrator.coverage import length_coverage
from kvcal.core.decide import decide
from kvcal.core.observations import Create, DeploymentState
from tests.support.decide import CALIB, NOW, SUMMARY, P, baseline_manifest, job, observations, status
from tests.support.decide import SPEC_MODEL as SPEC


def test_context_warning_reaches_status_condition_and_a_warning_event() -> None:
    warning = length_coverage([512], 8192, "max_position_embeddings", 512, truncated=3).warning
    assert warning
    summary = json.dumps(
        {**json.loads(SUMMARY), "longestSampleTokens": 512, "servedContextTokens": 8192, "contextWarning": warning}
    )
    d = decide(SPEC, status(P.CALIBRATING), observations(calibration_job=job(CALIB, "Succeeded", summary)), NOW)
    c = d.status.calibration
    assert (c.longest_sample_tokens, c.served_context_tokens, c.context_warning) == (512, 8192, warning)
    assert d.status.phase == P.VERIFYING  # a warning, not a failure
    assert [(e.type, e.reason, e.message) for e in d.events if e.reason == "CalibrationContextShort"] == [
        ("Warning", "CalibrationContextShort", warning)
    ]
    calibrated = next(x for x in d.status.conditions if x.type == "Calibrated")
    assert calibrated.status == "True" and warning in calibrated.message


def test_no_warning_no_event() -> None:
    d = decide(SPEC, status(P.CALIBRATING), observations(calibration_job=job(CALIB, "Succeeded", SUMMARY)), NOW)
    assert d.status.calibration.context_warning is None
    assert not [e for e in d.events if e.reason == "CalibrationContextShort"]


@pytest.mark.parametrize(
    ("args", "served"),
    [
        (["--max-model-len", "2048"], 2048),
        (["--max-model-len=32k"], 32000),  # vLLM's human-readable ints: k decimal, K binary
        (["--max_model_len", "32K"], 32768),
        (["--max-model-len", "auto"], None),  # vLLM then serves the model's own limit: the calibrator reads it
        (["--max-model-len", "-1"], None),
        (["--max-model-len", "1024", "--max-model-len", "4096"], 4096),  # the last one wins, as in argparse
        ([], None),
    ],
)
def test_calibration_config_carries_the_baselines_max_model_len(args: list[str], served: int | None) -> None:
    manifest = baseline_manifest()
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["args"] = [*container["args"], *args]
    obs = observations(baseline=DeploymentState(manifest=manifest, replicas=2, observed_generation=1))
    d = decide(SPEC, status(P.PENDING), obs, NOW)
    config_map = next(a.manifest for a in d.actions if isinstance(a, Create) and a.manifest["kind"] == "ConfigMap")
    config = json.loads(config_map["data"]["config.json"])
    assert config.get("maxModelLen") == served
    if served:
        assert CalibrationConfig.model_validate(config).max_model_len == served  # the calibrator reads it
