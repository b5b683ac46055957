"""Emulation of what vLLM stores in an FP8 (E4M3) KV cache, and the numerics that judge a scale.

vLLM writes `fp8(x / scale)` with saturation at ±448 and reads back `float(q) * scale`; the scale is the checkpoint's
bf16 `k_scale`/`v_scale` widened to float32. CUDA kernels convert with round-to-nearest-even (`__NV_SATFINITE`), which
is what `Tensor.to(torch.float8_e4m3fn)` does: "nearest" is the default. vLLM's CPU backend was seen rounding toward
zero (440 -> 416); `rounding="toward-zero"` emulates that backend instead.
"""

from dataclasses import dataclass
from typing import Literal

import torch

FP8_MAX = 448.0
FP8_DTYPE = torch.float8_e4m3fn
Rounding = Literal["nearest", "toward-zero"]


def as_saved(scale: torch.Tensor) -> torch.Tensor:
    """The scale vLLM uses: rounded to bf16 (as saved in the checkpoint), then widened to float32."""
    return scale.to(torch.bfloat16).to(torch.float32)


def scale_for_absmax(absmax: torch.Tensor) -> torch.Tensor:
    """The static min-max scale for an observed max|x| (float32, before bf16 rounding); never zero."""
    return torch.clamp(absmax.to(torch.float32) / FP8_MAX, min=torch.finfo(torch.float32).tiny)


def to_fp8(y: torch.Tensor, rounding: Rounding = "nearest") -> torch.Tensor:
    """float32 values already divided by the scale -> float8_e4m3fn, saturating at ±448."""
    q = y.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    if rounding == "toward-zero":
        # Nearest rounding stepped one code away from zero where it overshot |y|: step back (same sign, one ulp).
        overshoot = q.to(torch.float32).abs() > y.abs()
        bits = q.view(torch.uint8)
        q = torch.where(overshoot, bits - 1, bits).view(FP8_DTYPE)
    return q


def quant_dequant(x: torch.Tensor, scale: torch.Tensor, rounding: Rounding = "nearest") -> torch.Tensor:
    """x (any float dtype) -> what attention reads back from an FP8 cache, in x's dtype.

    `scale` is float32 and broadcasts against x: shape () / (1,) per tensor, or (heads, 1, 1) per head for x laid out
    (batch, heads, tokens, head_dim) as attention sees it.
    """
    y = x.to(torch.float32) / scale
    return (to_fp8(y, rounding).to(torch.float32) * scale).to(x.dtype)


@dataclass
class ErrorStats:
    """Sums for clip rate and SQNR, per head (1-D tensors over heads), additive across batches."""

    count: torch.Tensor
    clipped: torch.Tensor
    signal: torch.Tensor
    noise: torch.Tensor

    @staticmethod
    def zeros(heads: int, device: torch.device | str = "cpu") -> "ErrorStats":
        z = torch.zeros(heads, dtype=torch.float64, device=device)
        return ErrorStats(z.clone(), z.clone(), z.clone(), z.clone())

    def to_cpu(self) -> None:
        self.count, self.clipped = self.count.cpu(), self.clipped.cpu()
        self.signal, self.noise = self.signal.cpu(), self.noise.cpu()

    def add(self, other: "ErrorStats") -> None:
        self.count += other.count
        self.clipped += other.clipped
        self.signal += other.signal
        self.noise += other.noise

    def clip_rate(self) -> torch.Tensor:
        return self.clipped / self.count.clamp(min=1)

    def sqnr_db(self) -> torch.Tensor:
        return 10 * torch.log10(self.signal.clamp(min=1e-30) / self.noise.clamp(min=1e-30))


def error_stats(x: torch.Tensor, scale: torch.Tensor, rounding: Rounding = "nearest") -> ErrorStats:
    """Clipped values (|x / scale| > 448) and SQNR sums per head for x laid out (batch, heads, tokens, head_dim)."""
    xf = x.to(torch.float32)
    deq = quant_dequant(xf, scale, rounding)
    dims = (0, 2, 3)
    per_head = xf[0, :, 0, 0].numel()
    return ErrorStats(
        count=torch.full((per_head,), xf.numel() / per_head, dtype=torch.float64, device=x.device),
        clipped=((xf / scale).abs() > FP8_MAX).sum(dim=dims).to(torch.float64),
        signal=xf.square().sum(dim=dims).to(torch.float64),
        noise=(xf - deq).square().sum(dim=dims).to(torch.float64),
    )
