"""Taps on the post-RoPE key and value states of every attention layer — the tensors vLLM writes to its KV cache.

They ride on compressed-tensors' hooked KV cache (the same place llm-compressor's observers look), so one forward pass
can feed llm-compressor's observer and our statistics, and later passes can replace K/V with what an FP8 cache returns.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from kvcal.calibrator.quant import ErrorStats, Rounding, error_stats, quant_dequant

KINDS = ("k", "v")
# |x| histogram: 64 bins per octave over 2^-24 .. 2^16 (percentiles good to 2^(1/64) ~ 1.1%).
_BINS_PER_OCTAVE = 64
_LOW_OCTAVE = -24
_OCTAVES = 40
NBINS = _BINS_PER_OCTAVE * _OCTAVES


@dataclass
class TensorStats:
    """Running per-head statistics of one K or V tensor stream (values per head = tokens * head_dim)."""

    heads: int
    absmax: torch.Tensor = field(init=False)
    hist: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.absmax = torch.zeros(self.heads, dtype=torch.float32)
        self.hist = torch.zeros(self.heads * NBINS, dtype=torch.int64)

    def observe(self, x: torch.Tensor) -> None:
        if self.absmax.device != x.device:  # accumulate where the layer computes: no host sync per call
            self.absmax, self.hist = self.absmax.to(x.device), self.hist.to(x.device)
        a = x.detach().abs().to(torch.float32).transpose(0, 1).reshape(self.heads, -1)  # (heads, values)
        self.absmax = torch.maximum(self.absmax, a.amax(dim=1))
        b = ((torch.log2(a.clamp(min=2.0**_LOW_OCTAVE)) - _LOW_OCTAVE) * _BINS_PER_OCTAVE).floor().long()
        b = b.clamp_(0, NBINS - 1) + (torch.arange(self.heads, device=x.device) * NBINS).unsqueeze(1)
        self.hist += torch.bincount(b.flatten(), minlength=self.heads * NBINS)

    def to_cpu(self) -> "TensorStats":
        self.absmax, self.hist = self.absmax.cpu(), self.hist.cpu()
        return self

    def percentile(self, q: float) -> torch.Tensor:
        """Per-head q-quantile of |x| (upper edge of the histogram bin; never above the exact max)."""
        h = self.hist.view(self.heads, NBINS)
        cum = h.cumsum(dim=1)
        need = (cum[:, -1].to(torch.float64) * q).ceil().clamp(min=1).unsqueeze(1)
        idx = (cum.to(torch.float64) < need).sum(dim=1)
        edge = torch.pow(2.0, (idx.to(torch.float64) + 1) / _BINS_PER_OCTAVE + _LOW_OCTAVE).to(torch.float32)
        return torch.minimum(edge, self.absmax)

    @property
    def count(self) -> int:
        return int(self.hist[:NBINS].sum())


@dataclass
class Tap:
    """What to do with each layer's K/V: collect stats, score named scale sets, keep a copy, or replace K/V."""

    heads: int
    stats: bool = True
    # name -> (kind -> per-layer float32 scales broadcastable to (batch, heads, tokens, head_dim))
    score: dict[str, dict[str, list[torch.Tensor]]] = field(default_factory=dict)
    replace: dict[str, list[torch.Tensor]] | None = None
    rounding: Rounding = "nearest"
    keep: bool = False
    observed: dict[tuple[int, str], TensorStats] = field(default_factory=dict)
    errors: dict[tuple[str, int, str], ErrorStats] = field(default_factory=dict)
    kept: dict[tuple[int, str], list[torch.Tensor]] = field(default_factory=dict)
    _copies: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)

    def __call__(self, layer: int, kind: str, x: torch.Tensor) -> torch.Tensor | None:
        if self.stats:
            self.observed.setdefault((layer, kind), TensorStats(self.heads)).observe(x)
        for name, scales in self.score.items():
            e = error_stats(x, self._placed(scales[kind][layer], x.device), self.rounding)
            self.errors.setdefault((name, layer, kind), ErrorStats.zeros(self.heads, x.device)).add(e)
        if self.keep:
            self.kept.setdefault((layer, kind), []).append(x.detach().clone())
        if self.replace is not None:
            return quant_dequant(x, self._placed(self.replace[kind][layer], x.device), self.rounding)
        return None

    def _placed(self, scale: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The scale on the layer's device, copied there once (the scale sets are built on the CPU)."""
        if scale.device == device:
            return scale
        key = (id(scale), str(device))
        if key not in self._copies:
            self._copies[key] = (scale, scale.to(device))  # the original kept alive so its id stays unique
        return self._copies[key][1]

    def to_cpu(self) -> None:
        """Statistics back on the host, for the report (one transfer at the end, not one per layer and sample)."""
        for stats in self.observed.values():
            stats.to_cpu()
        for errors in self.errors.values():
            errors.to_cpu()


def attention_layers(model: nn.Module) -> list[nn.Module]:
    """Attention modules in layer order: the ones compressed-tensors' KV cache hook takes (its own rule: an attention
    module with k/v, fused qkv or latent kv projections whose forward receives the cache), with a `layer_idx`.
    Matching projection names here instead missed fused ones (Phi-3's qkv_proj): no layer was observed."""
    from compressed_tensors.quantization import is_cached_attention_module

    found = [m for m in model.modules() if hasattr(m, "layer_idx") and is_cached_attention_module(m)]
    return sorted(found, key=layer_index)


def uncalibratable(model: nn.Module) -> str | None:
    """Why no K/V scale of `model` can be calibrated (None when its attention layers are found): one line naming the
    architecture and its attention modules."""
    if attention_layers(model):
        return None
    named = sorted({type(m).__name__ for m in model.modules() if "attention" in type(m).__name__.lower()})
    modules = ", ".join(named) or "none found"
    return (
        f"{type(model).__name__}: no attention layer that compressed-tensors' KV cache hook can take (attention "
        f"modules: {modules}; it needs k_proj/v_proj, qkv_proj or kv_b_proj and a forward that receives the KV "
        "cache), so no K/V scale can be calibrated for it"
    )


def layer_index(attn: nn.Module) -> int:
    idx: int = attn.layer_idx  # type: ignore[assignment]
    return int(idx)


def attach(model: nn.Module, tap: Callable[[int, str, torch.Tensor], torch.Tensor | None]) -> list[object]:
    """Register `tap(layer, kind, states)` on every attention layer's post-RoPE K and V; returns the handles."""
    from compressed_tensors.modeling.kvcache import (
        initialize_hooked_kv_cache,
        register_key_hook,
        register_value_hook,
    )

    handles: list[object] = []
    for attn in attention_layers(model):
        initialize_hooked_kv_cache(model, attn)  # no-op when llm-compressor already did it
        layer = layer_index(attn)

        def on_k(_m: nn.Module, x: torch.Tensor, layer: int = layer) -> torch.Tensor | None:
            return tap(layer, "k", x)

        def on_v(_m: nn.Module, x: torch.Tensor, layer: int = layer) -> torch.Tensor | None:
            return tap(layer, "v", x)

        handles.append(register_key_hook(attn, on_k))
        handles.append(register_value_hook(attn, on_v))
    return handles


def detach(handles: list[object]) -> None:
    for h in handles:
        h.remove()  # type: ignore[attr-defined]
