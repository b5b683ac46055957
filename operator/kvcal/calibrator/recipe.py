"""llm-compressor `oneshot` with a KV-cache-only scheme (FP8 E4M3, static, symmetric), and reading the scales back.

Measured on SmolLM2-135M (benchmarks/bench_calibrate.py, 6 samples / 768 tokens, 2 CPU cores):
- Pipeline: for a KV-only scheme `basic` and `sequential` give bit-identical scales (both calibrate with quantization
  disabled, so every layer sees BF16 inputs); sequential took 3.0x as long as basic (541 s vs 182 s, loaded machine).
  `auto` picks basic: kvcal's placement onloads a model larger than its accelerators layer by layer (choose_pipeline).
- Observer: scale * 448 / true max|x| over the same tokens was 0.997-1.000 for `static_minmax` (only the bf16 rounding
  of the saved scale), but down to 0.83 (K) / 0.52 (V) for `minmax` (a moving average) and 0.81 / 0.51 for `mse`:
  both clip values the calibration set itself contains. Default: static-minmax.

Q scales (`query=True`): an attention scheme in config_groups targeting the attention class (e.g. LlamaAttention)
adds `q_scale` beside k/v. vLLM 0.32 loads it only from a group whose single target ends in "Attention". llm-compressor
0.14 forces eager attention during calibration, which bypasses compressed-tensors' hooked attention: Q is never
observed and q_scale is saved uninitialised (seen on the demo model: -2.1e33, then 2.5e-21). So the model runs eager
attention *through* the hooked attention, and `check_query_scales` refuses a q_scale its own tap contradicts.
"""

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from kvcal.calibrator.data import Sample
from kvcal.calibrator.taps import attention_layers, layer_index

log = logging.getLogger(__name__)


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


def query_config_groups(model: nn.Module, scheme: dict[str, Any]) -> dict[str, Any]:
    """The attention scheme (Q, K and V with the KV scheme's args) in the form vLLM 0.32 loads: one target, the
    attention class name."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    target = type(attention_layers(model)[0]).__name__
    if not target.endswith("Attention"):
        raise RuntimeError(f"attention class {target!r}: vLLM 0.32 loads Q scales only for a class named *Attention")
    return {"attention": QuantizationScheme(targets=[target], input_activations=QuantizationArgs(**scheme))}


EAGER_NAME = "kvcal_eager"  # transformers registers no "eager" attention function: the model's own, by name


@contextlib.contextmanager
def _hooked_eager_attention(model: nn.Module) -> Iterator[None]:
    """Eager attention wrapped by compressed-tensors' hooked attention for the whole oneshot (see module doc)."""
    import sys

    from compressed_tensors.modeling.attention import HOOKED_ATTENTION_NAME, initialize_hooked_attention
    from llmcompressor.utils import helpers
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    layers = attention_layers(model)
    eager = sys.modules[type(layers[0]).__module__].eager_attention_forward
    ALL_ATTENTION_FUNCTIONS.register(EAGER_NAME, eager)
    ALL_MASK_ATTENTION_FUNCTIONS.register(EAGER_NAME, ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    config: Any = model.config
    config._attn_implementation = EAGER_NAME  # what the hooked attention will wrap (and its mask)
    for attn in layers:
        initialize_hooked_attention(model, attn)  # llm-compressor's own call is a no-op then
    assert config._attn_implementation == HOOKED_ATTENTION_NAME
    forced = helpers.use_eager_attention
    helpers.use_eager_attention = _no_forcing  # type: ignore[assignment]
    try:
        yield
    finally:
        helpers.use_eager_attention = forced


def _no_forcing(_model: nn.Module) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


class _QueryMax:
    """max|Q| per layer, observed through the same hook llm-compressor's Q observer uses."""

    def __init__(self) -> None:
        self.absmax: dict[int, float] = {}
        self.handles: list[Any] = []

    def attach(self, model: nn.Module) -> None:
        from compressed_tensors.modeling.attention import register_query_hook

        for attn in attention_layers(model):
            if hasattr(attn, "impl"):
                self.handles.append(register_query_hook(attn, self._hook(layer_index(attn))))

    def _hook(self, layer: int) -> Any:
        def observe(_module: nn.Module, query: torch.Tensor) -> None:
            self.absmax[layer] = max(self.absmax.get(layer, 0.0), float(query.detach().abs().max()))

        return observe

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()


def check_query_scales(q_scales: Sequence[torch.Tensor], absmax: dict[int, float], observer: str) -> None:
    """Each layer's q_scale must be finite and positive, its Q must have been observed, and with static min-max it
    must map the observed max|Q| onto 448 (bf16 rounding aside)."""
    if not q_scales:
        raise RuntimeError("llm-compressor produced no q_scale: the attention scheme matched no attention module")
    for layer, scale in enumerate(q_scales):
        values = [float(x) for x in scale.flatten()]
        if layer not in absmax:
            raise RuntimeError(f"layer {layer}: Q was never observed, q_scale {values[:4]} is not a calibration")
        if not all(math.isfinite(x) and x > 0 for x in values):
            raise RuntimeError(f"layer {layer}: q_scale {values[:4]} is not finite and positive")
        want = absmax[layer] / 448.0
        if observer == "static_minmax" and abs(max(values) - want) > want * 2.0**-7:
            raise RuntimeError(f"layer {layer}: q_scale {max(values):.6g}, but max|Q|/448 is {want:.6g}")


def choose_pipeline(requested: str) -> str:
    """auto: basic. The placement (calibrator/placement.py) already onloads a model larger than its accelerators
    layer by layer, in kvcal's own forward pass too; llm-compressor's sequential pipeline, which onloads each layer
    once for all samples, stays a choice (`pipeline: sequential`): it runs its observers 3x slower here, and its
    untying of tied embeddings fails on weights offloaded to disk (compressed-tensors 0.19 DiskCache KeyError)."""
    return "basic" if requested == "auto" else requested


def run_oneshot(
    model: nn.Module, samples: Sequence[Sample], strategy: str, observer: str, pipeline: str, query: bool = False
) -> None:
    """Calibrate in place: attention modules get `k_scale` / `v_scale` (and with `query`, `q_scale`) parameters;
    weights are untouched."""
    from datasets import Dataset
    from llmcompressor import oneshot  # type: ignore[attr-defined]
    from llmcompressor.modifiers.quantization import QuantizationModifier

    ds = Dataset.from_dict(
        {
            "input_ids": [list(s.input_ids) for s in samples],
            "attention_mask": [[1] * len(s.input_ids) for s in samples],
        }
    )
    scheme = kv_cache_scheme(strategy, observer)
    groups = query_config_groups(model, scheme) if query else None
    recipe = QuantizationModifier(kv_cache_scheme=scheme, config_groups=groups)
    log.info(
        "llm-compressor oneshot: %d samples, strategy=%s observer=%s pipeline=%s query=%s",
        len(ds),
        strategy,
        observer,
        pipeline,
        query,
    )
    query_max = _QueryMax()
    with _hooked_eager_attention(model) if query else contextlib.nullcontext():
        if query:
            query_max.attach(model)
        try:
            oneshot(
                model=model,  # type: ignore[arg-type]
                dataset=ds,
                recipe=recipe,
                num_calibration_samples=len(ds),
                shuffle_calibration_samples=False,
                max_seq_length=max(len(s.input_ids) for s in samples),
                pipeline=pipeline,
            )
        finally:
            query_max.detach()
    if query:
        check_query_scales(read_query_scales(model), query_max.absmax, observer)


def read_scales(model: nn.Module) -> dict[str, list[torch.Tensor]]:
    """Per layer, K and V scales as float32 exactly as saved (bf16 widened): shape (1,) or (kv_heads, 1, 1)."""
    out: dict[str, list[torch.Tensor]] = {"k": [], "v": []}
    for attn in attention_layers(model):
        for kind in ("k", "v"):
            p = getattr(attn, f"{kind}_scale", None)
            if p is None:
                raise RuntimeError(f"layer {attn.layer_idx}: llm-compressor produced no {kind}_scale")
            out[kind].append(p.detach().to("cpu", torch.float32).clone())
    return out


def read_query_scales(model: nn.Module) -> list[torch.Tensor]:
    """Per layer, q_scale as float32 (empty when Q was not calibrated)."""
    found = [getattr(attn, "q_scale", None) for attn in attention_layers(model)]
    return [p.detach().to("cpu", torch.float32).clone() for p in found if p is not None]
