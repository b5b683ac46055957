"""`kvcal verify CHECKPOINT_DIR --data PROMPTS`: the checkpoint's scales held against what its own weights make of real
prompts, without trusting whoever made them.

KV-only FP8 quantization leaves the weights in BF16, so the checkpoint can run its prompts itself: the calibrator's
taps (kvcal.calibrator.taps) read every attention layer's post-RoPE K and V, per KV head, and score them under the
checkpoint's own k_scale / v_scale (what an FP8 cache would store: clipped at 448 x scale, rounded to E4M3). A layer
fails where more than ``clip_limit`` of a head's values clip (scales too small for this data, or weights changed after
the scales were made: they now make larger K/V) or where the largest value uses less than ``range_floor`` of the
scale's range (scales far too large: FP8's precision wasted, or weights changed the other way). Static verification
cannot see either: it reads the scales, not what they are applied to.
"""

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcal.verify.problems import Problem
from kvcal.verify.static import FP8_E4M3_MAX, LayerScales, StaticResult

# A head whose values clip more often than this fails: a calibrated scale clips nothing of its own data, and held-out
# prompts (the calibrator's report) clip at most a few in 10,000.
CLIP_LIMIT = 1e-3
# The largest value must use at least this share of the scale's range: a per-tensor scale leaves quiet heads below
# it by design (the layer's max over heads sets it), so only the layer's loudest head is held to it.
RANGE_FLOOR = 1 / 16


@dataclass(frozen=True)
class HeadReading:
    layer: int
    kind: str  # k or v
    head: int
    scale: float
    absmax: float
    clip_rate: float
    sqnr_db: float

    @property
    def range_used(self) -> float:
        """The largest value / the scale's range (448 x scale): above 1 it clips."""
        return self.absmax / (FP8_E4M3_MAX * self.scale) if self.scale > 0 else math.inf


@dataclass
class DataResult:
    samples: int
    tokens: int
    readings: list[HeadReading] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "samples": self.samples, "tokens": self.tokens,
            "problems": [problem.to_json() for problem in self.problems],
            "heads": [reading.__dict__ | {"rangeUsed": reading.range_used} for reading in self.readings],
        }  # fmt: skip


def judge(
    readings: Sequence[HeadReading], clip_limit: float = CLIP_LIMIT, range_floor: float = RANGE_FLOOR
) -> list[Problem]:
    """Each layer and tensor whose heads clip past ``clip_limit``, or whose loudest head uses less than
    ``range_floor`` of its scale's range: one problem each, naming the layer, the tensor and the worst head (pure)."""
    problems = []
    groups: dict[tuple[int, str], list[HeadReading]] = {}
    for reading in readings:
        groups.setdefault((reading.layer, reading.kind), []).append(reading)
    for (layer, kind), heads in sorted(groups.items()):
        tensor = f"{kind}_scale"
        worst = max(heads, key=lambda head: head.clip_rate)
        if worst.clip_rate > clip_limit:
            problems.append(Problem(
                "data-clips",
                f"{worst.clip_rate:.2%} of head {worst.head}'s {kind.upper()} values clip on these prompts (max |x| "
                f"{worst.absmax:.4g} is {worst.range_used:.1f}x the range of scale {worst.scale:.4g}; limit "
                f"{clip_limit:.2%}): the scales were made for other data or for other weights (recalibrate on "
                "representative prompts, or check that the weights are the ones calibrated)",
                layer=layer, tensor=tensor,
            ))  # fmt: skip
            continue
        loudest = max(heads, key=lambda head: head.range_used)
        if loudest.range_used < range_floor:
            problems.append(Problem(
                "data-range-unused",
                f"the largest {kind.upper()} value on these prompts (head {loudest.head}, {loudest.absmax:.4g}) uses "
                f"{loudest.range_used:.1%} of the range of scale {loudest.scale:.4g} (floor {range_floor:.1%}): the "
                "scale is far larger than the data needs and FP8's precision is wasted (recalibrate; the weights may "
                "have changed since)",
                layer=layer, tensor=tensor,
            ))  # fmt: skip
    return problems


def check_data(
    directory: Path,
    static: StaticResult,
    prompts: Path,
    *,
    samples: int = 32,
    max_length: int = 512,
    clip_limit: float = CLIP_LIMIT,
    range_floor: float = RANGE_FLOOR,
) -> DataResult:
    """Run up to ``samples`` records of ``prompts`` (the calibration dataset's JSONL formats) through the checkpoint's
    own BF16 weights and judge its scales (``static``: as vLLM will load them) on every layer's K and V."""
    import torch

    from kvcal.calibrator import data
    from kvcal.calibrator.taps import KINDS, Tap, attach, detach

    model, tokenizer = _load(directory)
    records = data.read_records(prompts)[:samples]
    if not records:
        raise ValueError(f"{prompts}: no prompts")
    scales = _scale_set(static.scales, static.shape.layers)
    tap = Tap(heads=static.shape.kv_heads, score={"checkpoint": scales})
    handles = attach(model, tap)
    tokens = 0
    try:
        with torch.no_grad():
            for record in records:
                sample = data.truncate(data.render(record, tokenizer), max_length, record.source, record.kind)
                tokens += len(sample.input_ids)
                model(torch.tensor([sample.input_ids], device=model.device), use_cache=False)
    finally:
        detach(handles)
    tap.to_cpu()
    readings = []
    for layer in range(static.shape.layers):
        for kind in KINDS:
            errors = tap.errors.get(("checkpoint", layer, kind))
            observed = tap.observed.get((layer, kind))
            if errors is None or observed is None:
                continue
            per_head = _per_head(getattr(static.scales.get(layer, LayerScales()), kind), static.shape.kv_heads)
            clip, sqnr = errors.clip_rate(), errors.sqnr_db()
            for head in range(static.shape.kv_heads):
                readings.append(HeadReading(
                    layer=layer, kind=kind, head=head, scale=per_head[head], absmax=float(observed.absmax[head]),
                    clip_rate=float(clip[head]), sqnr_db=float(sqnr[head]),
                ))  # fmt: skip
    return DataResult(len(records), tokens, readings, judge(readings, clip_limit, range_floor))


def _per_head(values: tuple[float, ...], heads: int) -> list[float]:
    if not values:
        return [1.0] * heads  # no scale: vLLM runs the layer at 1.0 (static verification says so)
    return list(values) if len(values) == heads else [values[0]] * heads


def _scale_set(scales: dict[int, LayerScales], layers: int) -> dict[str, list[Any]]:
    """The checkpoint's scales as the taps score them: per layer, (1,) per tensor or (heads, 1, 1) per head."""
    import torch

    out: dict[str, list[Any]] = {}
    for kind in ("k", "v"):
        out[kind] = []
        for layer in range(layers):
            values = getattr(scales.get(layer, LayerScales()), kind) or (1.0,)
            tensor = torch.tensor(values, dtype=torch.float32)
            out[kind].append(tensor.view(-1, 1, 1) if len(values) > 1 else tensor.view(1))
    return out


def _load(directory: Path) -> tuple[Any, Any]:
    """The checkpoint's model in BF16 without its quantization_config (only its scales would load from it, and
    transformers would then quantize K/V itself: the taps must see what the weights make), and its tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(directory)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    # On the GPUs where there are some (the layers spread over them as they fit), else on the CPU.
    placement = {"device_map": "auto"} if torch.cuda.is_available() else {}
    model = AutoModelForCausalLM.from_pretrained(directory, config=config, dtype=torch.bfloat16, **placement)
    model.eval()  # type: ignore[no-untyped-call]
    return model, AutoTokenizer.from_pretrained(directory)


def lines(result: DataResult) -> list[str]:
    """What `kvcal verify --data` prints: the problems, then a summary line."""
    out = [f"FAIL {problem.line()}" for problem in result.problems]
    worst = max(result.readings, key=lambda reading: reading.clip_rate, default=None)
    summary = f"data: {result.samples} prompts, {result.tokens} tokens through the checkpoint's BF16 weights"
    if worst is not None:
        summary += (
            f"; worst head clips {worst.clip_rate:.3%} (layer {worst.layer} {worst.kind.upper()} head {worst.head})"
        )
    return [*out, summary + (": OK" if result.ok else f": {len(result.problems)} problem(s)")]


def dumps(result: DataResult) -> str:
    return json.dumps(result.to_json(), indent=2)
