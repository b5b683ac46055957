"""Static min-max KV scales from one plain forward pass, saved exactly as llm-compressor's oneshot saves them.

llm-compressor's static min-max scale is the running max of |K| and |V| over the calibration tokens, divided by 448;
kvcal's own taps observe the same post-RoPE K/V in a plain forward pass, bit for bit
(tests/integration/test_calib_speed.py). So where nothing else is asked of llm-compressor (basic pipeline, static
min-max, no Q scales), kvcal runs the decoder once (no LM head: the scales need no logits), writes the scales into the
same compressed-tensors parameters and saves the same checkpoint: identical safetensors bytes, config.json and
recipe.yaml (tests/integration/test_calib_speed.py). It skips llm-compressor's import, its session and its
per-module observers (benchmarks/bench_calibrate.py measures both).
"""

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kvcal.calibrator.config import CalibrationConfig
from kvcal.calibrator.data import Sample
from kvcal.calibrator.evaluate import ScaleSet, per_head_scales, per_tensor_scales
from kvcal.calibrator.placement import SAVE_SHARD_BYTES, input_device
from kvcal.calibrator.recipe import kv_cache_scheme
from kvcal.calibrator.taps import KINDS, TensorStats, attention_layers

RECIPE_FILE = "recipe.yaml"  # llm-compressor's RECIPE_FILE_NAME
STATIC_MINMAX = "static_minmax"
CALIBRATED_BY = "one plain forward pass (kvcal's taps, static min-max)"
SCALE_SUFFIXES = ("k_scale", "v_scale")


def needs_oneshot(config: CalibrationConfig, pipeline: str) -> str | None:
    """Why this calibration must run llm-compressor's oneshot, or None when one forward pass gives its checkpoint."""
    if config.oneshot:
        return "asked for (--oneshot)"
    if pipeline != "basic":
        return f"pipeline {pipeline} (layer by layer, for a model larger than memory)"
    if config.compressor_observer != STATIC_MINMAX:
        return f"observer {config.observer} (only static min-max is a running max)"
    if config.query_scales:
        return "query scales (llm-compressor's attention scheme)"
    if (config.model_dir / RECIPE_FILE).exists():
        return f"{config.model_dir / RECIPE_FILE} exists (llm-compressor merges recipes)"
    return None


def observe(model: nn.Module, samples: Sequence[Sample]) -> None:
    """One plain forward pass of the decoder over each sample; the taps attached to `model` see every K and V."""
    decoder: Any = model.get_decoder()  # type: ignore[operator]
    device = input_device(model)
    with torch.no_grad():
        for sample in samples:
            decoder(input_ids=torch.tensor([sample.input_ids], device=device), use_cache=False)


def static_minmax(observed: dict[tuple[int, str], TensorStats], layers: int, strategy: str) -> ScaleSet:
    return per_head_scales(observed, layers) if strategy == "head" else per_tensor_scales(observed, layers)


def apply_scales(model: nn.Module, config: CalibrationConfig, scales: ScaleSet) -> None:
    """The KV-cache scheme on every attention module (as llm-compressor applies it), with these scales, frozen."""
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
    )

    scheme = QuantizationArgs(**kv_cache_scheme(config.compressor_strategy, config.compressor_observer))
    apply_quantization_config(
        model,
        QuantizationConfig(config_groups={}, kv_cache_scheme=scheme, quantization_status=QuantizationStatus.FROZEN),
        show_progress=False,
    )
    from compressed_tensors.offload import update_offload_parameter

    with torch.no_grad():
        for layer, attn in enumerate(attention_layers(model)):
            for kind in KINDS:
                param: torch.Tensor = getattr(attn, f"{kind}_scale")
                value = scales[kind][layer].view(param.shape).to(param.device, param.dtype)
                update_offload_parameter(attn, f"{kind}_scale", value)  # an offloaded layer's stored copy too


def save(model: nn.Module, config: CalibrationConfig) -> None:
    """What llm-compressor's save_pretrained wrapper writes for a KV-only scheme: the weights, the original
    config.json with the quantization_config added, and the recipe."""
    from compressed_tensors import ModelCompressor

    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=None)
    assert compressor is not None, "apply_scales gave the model no quantization config"
    compressor.compress_model(model, skip_compressed=True)
    # The source's tensors and the scales, nothing else: a model loaded with offloading holds tied weights (a tied
    # LM head) as separate tensors, which save_pretrained would write twice.
    names = source_tensor_names(config.model_dir)
    state = {key: value for key, value in model.state_dict().items() if key in names or key.endswith(SCALE_SUFFIXES)}
    model.save_pretrained(config.out, state_dict=state, max_shard_size=SAVE_SHARD_BYTES)  # type: ignore[operator]
    # llm-compressor too puts the original config.json back (vLLM loads it more reliably than transformers' re-save)
    shutil.copy2(config.model_dir / "config.json", config.out / "config.json")
    compressor.update_config(str(config.out))
    write_recipe(config, config.out / RECIPE_FILE)


def source_tensor_names(model_dir: Path) -> set[str]:
    """Tensor names of a safetensors checkpoint, read from the files' headers (no tensor is loaded)."""
    from safetensors import safe_open

    names: set[str] = set()
    for shard in model_dir.glob("*.safetensors"):
        with safe_open(shard, framework="pt") as stream:
            names.update(stream.keys())
    return names


def recipe(config: CalibrationConfig) -> dict[str, Any]:
    """llm-compressor's serialisation of QuantizationModifier(kv_cache_scheme=...), field for field."""
    from compressed_tensors.quantization import QuantizationArgs

    scheme = QuantizationArgs(**kv_cache_scheme(config.compressor_strategy, config.compressor_observer))
    modifier = {
        "targets": ["Linear"],
        "ignore": [],
        "kv_cache_scheme": scheme.model_dump(mode="json"),
        "bypass_divisibility_checks": False,
        "requires_calibration_data": True,
    }
    return {"default_stage": {"default_modifiers": {"QuantizationModifier": modifier}}}


def write_recipe(config: CalibrationConfig, path: Path) -> None:
    import yaml

    with path.open("w", encoding="utf-8") as stream:  # the options llm-compressor's Recipe.yaml passes
        yaml.dump(recipe(config), stream, allow_unicode=True, sort_keys=False, default_flow_style=None, width=88)
