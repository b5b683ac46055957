"""The scales `kvcal calibrate` saves are the running max|K|, |V| of one plain forward pass, bit for bit.

kvcal runs llm-compressor's oneshot with the model's own attention (calibrator/attention.py) instead of the eager
attention llm-compressor forces, which is quadratic in the sample length. The proof that nothing else changed: the
k_scale/v_scale tensors in the saved checkpoint equal, exactly, the static min-max scales derived from our taps on a
plain forward pass of the same tokens (no llm-compressor involved), per tensor and per KV head. Under eager attention
the later layers' K/V differ in the last bits, and so do some of the scales: this test fails there.
"""

from pathlib import Path

import pytest

from kvcal.calibrator.config import CalibrationConfig
from kvcal.calibrator.evaluate import ScaleSet, per_head_scales, per_tensor_scales
from kvcal.calibrator.run import calibrate, plan_data
from kvcal.calibrator.taps import KINDS, Tap, attach, detach
from kvcal.demo import CALIBRATION_SET, HOLDOUT_SET

pytestmark = [pytest.mark.model, pytest.mark.slow]

LAYERS, KV_HEADS = 30, 3


def plain_forward_scales(model_dir: Path, config: CalibrationConfig) -> tuple[ScaleSet, ScaleSet]:
    """(per tensor, per head) static min-max scales from the taps on a plain BF16 decoder forward pass."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    plan = plan_data(config, AutoTokenizer.from_pretrained(model_dir))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    tap = Tap(KV_HEADS)
    handles = attach(model, tap)
    try:
        with torch.no_grad():
            for sample in plan.calibration:
                model.get_decoder()(input_ids=torch.tensor([sample.input_ids]), use_cache=False)
    finally:
        detach(handles)
    return per_tensor_scales(tap.observed, LAYERS), per_head_scales(tap.observed, LAYERS)


def saved_scales(checkpoint: Path) -> ScaleSet:
    import torch
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in checkpoint.glob("*.safetensors"):
        tensors.update(load_file(f))
    return {kind: [tensors[f"model.layers.{i}.self_attn.{kind}_scale"] for i in range(LAYERS)] for kind in KINDS}


def mismatches(saved: ScaleSet, derived: ScaleSet) -> list[tuple[str, int, list[float], list[float]]]:
    import torch

    out = []
    for kind in KINDS:
        for layer, (s, d) in enumerate(zip(saved[kind], derived[kind], strict=True)):
            widened = s.to(torch.float32)  # saved as bf16; the derived ones are bf16 values widened to float32
            if s.dtype != torch.bfloat16 or widened.shape != d.shape or not torch.equal(widened, d):
                out.append((kind, layer, widened.flatten().tolist(), d.flatten().tolist()))
    return out


def test_saved_scales_equal_plain_forward_maxima_bit_for_bit(demo_model_dir: Path, tmp_path: Path) -> None:
    configs = {
        strategy: CalibrationConfig(
            model_dir=demo_model_dir,
            data=CALIBRATION_SET,
            holdout_data=HOLDOUT_SET,
            out=tmp_path / strategy,
            strategy=strategy,
            samples=2,
            max_seq_length=512,
            holdout_samples=1,
            length_distribution={1024: 1.0},  # the two 0.8k-token retrieval prompts, cut to 512 tokens
            pipeline="basic",
            plots=False,
        )
        for strategy in ("tensor", "head")
    }
    per_tensor, per_head = plain_forward_scales(demo_model_dir, configs["tensor"])
    for strategy, derived in (("tensor", per_tensor), ("head", per_head)):
        calibrate(configs[strategy])
        assert mismatches(saved_scales(configs[strategy].out), derived) == [], strategy
