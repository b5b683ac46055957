"""Static checkpoint verification on small synthetic checkpoints written in the real safetensors format: each test
corrupts one thing and expects exactly that problem, named by layer and tensor."""

import json
import math
from pathlib import Path
from typing import Any

import pytest

from kvcal.verify import static
from kvcal.verify.cli import register
from kvcal.verify.tensors import encode, index_checkpoint, load_tensors, write_safetensors
from tests.support.checkpoints import KV_HEADS, LAYERS, SCHEME, config, scales, write


def codes(result: static.StaticResult) -> list[str]:
    return [p.code for p in result.problems]


def test_sound_checkpoint_passes(tmp_path: Path) -> None:
    result = static.verify(write(tmp_path, scales(), config()))
    assert result.ok, [p.line() for p in result.problems]
    assert result.strategy == "tensor"
    assert result.scales[2].k == pytest.approx((0.09,), rel=2**-8)


def test_sound_per_head_checkpoint_passes(tmp_path: Path) -> None:
    cfg = config(SCHEME | {"strategy": "attn_head"})
    result = static.verify(write(tmp_path, scales(per_head=True), cfg))
    assert result.ok, [p.line() for p in result.problems]
    assert len(result.scales[0].v) == KV_HEADS


def test_missing_layer_scale_is_named(tmp_path: Path) -> None:
    raw = scales()
    del raw["model.layers.1.self_attn.v_scale"]
    result = static.verify(write(tmp_path, raw, config()))
    assert codes(result) == ["missing"]
    line = result.problems[0].line()
    assert line.startswith("layer 1 model.layers.1.self_attn.v_scale: missing")
    assert "1.0" in line


@pytest.mark.parametrize(
    ("value", "code"),
    [(math.nan, "not-finite"), (math.inf, "not-finite"), (0.0, "not-positive"), (-0.02, "not-positive")],
)
def test_bad_values(tmp_path: Path, value: float, code: str) -> None:
    raw = scales()
    raw["model.layers.2.self_attn.k_scale"] = ("BF16", (1,), encode("BF16", [value]))
    result = static.verify(write(tmp_path, raw, config()))
    assert codes(result) == [code]
    assert result.problems[0].layer == 2
    assert result.problems[0].tensor == "model.layers.2.self_attn.k_scale"


def test_wrong_shape_for_strategy(tmp_path: Path) -> None:
    raw = scales()
    raw["model.layers.0.self_attn.k_scale"] = ("BF16", (3, 1, 1), encode("BF16", [0.1, 0.2, 0.3]))
    result = static.verify(write(tmp_path, raw, config()))
    assert codes(result) == ["shape"]
    assert "(1,) or () for strategy tensor" in result.problems[0].message


def test_per_head_shape_must_match_kv_heads(tmp_path: Path) -> None:
    raw = scales(per_head=True)
    raw["model.layers.1.self_attn.v_scale"] = ("BF16", (3, 1, 1), encode("BF16", [0.1, 0.2, 0.3]))
    result = static.verify(write(tmp_path, raw, config(SCHEME | {"strategy": "attn_head"})))
    assert codes(result) == ["shape"]
    assert f"({KV_HEADS}, 1, 1)" in result.problems[0].message


def test_scheme_says_tensor_but_scales_are_per_head(tmp_path: Path) -> None:
    result = static.verify(write(tmp_path, scales(per_head=True), config()))
    assert set(codes(result)) == {"shape"}
    assert len(result.problems) == 2 * LAYERS


def test_all_default_scales(tmp_path: Path) -> None:
    raw = scales()
    for name in [n for n in raw if n.endswith("_scale")]:
        raw[name] = ("BF16", (1,), encode("BF16", [1.0]))
    result = static.verify(write(tmp_path, raw, config()))
    assert codes(result) == ["all-default"]
    assert "1.0" in result.problems[0].message


def test_missing_kv_cache_scheme(tmp_path: Path) -> None:
    result = static.verify(write(tmp_path, scales(), config(scheme=None)))
    assert codes(result) == ["scheme-missing"]
    assert result.problems[0].tensor == "config.json"
    assert "kv_cache_scheme" in result.problems[0].message


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_bits": 4}, "num_bits"),
        ({"type": "int"}, "type"),
        ({"dynamic": True}, "dynamic"),
        ({"strategy": "x"}, "strategy"),
    ],
)
def test_inconsistent_scheme(tmp_path: Path, change: dict[str, Any], field: str) -> None:
    result = static.verify(write(tmp_path, scales(), config(SCHEME | change)))
    assert "scheme" in codes(result)
    assert any(f"kv_cache_scheme.{field}" in p.message for p in result.problems)


@pytest.mark.parametrize(
    ("legacy", "fate"),
    [
        ("self_attn.kv_scale", "remapped"),
        ("self_attn.k_proj.output_scale", "dropped"),
        ("self_attn.attn.k_scale", "remapped"),
        ("self_attn.k_proj.k_scale", "remapped"),
    ],
)
def test_legacy_names(tmp_path: Path, legacy: str, fate: str) -> None:
    raw = scales()
    raw[f"model.layers.1.{legacy}"] = raw.pop("model.layers.1.self_attn.k_scale")
    result = static.verify(write(tmp_path, raw, config()))
    legacy_problems = [p for p in result.problems if p.code == "legacy-name"]
    assert len(legacy_problems) >= 1
    assert legacy_problems[0].tensor == f"model.layers.1.{legacy}"
    assert f"({fate} by vLLM)" in legacy_problems[0].message
    assert "self_attn.k_scale" in legacy_problems[0].message  # the fix


def head_stats(absmax: float) -> dict[str, Any]:
    return {"head": 0, "scale": 0.0, "calibration": {"absmax": absmax, "p999": absmax, "p9999": absmax}}


def test_scale_below_calibration_max_is_clipping(tmp_path: Path) -> None:
    # The calibrator's report: per layer, per KV head. Layer 1's k scale 0.06 holds |K| up to 26.88; 40 was seen.
    report = {
        "reportVersion": 1,
        "layers": [
            {"layer": 0, "k": [head_stats(0.03 * 448), head_stats(1.0)], "v": [head_stats(0.01 * 448)]},
            {"layer": 1, "k": [head_stats(3.0), head_stats(40.0)], "v": [head_stats(0.02 * 448)]},
        ],
    }
    result = static.verify(write(tmp_path, scales(), config(), report))
    assert codes(result) == ["clipped"]
    assert result.problems[0].tensor == "model.layers.1.self_attn.k_scale"
    assert "40" in result.problems[0].message


def test_flat_report_maxima_are_read_too() -> None:
    maxima = static.calibration_maxima({"layers": [{"layer": 2, "kAbsMax": 5.0, "vAbsMax": 1}, "junk", {"x": 1}]})
    assert maxima == {(2, "k"): (5.0,), (2, "v"): (1.0,)}
    assert static.calibration_maxima({"layers": "nope"}) == {}


def test_bf16_rounding_of_a_covering_scale_is_not_clipping() -> None:
    amax = 12.3456
    stored = float(static.FP8_E4M3_MAX)
    exact = amax / stored
    rounded_down = exact * (1 - 2**-9)  # what bf16 rounding can do to the exact scale
    assert static.check_coverage((rounded_down,), (amax,), 0, "t") is None
    assert static.check_coverage((exact * 0.98,), (amax,), 0, "t") is not None


def test_reader_round_trips_bf16(tmp_path: Path) -> None:
    write(tmp_path, scales(per_head=True), config())
    tensors = load_tensors(index_checkpoint(tmp_path).values())
    assert tensors["model.layers.2.self_attn.k_scale"].shape == (KV_HEADS, 1, 1)
    assert tensors["model.layers.0.self_attn.v_scale"].values == pytest.approx((0.01, 0.02), rel=2**-8)


def test_cli_exit_codes_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    good = write(tmp_path / "good", scales(), config())
    raw = scales()
    del raw["model.layers.0.self_attn.k_scale"]
    bad = write(tmp_path / "bad", raw, config())
    term = tmp_path / "termination-log"

    args = parser.parse_args(["verify", str(good), "--termination-log", str(term)])
    assert args.func(args) == 0
    assert json.loads(term.read_text()) == {"ok": True, "layers": LAYERS, "mismatches": 0, "problems": []}
    assert capsys.readouterr().out.startswith("OK: checkpoint, 3 layers, strategy tensor")

    args = parser.parse_args(["verify", str(bad), "--json", "--termination-log", str(term)])
    assert args.func(args) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False
    assert doc["problems"][0]["tensor"] == "model.layers.0.self_attn.k_scale"
    assert json.loads(term.read_text())["problems"] == [doc["problems"][0]["line"]]

    args = parser.parse_args(["verify", str(tmp_path / "nowhere")])
    assert args.func(args) == 2


def provenance_report(artifact_hash: str) -> dict[str, Any]:
    """As kvcal.calibrator.report writes it: camelCase keys (the model's field is artifact_hash)."""
    return {"kind": "KVCalibrationReport", "provenance": {"artifactHash": artifact_hash}}


def test_checkpoint_changed_in_place_after_calibration(tmp_path: Path) -> None:
    """The calibrator records weights_digest(output) in kvcal-report.json: other weights at the same path fail."""
    from kvcal.verify.digest import weights_digest

    folder = write(tmp_path, scales(), config())
    recorded = weights_digest(folder)
    (folder / static.REPORT_NAME).write_text(json.dumps(provenance_report(recorded)))
    assert static.verify(folder).ok  # the report's own file is not part of the digest

    raw = scales()
    raw["model.embed_tokens.weight"] = ("BF16", (2, 2), encode("BF16", [0.5, 1.0, 1.5, 2.5]))
    write_safetensors(folder / "model.safetensors", raw)  # the same path, other weights, the report kept
    (problem,) = static.verify(folder).problems
    now = weights_digest(folder)
    assert (problem.code, problem.tensor) == ("changed-in-place", "kvcal-report.json")
    assert f"sha256 {now[:12]}" in problem.message and f"recorded {recorded[:12]}" in problem.message


@pytest.mark.parametrize("report", [None, {"provenance": {}}, {"provenance": {"artifactHash": None}}, {"layers": []}])
def test_no_recorded_hash_checks_nothing(tmp_path: Path, report: dict[str, Any] | None) -> None:
    """Checkpoints from calibrators that record no hash (or from elsewhere) verify as before."""
    assert static.verify(write(tmp_path, scales(), config(), report)).ok
