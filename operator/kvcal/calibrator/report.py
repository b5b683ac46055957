"""kvcal-report.json (versioned), report.md and PNG heatmaps, plus the <=4096-byte summary for the Job's
termination message. The pydantic models below ARE the report schema: bump REPORT_VERSION on incompatible change."""

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from kvcal.calibrator.coverage import LengthCoverage
from kvcal.models.base import Model
from kvcal.models.status import ClipStats

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

REPORT_VERSION = 1
REPORT_FILE = "kvcal-report.json"
SUMMARY_LIMIT = 4096
SCALE_SETS = ("default", "tensor", "head", "oracle")


class Percentiles(Model):
    absmax: float
    p999: float = Field(description="99.9th percentile of |x| (histogram, within 1.1%)")
    p9999: float = Field(description="99.99th percentile of |x| (histogram, within 1.1%)")


class PerScaleSet(Model):
    """One number per scale set: 1.0, calibrated per-tensor, calibrated per-head, oracle (holdout's own max)."""

    default: float
    tensor: float
    head: float
    oracle: float


class HeadStats(Model):
    head: int
    scale: float = Field(description="The saved scale that applies to this head (bf16 value)")
    calibration: Percentiles
    holdout: Percentiles
    holdout_clip_rate: PerScaleSet
    holdout_sqnr_db: PerScaleSet


class LayerStats(Model):
    layer: int
    k: list[HeadStats]
    v: list[HeadStats]


ScaleOrigin = Literal["none", "1.0", "saved", "derived"]


class VariantResult(Model):
    nll: float
    kl_to_bf16: float
    top1_agreement: float
    kv_bytes_per_token: int | None = Field(default=None, description="KV-cache bytes per token, all layers, K and V")
    scales: ScaleOrigin | None = Field(
        default=None,
        description="none (BF16), 1.0, saved (this checkpoint's), derived (from the same calibration statistics, "
        "not in this checkpoint)",
    )
    simulated: str | None = Field(
        default=None, description="Set when serving cannot use these scales as measured here: why, and what it does"
    )


class EndToEnd(Model):
    tokens: int
    rounding: str
    bf16: VariantResult
    fp8_default: VariantResult
    fp8_calibrated: VariantResult = Field(description="The saved scales: equal to fp8Tensor or fp8Head by strategy")
    fp8_tensor: VariantResult | None = None
    fp8_head: VariantResult | None = None


class SensitiveLayer(Model):
    layer: int
    kind: Literal["k", "v"]
    sqnr_db: float
    clip_rate: float
    reason: str


class Provenance(Model):
    model_dir: str
    model_hash: str
    tokenizer_hash: str
    chat_template_hash: str | None = None
    dataset: str
    dataset_hash: str
    holdout_dataset: str | None = None
    holdout_hash: str | None = None
    seed: int
    samples: int
    tokens: int
    holdout_samples: int
    holdout_tokens: int
    max_seq_length: int
    truncated_samples: int
    truncated_tokens: int
    length_buckets: dict[str, dict[str, float]]
    strategy: str
    observer: str
    compressor_observer: str
    pipeline: str
    calibrated_by: str = "llm-compressor oneshot"  # or kvcal's one forward pass (calibrator/forward.py)
    target_dtype: str = "float8_e4m3fn"
    scale_dtype: str = "bfloat16"
    layers: int
    kv_heads: int
    head_dim: int
    versions: dict[str, str]
    model_revision: str | None = Field(default=None, description="spec.model.revision / the config's modelRevision")
    artifact_hash: str | None = Field(
        default=None,
        description="sha256 of the calibrated checkpoint's *.safetensors and config.json as written: `kvcal verify` "
        "recomputes it and refuses a checkpoint changed in place",
    )


class DeviceReport(Model):
    """Where the calibration computed (calibrator/placement.py) and what it cost there."""

    placement: Literal["cpu", "one-device", "several-devices", "layer-by-layer"]
    devices: list[str]
    dtype: str
    peak_device_memory_bytes: int | None = Field(default=None, description="Largest peak on any accelerator used")
    host_weight_bytes: int = Field(default=0, description="Weights onloaded from host memory per forward pass")
    disk_weight_bytes: int = Field(default=0, description="Weights onloaded from local disk per forward pass")
    calibration_tokens_per_second: float
    why: str = ""

    def summary_fields(self) -> dict[str, object]:
        return {
            "device": ",".join(self.devices),
            "placement": self.placement,
            "dtype": self.dtype,
            "peak_device_memory_bytes": self.peak_device_memory_bytes,
            "tokens_per_second": self.calibration_tokens_per_second,
        }


class Summary(Model):
    """The termination-message summary the operator copies into status.calibration."""

    samples: int
    tokens: int
    strategy: str
    observer: str
    k_scale_max: float
    v_scale_max: float
    holdout_clip_rate_default: ClipStats
    holdout_clip_rate_calibrated: ClipStats
    top1_agreement_default: float
    top1_agreement_calibrated: float
    duration_seconds: float
    artifact: str
    longest_sample_tokens: int | None = None
    served_context_tokens: int | None = None
    context_warning: str | None = None
    sensitive_layers: list[int] = Field(default=[], description="Layers of sensitive_layers, for protectedLayers")
    q_scale_max: float | None = Field(default=None, description="Largest q_scale, when Q was calibrated")
    model_hash: str | None = Field(default=None, description="sha256 of the BF16 weights read (provenance.modelHash)")
    model_revision: str | None = None
    device: str | None = Field(default=None, description="The devices that computed, e.g. cuda:0 or cpu")
    placement: str | None = None
    dtype: str | None = None
    peak_device_memory_bytes: int | None = None
    tokens_per_second: float | None = Field(default=None, description="Calibration pass tokens per second")
    report_version: int = REPORT_VERSION


class Report(Model):
    kind: Literal["KVCalibrationReport"] = "KVCalibrationReport"
    report_version: int = REPORT_VERSION
    provenance: Provenance
    scales: dict[str, list[list[float]]] = Field(description="'k'/'v' -> per layer, per KV head (saved, bf16)")
    layers: list[LayerStats]
    end_to_end: EndToEnd
    holdout_clip_rate: dict[str, ClipStats] = Field(
        description="'default' | 'calibrated' | 'tensor' | 'head' -> overall clip rates"
    )
    length_coverage: LengthCoverage | None = None
    sensitive_layers: list[SensitiveLayer]
    timings_seconds: dict[str, float]
    summary: Summary
    device: DeviceReport | None = None


def finite(x: float, cap: float = 1e9) -> float:
    """JSON has no inf/nan: SQNR of an exact quantization is capped."""
    if math.isnan(x):
        return 0.0
    return max(-cap, min(cap, x))


def summary_json(summary: Summary) -> str:
    text = json.dumps(summary.to_wire(), separators=(",", ":"))
    if len(text.encode()) > SUMMARY_LIMIT:
        raise ValueError(f"summary is {len(text.encode())} bytes, over the {SUMMARY_LIMIT}-byte termination limit")
    return text


def error_json(message: str) -> str:
    """Failure summary: the message, cut to fit the termination-message limit."""
    body = {"error": message, "reportVersion": REPORT_VERSION}
    text = json.dumps(body)
    while len(text.encode()) > SUMMARY_LIMIT:
        body["error"] = str(body["error"])[: len(str(body["error"])) - (len(text.encode()) - SUMMARY_LIMIT) - 4] + "…"
        text = json.dumps(body)
    return text


def write_json(report: Report, out: Path) -> Path:
    path = out / REPORT_FILE
    path.write_text(json.dumps(report.to_wire(), indent=1) + "\n", encoding="utf-8")
    return path


def load(path: Path) -> Report:
    return Report.model_validate_json(path.read_text(encoding="utf-8"))


def _pct(x: float) -> str:
    return f"{100 * x:.4f}%" if x else "0"


def _bytes(n: int | None) -> str:
    return f"{n:,}" if n is not None else "-"


def comparison_table(report: Report) -> str:
    """BF16 / FP8 1.0 / FP8 per tensor / FP8 per head on the same held-out tokens, printed by `kvcal calibrate`
    and written into report.md; rows serving cannot reproduce as measured are starred and explained below."""
    e = report.end_to_end
    clip = report.holdout_clip_rate
    rows: list[tuple[str, VariantResult, ClipStats | None]] = [
        ("BF16", e.bf16, None),
        ("FP8 scale 1.0", e.fp8_default, clip["default"]),
    ]
    if e.fp8_tensor is not None and e.fp8_head is not None:
        rows += [("FP8 per tensor", e.fp8_tensor, clip.get("tensor")), ("FP8 per head", e.fp8_head, clip.get("head"))]
    else:  # a report written before the per-tensor/per-head rows
        rows.append(("FP8 calibrated", e.fp8_calibrated, clip["calibrated"]))
    lines = [
        "| variant | scales | KV bytes/token | NLL | KL to BF16 | top-1 agreement | K clip rate | V clip rate |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    notes: list[str] = []
    for name, r, c in rows:
        kc, vc = (_pct(c.k), _pct(c.v)) if c else ("-", "-")
        mark = f" [{len(notes) + 1}]" if r.simulated else ""
        if r.simulated:
            notes.append(f"[{len(notes) + 1}] {name}: simulated; {r.simulated}")
        lines.append(
            f"| {name}{mark} | {r.scales or '-'} | {_bytes(r.kv_bytes_per_token)} | {r.nll:.4f} | {r.kl_to_bf16:.5f} "
            f"| {100 * r.top1_agreement:.2f}% | {kc} | {vc} |"
        )
    return "\n".join([*lines, *(["", *notes] if notes else [])])


def coverage_line(report: Report) -> str:
    c = report.length_coverage
    if c is None:
        return ""
    head = (
        f"Length coverage: calibration samples reach {c.longest_sample_tokens} tokens (median "
        f"{c.median_sample_tokens}) of the {c.served_context_tokens}-token context served "
        f"({c.served_context_source}): {100 * c.covered_fraction:.1f}%."
    )
    return f"{head}\n\n**Warning:** {c.warning}" if c.warning else head


def device_line(device: DeviceReport) -> str:
    """device: where it computed, the dtype, the peak accelerator memory and the calibration pass's rate."""
    peak = (
        f", peak device memory {device.peak_device_memory_bytes / (1 << 30):.2f} GiB"
        if device.peak_device_memory_bytes is not None
        else ""
    )
    onload = ""
    if device.host_weight_bytes or device.disk_weight_bytes:
        onload = (
            f", {device.host_weight_bytes / (1 << 30):.1f} GiB of weights onloaded from host memory and "
            f"{device.disk_weight_bytes / (1 << 30):.1f} GiB from disk per pass"
        )
    return (
        f"device: {','.join(device.devices)} ({device.placement}: {device.why}), {device.dtype}{peak}{onload}; "
        f"calibration pass {device.calibration_tokens_per_second:,.0f} tokens/s."
    )


def markdown(report: Report) -> str:
    p, s = report.provenance, report.summary
    out = [
        "# kvcal calibration report",
        "",
        f"Model `{p.model_dir}` (sha256 {p.model_hash[:16]}), strategy **{p.strategy}**, observer **{p.observer}** "
        f"(llm-compressor `{p.compressor_observer}`), pipeline {p.pipeline}, calibrated by {p.calibrated_by}, "
        f"target {p.target_dtype}, "
        f"scales saved as {p.scale_dtype}.",
        f"Calibration: {p.samples} samples, {p.tokens} tokens (max {p.max_seq_length}; {p.truncated_samples} samples "
        f"truncated, {p.truncated_tokens} tokens dropped). Holdout: {p.holdout_samples} samples, {p.holdout_tokens} "
        f"tokens. Seed {p.seed}.",
        *([device_line(report.device), ""] if report.device else [""]),
        "## Held-out comparison (K/V quantize-dequantized as vLLM stores them, "
        f"rounding: {report.end_to_end.rounding})",
        "",
        comparison_table(report),
        "",
        coverage_line(report),
        "",
        f"Scale max: K {s.k_scale_max:.5g}, V {s.v_scale_max:.5g}. Duration {s.duration_seconds:.1f} s.",
        "",
        "## Sensitive layers (lowest SQNR with calibrated scales: candidates for staying in BF16)",
        "",
        "| layer | K/V | SQNR dB | clip rate | why |",
        "|---:|---|---:|---:|---|",
        *(
            f"| {x.layer} | {x.kind.upper()} | {x.sqnr_db:.2f} | {_pct(x.clip_rate)} | {x.reason} |"
            for x in report.sensitive_layers
        ),
        "",
        "## Per layer (worst head): scale; holdout clip rate at 1.0 and calibrated; SQNR dB at 1.0, calibrated, oracle",
        "",
        "| layer | K scale | K clip 1.0 | K clip cal | K SQNR 1.0 | K SQNR cal | K SQNR oracle "
        "| V scale | V clip 1.0 | V clip cal | V SQNR 1.0 | V SQNR cal | V SQNR oracle |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    cal = "head" if p.strategy == "head" else "tensor"
    for layer in report.layers:
        cells = [str(layer.layer)]
        for heads in (layer.k, layer.v):
            cells += [
                f"{max(h.scale for h in heads):.4g}",
                _pct(max(h.holdout_clip_rate.default for h in heads)),
                _pct(max(getattr(h.holdout_clip_rate, cal) for h in heads)),
                f"{min(h.holdout_sqnr_db.default for h in heads):.2f}",
                f"{min(getattr(h.holdout_sqnr_db, cal) for h in heads):.2f}",
                f"{min(h.holdout_sqnr_db.oracle for h in heads):.2f}",
            ]
        out.append("| " + " | ".join(cells) + " |")
    out += [
        "",
        "Plots: `scales.png` (scale per layer x KV head, K and V on one log colour scale), `clip-rate.png` (holdout "
        "clip rate at 1.0, per tensor and per head, one colour scale).",
        "",
        "## Provenance",
        "",
        "```json",
        json.dumps(p.to_wire(), indent=1),
        "```",
        "",
        "Timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in report.timings_seconds.items()),
        "",
    ]
    return "\n".join(out)


PLOTS = ("scales.png", "clip-rate.png")


def figures(report: Report) -> dict[str, "Figure"]:
    """Heatmaps KV head (rows) x layer (columns), whole-number ticks. scales.png: K and V on one log colour scale.
    clip-rate.png: holdout clip rate at 1.0, per tensor and per head, K and V, on one linear colour scale from 0
    (an all-zero panel is drawn in the colour of 0 and titled so, not stretched over a meaningless range).

    Figures on an Agg canvas without pyplot, and fixed margins instead of constrained layout: both cost a calibration
    Job seconds (measured: constrained layout alone was two thirds of the drawing time) for the same picture."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    def figure(width: float, height: float, rows: int, cols: int) -> tuple["Figure", "np.ndarray[Any, Any]"]:
        fig = Figure(figsize=(width, height))
        FigureCanvasAgg(fig)
        axes = fig.subplots(rows, cols, squeeze=False)
        fig.subplots_adjust(left=0.06, right=0.98, bottom=0.1, top=0.92, hspace=0.55, wspace=0.25)
        return fig, axes

    def grid(kind: str, value: str) -> "np.ndarray[tuple[int, int], np.dtype[np.float64]]":
        rows = []
        for layer in report.layers:
            heads = layer.k if kind == "k" else layer.v
            rows.append([h.scale if value == "scale" else getattr(h.holdout_clip_rate, value) for h in heads])
        return np.asarray(rows, dtype=np.float64).T

    def whole_ticks(ax: "Axes") -> None:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(xlabel="layer", ylabel="KV head")

    strategy = report.provenance.strategy
    scales = {kind: grid(kind, "scale") for kind in ("k", "v")}
    positive = np.concatenate([g[g > 0] for g in scales.values()])
    scale_norm = LogNorm(vmin=positive.min(), vmax=positive.max()) if positive.size else Normalize(0, 1)
    fig_scales, axes = figure(10, 4.5, 2, 1)
    for ax, kind in zip(axes[:, 0], ("k", "v"), strict=True):
        im = ax.imshow(scales[kind], aspect="auto", cmap="viridis", norm=scale_norm, interpolation="nearest")
        ax.set_title(f"{kind.upper()} scale ({strategy})")
        whole_ticks(ax)
    fig_scales.colorbar(im, ax=axes[:, 0].tolist(), label="scale (log)")

    columns = (("default", "scale 1.0"), ("tensor", "per tensor"), ("head", "per head"))
    clip = {(kind, value): 100 * grid(kind, value) for kind in ("k", "v") for value, _ in columns}
    top = max(float(g.max()) for g in clip.values())
    clip_norm = Normalize(vmin=0.0, vmax=top if top > 0 else 1.0)  # all zero: 0 still maps to the bottom colour
    fig_clip, axes = figure(16, 5, 2, 3)
    for row, kind in enumerate(("k", "v")):
        for col, (value, label) in enumerate(columns):
            ax, data = axes[row][col], clip[(kind, value)]
            im = ax.imshow(data, aspect="auto", cmap="magma", norm=clip_norm, interpolation="nearest")
            zero = " (all zero)" if not data.any() else ""
            ax.set_title(f"{kind.upper()} holdout clip rate %, {label}{zero}")
            whole_ticks(ax)
    fig_clip.colorbar(im, ax=axes.ravel().tolist(), label="holdout clip rate %")
    return dict(zip(PLOTS, (fig_scales, fig_clip), strict=True))


def plot(report: Report, out: Path) -> list[Path]:
    paths = []
    for name, fig in figures(report).items():
        paths.append(out / name)
        fig.savefig(paths[-1], dpi=90)
    return paths
