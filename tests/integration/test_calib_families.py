"""The calibrator's K/V taps on the attention layouts vLLM serves with FP8 KV, on tiny random models built from
transformers' own config classes (no download): every layer is found the way compressed-tensors' KV cache hook finds
it (fused qkv_proj too), and what the taps observe per layer and KV head is the max |K|, |V| of the KV cache
transformers itself returns. A layout the hook cannot take is refused in preflight, in one line, before any weight
loads."""

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from kvcal.calibrator.preflight import InputError, check_attention
from kvcal.calibrator.taps import Tap, attach, attention_layers, detach, uncalibratable

pytestmark = pytest.mark.model

LAYERS, KV_HEADS, HEAD_DIM = 3, 2, 16
SMALL: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
FAMILIES: dict[str, tuple[type[transformers.PretrainedConfig], dict[str, Any]]] = {
    "llama (GQA)": (transformers.LlamaConfig, {"num_key_value_heads": KV_HEADS}),
    "qwen2 (QKV bias)": (transformers.Qwen2Config, {"num_key_value_heads": KV_HEADS}),
    "qwen3 (q/k norm)": (transformers.Qwen3Config, {"num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM}),
    "gemma2 (sliding window)": (
        transformers.Gemma2Config,
        {"num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "sliding_window": 8},
    ),
    "phi3 (fused qkv_proj)": (transformers.Phi3Config, {"num_key_value_heads": KV_HEADS}),
}


def tiny(config_class: type[transformers.PretrainedConfig], extra: dict[str, Any]) -> torch.nn.Module:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config_class(**SMALL, **extra))
    return model.eval()


def cache_absmax(cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """max |K| and |V| per KV head of one layer, read from the cache transformers returned: (batch, heads, tokens,
    head_dim)."""
    keys, values = cache.layers[layer].keys, cache.layers[layer].values
    return tuple(t.abs().amax(dim=(0, 2, 3)).float() for t in (keys, values))  # type: ignore[return-value]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_taps_see_every_layer_and_what_the_kv_cache_holds(family: str) -> None:
    model = tiny(*FAMILIES[family])
    assert [int(attn.layer_idx) for attn in attention_layers(model)] == list(range(LAYERS))
    tap = Tap(heads=KV_HEADS)
    handles = attach(model, tap)
    try:
        tokens = torch.randint(3, 128, (2, 6))  # shorter than gemma2's window: its cache keeps every token
        with torch.no_grad():
            cache = model(tokens, use_cache=True).past_key_values
    finally:
        detach(handles)
    for layer in range(LAYERS):
        for kind, expected in zip(("k", "v"), cache_absmax(cache, layer), strict=True):
            observed = tap.observed[(layer, kind)].absmax
            assert torch.allclose(observed, expected, rtol=0.02), (family, layer, kind, observed, expected)


def test_a_layout_the_kv_hook_cannot_take_is_refused_in_preflight_in_one_line(tmp_path: Path) -> None:
    neox = tiny(transformers.GPTNeoXConfig, {})
    why = uncalibratable(neox)
    assert why is not None and "GPTNeoXForCausalLM" in why and "GPTNeoXAttention" in why
    neox.save_pretrained(tmp_path)
    with pytest.raises(InputError) as refused:
        check_attention(tmp_path)
    message = str(refused.value)
    assert "\n" not in message and str(tmp_path) in message and "no K/V scale can be calibrated" in message
    assert uncalibratable(tiny(*FAMILIES["phi3 (fused qkv_proj)"])) is None
