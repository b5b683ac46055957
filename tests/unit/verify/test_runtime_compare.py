"""Comparing vLLM's read-back scales with the checkpoint's, on real read-backs captured from vLLM 0.32 on CPU
(tests/data/vllm-0.32-cpu/scales-loaded-*.json)."""

import json
from pathlib import Path

from kvcal.verify.problems import TERMINATION_LIMIT, termination_summary
from kvcal.verify.runtime import LoadedScale, compare
from kvcal.verify.static import LayerScales, ModelShape, StaticResult

DATA = Path(__file__).parents[2] / "data" / "vllm-0.32-cpu"


def loaded(name: str) -> list[LoadedScale]:
    return [LoadedScale.from_row(row) for row in json.loads((DATA / name).read_text())]


def checkpoint_like(rows: list[LoadedScale], strategy: str = "tensor") -> StaticResult:
    """The checkpoint whose per-tensor scales vLLM read back as `rows`."""
    scales = {r.layer: LayerScales((r.k,), (r.v,)) for r in rows if r.layer is not None}
    return StaticResult(ModelShape(len(scales), 3), strategy, scales)


def test_read_back_equal_to_checkpoint_is_ok() -> None:
    rows = loaded("scales-loaded-calibrated.json")
    result = compare(checkpoint_like(rows), rows, "fp8")
    assert result.layers == 30
    assert result.problems == [] and result.mismatches == 0
    assert rows[0].layer == 0 and rows[0].method == "CompressedTensorsKVCacheMethod"


def test_scales_not_loaded_read_back_as_one() -> None:
    checkpoint = checkpoint_like(loaded("scales-loaded-calibrated.json"))
    result = compare(checkpoint, loaded("scales-loaded-fp8-default.json"), "fp8")
    assert result.mismatches == 60
    assert {p.code for p in result.problems} == {"runtime-missing"}
    first = result.problems[0]
    assert first.layer == 0 and first.tensor == "model.layers.0.self_attn.attn._k_scale"
    assert "1.0" in first.message and "NoneType" in first.message


def test_one_changed_scale_is_a_mismatch() -> None:
    rows = loaded("scales-loaded-calibrated.json")
    checkpoint = checkpoint_like(rows)
    checkpoint.scales[7] = LayerScales((rows[7].k * 1.05,), (rows[7].v,))
    result = compare(checkpoint, rows, "fp8")
    assert [(p.code, p.layer) for p in result.problems] == [("mismatch", 7)]
    assert result.mismatches == 1


def test_per_head_collapsed_to_max_over_heads() -> None:
    rows = loaded("scales-loaded-calibrated-attn-head.json")
    # A per-head checkpoint whose heads' max is what the CPU backend read back.
    scales = {r.layer: LayerScales((r.k * 0.5, r.k, r.k * 0.75), (r.v, r.v * 0.25, r.v * 0.5)) for r in rows}
    checkpoint = StaticResult(ModelShape(30, 3), "attn_head", scales)  # type: ignore[arg-type]
    result = compare(checkpoint, rows, "fp8")
    assert {p.code for p in result.problems} == {"collapsed"}
    assert result.mismatches == 60
    assert "max over heads" in result.problems[0].message
    assert any("collapsed" in n for n in result.notes)


def test_per_head_kept_by_the_backend_is_ok() -> None:
    heads = (0.01, 0.02, 0.03)
    name, method = "model.layers.0.self_attn.attn", "CompressedTensorsKVCacheMethod"
    row = LoadedScale(name, 0.03, 0.03, "fp8", method, heads, heads, "FLASH_ATTN", True)
    checkpoint = StaticResult(ModelShape(1, 3), "attn_head", {0: LayerScales(heads, heads)})
    assert compare(checkpoint, [row], "fp8").problems == []
    # vLLM 0.32 keeps the per-head buffer on CPU too, but CPU_ATTN uses only the float (the max): collapsed.
    cpu = LoadedScale(name, 0.03, 0.03, "fp8", method, heads, heads, "CPU_ATTN", False)
    assert [p.code for p in compare(checkpoint, [cpu], "fp8").problems] == ["collapsed", "collapsed"]


def test_auto_silently_switched_to_fp8_is_noted() -> None:
    rows = loaded("scales-loaded-calibrated.json")
    result = compare(checkpoint_like(rows), rows, "auto")
    assert result.problems == []
    assert any("switched --kv-cache-dtype auto to fp8" in n for n in result.notes)


def test_kv_cache_not_fp8_means_scales_unused() -> None:
    rows = [LoadedScale(r.module, 1.0, 1.0, "auto", "NoneType") for r in loaded("scales-loaded-calibrated.json")]
    result = compare(checkpoint_like(loaded("scales-loaded-calibrated.json")), rows, "auto")
    assert result.problems[0].code == "not-fp8"


def test_missing_layer_in_vllm() -> None:
    rows = loaded("scales-loaded-calibrated.json")
    result = compare(checkpoint_like(rows), rows[:-1], "fp8")
    assert [(p.code, p.layer) for p in result.problems] == [("runtime-absent", 29)]


def test_termination_summary_fits_4096_bytes() -> None:
    problems = [f"layer {n} model.layers.{n}.self_attn.attn._k_scale: " + "x" * 150 for n in range(100)]
    text = termination_summary(False, 100, 100, problems, ["note"])
    assert len(text.encode()) <= TERMINATION_LIMIT
    doc = json.loads(text)
    assert doc["ok"] is False and doc["layers"] == 100 and doc["mismatches"] == 100
    assert doc["problems"][0] == problems[0]
    assert doc["problems"][-1].endswith("more problems")
    assert doc["notes"] == ["note"]
