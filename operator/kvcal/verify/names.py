"""How vLLM 0.32 names K/V scales in a checkpoint, and what it does with the other names seen in the wild.

From vLLM 0.32's `QuantizationConfig.get_cache_scale_mapper()` (applied by AutoWeightsLoader) and
`BaseKVCacheMethod.process_weights_after_loading()`: the standard llm-compressor name
`model.layers.N.self_attn.k_scale` becomes the attention module's `...self_attn.attn.k_scale`. Other names are
legacy: some are still remapped (loaded), some are not mapped at all, and then that layer silently runs at 1.0 (or
the load fails). When only one of k/v is loaded, vLLM copies it into the other."""

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["k", "v"]
Fate = Literal["canonical", "remapped", "dropped"]

_LAYER = re.compile(r"^(?P<prefix>(?:.*\.)?)layers\.(?P<layer>\d+)\.(?P<rest>.+)$")


@dataclass(frozen=True)
class ScaleName:
    """A checkpoint tensor recognised as a K and/or V scale of one layer."""

    name: str
    layer: int
    kinds: tuple[Kind, ...]
    fate: Fate
    why: str  # for legacy names: what vLLM does with it, and the fix


# suffix after `layers.N.` -> (kinds, fate, why). Order matters: the first match wins.
Rule = tuple[str, tuple[Kind, ...], Fate, str]
_RENAME = "save it as self_attn.{kind}_scale (what llm-compressor writes and every vLLM version loads)"


def _per_kind(suffix: str, fate: Fate, why: str) -> tuple[Rule, Rule]:
    """The K rule and the V rule of one naming scheme; `{kind}` (k, v) and `{KIND}` (K, V) stand for the kind."""

    def rule(kind: Kind) -> Rule:
        return suffix.format(kind=kind), (kind,), fate, why.format(kind=kind, KIND=kind.upper())

    return rule("k"), rule("v")


_RULES: tuple[Rule, ...] = (
    *_per_kind("self_attn.{kind}_scale", "canonical", ""),
    (
        "self_attn.kv_scale",
        ("k", "v"),
        "remapped",
        "deprecated single kv_scale: vLLM remaps it to k_scale and copies it into v_scale; save separate "
        "self_attn.k_scale and self_attn.v_scale",
    ),
    *_per_kind(
        "self_attn.attn.{kind}_scale",
        "remapped",
        "vLLM's runtime parameter name, loaded as is by vLLM 0.32 "
        "(older versions prefixed another '.attn' and dropped it); " + _RENAME,
    ),
    *_per_kind("self_attn.{kind}_proj.{kind}_scale", "remapped", "ModelOpt name, remapped by vLLM; " + _RENAME),
    *_per_kind("self_attn.qkv_proj.{kind}_scale", "remapped", "fused-QKV name, remapped by vLLM; " + _RENAME),
    *_per_kind("self_attn.{kind}_cache.scale", "remapped", "{kind}_cache.scale name, remapped by vLLM; " + _RENAME),
    *_per_kind(
        "self_attn.{kind}_proj.output_scale",
        "dropped",
        "old llm-compressor output_scale name: vLLM 0.32 has no mapping for it (older versions had), so it is not "
        "loaded as the {KIND} scale; " + _RENAME,
    ),
)


def classify(name: str) -> ScaleName | None:
    """The scale this tensor name stands for, or None if it is not a K/V scale."""
    match = _LAYER.match(name)
    if not match:
        return None
    rest = match["rest"]
    for suffix, kinds, fate, why in _RULES:
        if rest == suffix:
            return ScaleName(name, int(match["layer"]), kinds, fate, why)
    return None


def canonical_name(prefix: str, layer: int, kind: Kind) -> str:
    return f"{prefix}layers.{layer}.self_attn.{kind}_scale"


def layer_prefix(names: list[str]) -> str:
    """The prefix in front of `layers.N.` used by this checkpoint's weights (`model.` for most decoder models)."""
    for name in names:
        match = _LAYER.match(name)
        if match and match["rest"].startswith("self_attn."):
            return match["prefix"]
    return "model."


# Q scales (attention quantization): llm-compressor's name and vLLM's runtime name, both loaded by vLLM 0.32.
_QUERY_SUFFIXES = ("self_attn.q_scale", "self_attn.attn.q_scale")


def query_layer(name: str) -> int | None:
    """The layer whose q_scale this tensor is, or None."""
    match = _LAYER.match(name)
    return int(match["layer"]) if match and match["rest"] in _QUERY_SUFFIXES else None
