"""Small synthetic checkpoints in the real safetensors format: a config with a KV cache scheme, per-tensor or
per-head k/v scales for LAYERS layers, written to a folder."""

import json
from pathlib import Path
from typing import Any

from kvcal.verify.tensors import encode, write_safetensors

LAYERS, KV_HEADS = 3, 2
SCHEME = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": "tensor"}
Raw = dict[str, tuple[str, tuple[int, ...], bytes]]


def config(scheme: dict[str, Any] | None = SCHEME) -> dict[str, Any]:
    cfg: dict[str, Any] = {"num_hidden_layers": LAYERS, "num_attention_heads": 4, "num_key_value_heads": KV_HEADS}
    if scheme is not None:
        cfg["quantization_config"] = {"quant_method": "compressed-tensors", "kv_cache_scheme": dict(scheme)}
    return cfg


def scales(per_head: bool = False) -> Raw:
    raw: Raw = {"model.embed_tokens.weight": ("BF16", (2, 2), encode("BF16", [0.5, 1.0, 1.5, 2.0]))}
    for n in range(LAYERS):
        for kind, base in (("k", 0.03), ("v", 0.01)):
            values = [base * (n + 1) * (h + 1) for h in range(KV_HEADS)] if per_head else [base * (n + 1)]
            shape = (KV_HEADS, 1, 1) if per_head else (1,)
            raw[f"model.layers.{n}.self_attn.{kind}_scale"] = ("BF16", shape, encode("BF16", values))
    return raw


def write(tmp: Path, raw: Raw, cfg: dict[str, Any], report: dict[str, Any] | None = None) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(cfg))
    write_safetensors(tmp / "model.safetensors", raw)
    if report is not None:
        (tmp / "kvcal-report.json").write_text(json.dumps(report))
    return tmp
