"""FP8 KV emulation against torch's float8 conversion: division by the scale, saturation at ±448, rounding."""

import pytest
import torch

from kvcal.calibrator.quant import FP8_MAX, ErrorStats, as_saved, error_stats, quant_dequant, scale_for_absmax, to_fp8


def test_matches_torch_float8_math_inside_range() -> None:
    x = torch.randn(2, 3, 17, 8) * 40
    scale = torch.tensor(0.37)
    want = (x / scale).to(torch.float8_e4m3fn).to(torch.float32) * scale
    assert torch.equal(quant_dequant(x, scale), want)


def test_saturates_at_448_instead_of_nan() -> None:
    x = torch.tensor([1000.0, -1000.0, 448.0, 500.0])
    out = quant_dequant(x, torch.tensor(1.0))
    assert out.tolist() == [FP8_MAX, -FP8_MAX, FP8_MAX, FP8_MAX]


def test_toward_zero_rounding_matches_the_cpu_backend_probe() -> None:
    # vLLM's CPU backend stored 440 as 416 (toward zero); CUDA rounds to nearest (448).
    x = torch.tensor([440.0, -440.0, 0.3, 17.0])
    assert to_fp8(x, "nearest").to(torch.float32).tolist()[:2] == [448.0, -448.0]
    tz = to_fp8(x, "toward-zero").to(torch.float32)
    assert tz.tolist()[:2] == [416.0, -416.0]
    assert (tz.abs() <= x.abs()).all()
    assert tz[3] == 16.0


def test_per_head_scale_broadcasts_over_batch_tokens_dim() -> None:
    x = torch.ones(1, 2, 4, 3)
    x[:, 1] *= 100
    scale = torch.tensor([1.0, 0.1]).view(2, 1, 1)
    stats = error_stats(x, scale)
    assert stats.clip_rate().tolist() == [0.0, 1.0]  # 100 / 0.1 = 1000 > 448


def test_error_stats_sum_and_sqnr() -> None:
    x = torch.tensor([[[[1.0, 2.0, 600.0, -3.0]]]])
    e = ErrorStats.zeros(1)
    e.add(error_stats(x, torch.tensor(1.0)))
    e.add(error_stats(x, torch.tensor(1.0)))
    assert e.count.item() == 8 and e.clipped.item() == 2
    assert e.clip_rate().item() == pytest.approx(0.25)
    noise = 2 * (600.0 - 448.0) ** 2
    assert e.sqnr_db().item() == pytest.approx(10 * torch.log10(torch.tensor(2 * (1 + 4 + 360000 + 9) / noise)).item())


def test_scale_is_rounded_like_the_saved_bf16() -> None:
    s = scale_for_absmax(torch.tensor(448.0 * 1.003))
    assert as_saved(s).item() == torch.tensor(1.003).to(torch.bfloat16).item()
    assert scale_for_absmax(torch.tensor(0.0)).item() > 0
