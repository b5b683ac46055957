"""llm-compressor `oneshot` with a KV-cache-only scheme (FP8 E4M3, static, symmetric), and reading the scales back.

Measured on SmolLM2-135M (benchmarks/bench_calibrate.py, 6 samples / 768 tokens, 2 CPU cores):
- Pipeline: for a KV-only scheme `basic` and `sequential` give bit-identical scales (both calibrate with quantization
  disabled, so every layer sees BF16 inputs); sequential took 3.0x as long as basic (541 s vs 182 s, loaded machine).
  Sequential onloads one layer at a time, which is what lets a model larger than the accelerator calibrate, so `auto`
  picks basic only when the weights fit comfortably.
- Observer: scale * 448 / true max|x| over the same tokens was 0.997-1.000 for `static_minmax` (only the bf16 rounding
  of the saved scale), but down to 0.83 (K) / 0.52 (V) for `minmax` (a moving average) and 0.81 / 0.51 for `mse`:
  both clip values the calibration set itself contains. Default: static-minmax.
"""

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from kvcal.calibrator.data import Sample
from kvcal.calibrator.taps import attention_layers

log = logging.getLogger(__name__)

# Share of the device memory the BF16 weights may take for `auto` to pick the basic pipeline (activations need room).
BASIC_MEMORY_SHARE = 0.6


def kv_cache_scheme(strategy: str, observer: str) -> dict[str, Any]:
    """The KV-only scheme in llm-compressor's vocabulary (strategy 'tensor' | 'attn_head')."""
    return {
        "num_bits": 8,
        "type": "float",
        "symmetric": True,
        "dynamic": False,
        "strategy": strategy,
        "observer": observer,
    }


def choose_pipeline(requested: str, weight_bytes: int, device_bytes: int) -> str:
    if requested != "auto":
        return requested
    return "basic" if weight_bytes <= BASIC_MEMORY_SHARE * device_bytes else "sequential"


def device_memory_bytes() -> int:
    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    import os

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def run_oneshot(model: nn.Module, samples: Sequence[Sample], strategy: str, observer: str, pipeline: str) -> None:
    """Calibrate in place: attention modules get `k_scale` / `v_scale` parameters; weights are untouched."""
    from datasets import Dataset
    from llmcompressor import oneshot  # type: ignore[attr-defined]
    from llmcompressor.modifiers.quantization import QuantizationModifier

    ds = Dataset.from_dict(
        {
            "input_ids": [list(s.input_ids) for s in samples],
            "attention_mask": [[1] * len(s.input_ids) for s in samples],
        }
    )
    recipe = QuantizationModifier(kv_cache_scheme=kv_cache_scheme(strategy, observer))
    log.info(
        "llm-compressor oneshot: %d samples, strategy=%s observer=%s pipeline=%s", len(ds), strategy, observer, pipeline
    )
    oneshot(
        model=model,  # type: ignore[arg-type]
        dataset=ds,
        recipe=recipe,
        num_calibration_samples=len(ds),
        shuffle_calibration_samples=False,
        max_seq_length=max(len(s.input_ids) for s in samples),
        pipeline=pipeline,
    )


def read_scales(model: nn.Module) -> dict[str, list[torch.Tensor]]:
    """Per layer, K and V scales as float32 exactly as saved (bf16 widened): shape (1,) or (kv_heads, 1, 1)."""
    out: dict[str, list[torch.Tensor]] = {"k": [], "v": []}
    for attn in attention_layers(model):
        for kind in ("k", "v"):
            p = getattr(attn, f"{kind}_scale", None)
            if p is None:
                raise RuntimeError(f"layer {attn.layer_idx}: llm-compressor produced no {kind}_scale")
            out[kind].append(p.detach().to(torch.float32).clone())
    return out
