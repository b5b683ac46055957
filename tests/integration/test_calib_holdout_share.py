"""The held-out report scores holdoutFraction's share of the samples used, however large the dataset: its four passes
(BF16, FP8 at 1.0, per tensor, per head) stay a bounded multiple of the calibration pass.

Before, every record the seeded split held out was scored: a KVCalibration at its defaults (512 samples,
holdoutFraction 0.1) on a 1,200-record dataset scored 120 held-out prompts four times against 512 calibration prompts,
and the report's cost grew with the dataset, not with the calibration.
Here: the operator's own calibrator config (build_calibration_configmap's content) and the real tokenizer.
"""

import math
from pathlib import Path

import pytest

from kvcal.calibrator.config import CalibrationConfig
from kvcal.calibrator.run import plan_data
from kvcal.core.manifests.jobs import calibration_config
from kvcal.demo import CALIBRATION_SET
from kvcal.models.spec import KVCalibrationSpec

pytestmark = pytest.mark.model

RECORDS = 1200


def operator_config(tmp_path: Path, model_dir: Path, calibration: dict[str, object]) -> CalibrationConfig:
    """The config file the operator's calibration Job reads, its in-container paths pointed here."""
    spec = KVCalibrationSpec.model_validate(
        {
            "model": {"source": "pvc://models/smollm2"},
            "calibration": {
                "dataset": {"source": "pvc://models/prompts.jsonl"},
                "output": "pvc://models/smollm2-fp8kv",
                **calibration,
            },
            "serving": {"baseline": {"deployment": "llm", "service": "llm"}},
        }
    )
    bundled = CALIBRATION_SET.read_text(encoding="utf-8").splitlines()
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("\n".join(bundled[i % len(bundled)] for i in range(RECORDS)) + "\n", encoding="utf-8")
    config = calibration_config(spec) | {"modelDir": str(model_dir), "data": str(dataset), "out": str(tmp_path / "o")}
    return CalibrationConfig.model_validate(config)


@pytest.mark.parametrize(
    ("calibration", "calibration_samples", "held_out"),
    [
        ({}, 512, math.ceil(512 / 9)),  # the CRD's defaults: 512 samples, holdoutFraction 0.1
        ({"samples": 64, "holdoutFraction": 0.2}, 64, 16),
        ({"samples": 40, "holdoutFraction": 0.5}, 40, 40),
    ],
)
def test_report_scores_holdout_fraction_of_the_samples_used(
    demo_model_dir: Path, tmp_path: Path, calibration: dict[str, object], calibration_samples: int, held_out: int
) -> None:
    from transformers import AutoTokenizer

    config = operator_config(tmp_path, demo_model_dir, calibration)
    plan = plan_data(config, AutoTokenizer.from_pretrained(demo_model_dir))
    assert len(plan.calibration) == calibration_samples
    assert len(plan.holdout) == held_out, "holdoutFraction of calibration + held-out samples"
    share = config.holdout_fraction / (1 - config.holdout_fraction)
    calibration_tokens = sum(len(s.input_ids) for s in plan.calibration)
    holdout_tokens = sum(len(s.input_ids) for s in plan.holdout)
    # Sampled along the held-out pool's own lengths: the tokens follow the sample counts, within a half here.
    assert holdout_tokens <= 1.5 * share * calibration_tokens, (holdout_tokens, calibration_tokens)
    # Still drawn from the records the seeded split held out: never a calibration record.
    cal_sources = {s.source for s in plan.calibration}
    assert cal_sources.isdisjoint(s.source for s in plan.holdout)
    assert len(cal_sources) == calibration_samples


def test_explicit_holdout_samples_still_win(demo_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    config = operator_config(tmp_path, demo_model_dir, {"samples": 32}).model_copy(update={"holdout_samples": 20})
    assert len(plan_data(config, AutoTokenizer.from_pretrained(demo_model_dir)).holdout) == 20
