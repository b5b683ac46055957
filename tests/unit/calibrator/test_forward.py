"""Which calibrations kvcal's one forward pass may take over from llm-compressor's oneshot (calibrator/forward.py);
the proof that it writes the same checkpoint is tests/integration/test_calib_speed.py."""

from pathlib import Path

import pytest

from kvcal.calibrator.config import CalibrationConfig
from kvcal.calibrator.forward import needs_oneshot, recipe


def config(tmp_path: Path, **extra: object) -> CalibrationConfig:
    return CalibrationConfig.model_validate({"modelDir": tmp_path, "data": "/d.jsonl", "out": "/o", **extra})


def test_static_minmax_on_the_basic_pipeline_needs_no_oneshot(tmp_path: Path) -> None:
    assert needs_oneshot(config(tmp_path), "basic") is None
    assert needs_oneshot(config(tmp_path, strategy="head"), "basic") is None


@pytest.mark.parametrize(
    ("extra", "pipeline", "reason"),
    [
        ({"oneshot": True}, "basic", "--oneshot"),
        ({}, "sequential", "pipeline sequential"),
        ({"observer": "minmax"}, "basic", "observer minmax"),
        ({"observer": "mse"}, "basic", "observer mse"),
        ({"queryScales": True}, "basic", "query scales"),
    ],
)
def test_everything_else_runs_the_oneshot_and_says_why(
    tmp_path: Path, extra: dict[str, object], pipeline: str, reason: str
) -> None:
    assert reason in (needs_oneshot(config(tmp_path, **extra), pipeline) or "")


def test_a_model_with_its_own_recipe_runs_the_oneshot(tmp_path: Path) -> None:
    """llm-compressor appends to a recipe.yaml found beside the model; kvcal's writer does not, so it steps aside."""
    (tmp_path / "recipe.yaml").write_text("earlier_stage: {}\n")
    assert "recipe.yaml exists" in (needs_oneshot(config(tmp_path), "basic") or "")


def test_recipe_carries_the_kv_cache_scheme_as_configured(tmp_path: Path) -> None:
    modifier = recipe(config(tmp_path, strategy="head"))["default_stage"]["default_modifiers"]["QuantizationModifier"]
    scheme = modifier["kv_cache_scheme"]
    assert (scheme["strategy"], scheme["observer"], scheme["num_bits"], scheme["type"]) == (
        "attn_head",
        "static_minmax",
        8,
        "float",
    )
    assert scheme["dynamic"] is False and scheme["symmetric"] is True
