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
    model = transformers.AutoModelForCausalLM.from_config(config_class(**{**SMALL, **extra}))
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


# --- the real calibrator (the Job's entrypoint) on each layout, per tensor and per head ----------------------------

# Layer 0's second KV head's values, planted: per-head scales must tell it apart. On V, because Qwen3 normalises each
# key head after its projection (K is observed after that norm and RoPE): a planted key factor vanishes there.
OUTLIER = 8.0


def plant_value_outlier(model: torch.nn.Module) -> None:
    """Multiply layer 0's KV head 1 value projection by OUTLIER (v_proj rows, or the V rows of a fused qkv_proj)."""
    attn = attention_layers(model)[0]
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    head_dim = getattr(model.config, "head_dim", None) or head_dim
    with torch.no_grad():
        if hasattr(attn, "v_proj"):
            attn.v_proj.weight[head_dim : 2 * head_dim] *= OUTLIER
        else:  # qkv_proj: [q (heads x head_dim); k (kv_heads x head_dim); v (kv_heads x head_dim)]
            start = (model.config.num_attention_heads + KV_HEADS + 1) * head_dim
            attn.qkv_proj.weight[start : start + head_dim] *= OUTLIER


@pytest.fixture(scope="module")
def family_checkpoints(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family as a bf16 checkpoint folder with the demo model's tokenizer (its vocabulary sizes the model)."""
    import shutil

    root = tmp_path_factory.mktemp("families")
    out = {}
    for family, (config_class, extra) in FAMILIES.items():
        model = tiny(config_class, {**extra, "vocab_size": 49152, "max_position_embeddings": 512})
        plant_value_outlier(model)
        folder = root / family.split(" ")[0]
        model.to(torch.bfloat16).save_pretrained(folder)
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy2(demo_model_dir / name, folder / name)
        out[family] = folder
    return out


def calibrate(model_dir: Path, out: Path, strategy: str, **extra: object) -> tuple[int, Path]:
    import json

    from kvcal.calibrator.__main__ import main
    from kvcal.demo import CALIBRATION_SET, HOLDOUT_SET

    config = {
        "modelDir": str(model_dir), "data": str(CALIBRATION_SET), "holdoutData": str(HOLDOUT_SET),
        "out": str(out / "checkpoint"), "strategy": strategy, "observer": "static-minmax", "samples": 4,
        "maxSeqLength": 64, "holdoutSamples": 2, "lengthDistribution": {256: 1.0}, "seed": 0, **extra,
    }  # fmt: skip
    (out / "config.json").write_text(json.dumps(config))
    rc = main(["--config", str(out / "config.json"), "--termination-log", str(out / "termination-log")])
    return rc, out / "checkpoint"


@pytest.mark.parametrize("strategy", ["tensor", "head"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_calibrates_per_tensor_and_per_head(
    family: str, strategy: str, family_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """Saved scales = the observed max |x| / 448 per KV head (per tensor: the max over heads), within 2% (bf16)."""
    import json

    from safetensors.torch import load_file

    rc, checkpoint = calibrate(family_checkpoints[family], tmp_path, strategy)
    assert rc == 0, (tmp_path / "termination-log").read_text()
    saved = {k: v.float() for f in checkpoint.glob("*.safetensors") for k, v in load_file(f).items()}
    report = json.loads((checkpoint / "kvcal-report.json").read_text())
    assert [layer["layer"] for layer in report["layers"]] == list(range(LAYERS))
    for layer in report["layers"]:
        for kind in ("k", "v"):
            (name,) = [n for n in saved if n.endswith(f"layers.{layer['layer']}.self_attn.{kind}_scale")]
            observed = torch.tensor([head["calibration"]["absmax"] for head in layer[kind]]) / 448
            expected = observed if strategy == "head" else observed.max().expand(KV_HEADS)
            scale = saved[name].flatten().expand(KV_HEADS) if strategy == "tensor" else saved[name].flatten()
            assert saved[name].numel() == (KV_HEADS if strategy == "head" else 1), (name, saved[name].shape)
            assert torch.allclose(scale, expected, rtol=0.02), (family, name, scale, expected)
    v0 = saved[next(n for n in saved if n.endswith("layers.0.self_attn.v_scale"))].flatten()
    if strategy == "head":  # the planted head stands out in its own scale
        assert v0[1] > 2 * v0[0], (family, v0)
