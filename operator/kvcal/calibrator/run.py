"""calibrate(config): preflight -> oneshot (our taps ride along) -> save -> held-out evaluation -> report."""

import hashlib
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import torch

from kvcal.calibrator import data, forward
from kvcal.calibrator.attention import model_attention
from kvcal.calibrator.config import CalibrationConfig
from kvcal.calibrator.coverage import LengthCoverage, length_coverage
from kvcal.calibrator.evaluate import HoldoutResult, ScaleSet, evaluate_holdout, per_head_scales, per_tensor_scales
from kvcal.calibrator.placement import (
    DTYPE,
    Placement,
    check_deadline,
    estimate_work,
    host_memory_bytes,
    load_model,
    measure_flops_per_second,
    peak_device_memory,
    plan_placement,
    reset_peak_memory,
    visible_accelerators,
    working_bytes,
)
from kvcal.calibrator.preflight import (
    InputError,
    ModelInfo,
    check_attention,
    check_lengths,
    check_output,
    inspect_model,
)
from kvcal.calibrator.preflight import prepare_output as _prepare_output
from kvcal.calibrator.recipe import choose_pipeline, read_query_scales, read_scales, run_oneshot
from kvcal.calibrator.report import (
    SCALE_SETS,
    DeviceReport,
    EndToEnd,
    HeadStats,
    LayerStats,
    Percentiles,
    PerScaleSet,
    Provenance,
    Report,
    ScaleOrigin,
    SensitiveLayer,
    Summary,
    VariantResult,
    finite,
    markdown,
    plot,
    write_json,
)
from kvcal.calibrator.taps import KINDS, Tap, TensorStats, attach, detach
from kvcal.models.status import ClipStats
from kvcal.verify.digest import sha256_files, weights_digest

log = logging.getLogger(__name__)
VERSIONED = ("torch", "transformers", "llmcompressor", "compressed-tensors", "kvcal")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")
SENSITIVE_LAYERS = 3
BYTES_PER_ELEMENT = {"bf16": 2, "fp8": 1}
ONESHOT_STEP = "calibrate (llm-compressor oneshot)"
FORWARD_STEP = "calibrate (one forward pass, static min-max)"
# Where vLLM can serve per-head scales (the background primer and kvcal verify --runtime on the CPU backend).
PER_HEAD_SERVING = (
    "vLLM applies per-head scales only on attention backends that support them (FlashAttention); others, e.g. "
    "the CPU backend, take the max over heads, which serves the per-tensor row"
)


@dataclass
class DataPlan:
    calibration: list[data.Sample]
    holdout: list[data.Sample]
    buckets: dict[int, dict[str, float]]
    dataset_hash: str
    holdout_hash: str | None


class Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        log.info("%s ...", name)
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - t


Parsed = tuple[list[data.Record], list[data.Record] | None]  # calibration records, separate holdout records


def read_data(config: CalibrationConfig) -> Parsed:
    return data.read_records(config.data), data.read_records(config.holdout_data) if config.holdout_data else None


def plan_data(config: CalibrationConfig, tokenizer: data.Tokenizer, parsed: Parsed | None = None) -> DataPlan:
    """Parse, tokenize, split, sample and truncate — everything about data that can fail, before the model loads."""
    records, held_out = parsed or read_data(config)
    if held_out is not None:
        pool, held = records, held_out
    else:
        cal_ix, hold_ix = data.split_indices(len(records), config.holdout_fraction, config.seed)
        if not hold_ix:
            raise InputError(f"{config.data}: {len(records)} record(s) leave nothing to hold out; add data")
        pool, held = [records[i] for i in cal_ix], [records[i] for i in hold_ix]
    wanted = config.sample_count(len(pool))
    if len(pool) < wanted:
        raise InputError(
            f"{config.data}: asked for {wanted} calibration samples but only {len(pool)} are available "
            f"after holding out {len(records) - len(pool)}; lower --samples or add data"
        )
    pool_ids = [data.render(r, tokenizer) for r in pool]
    sel = data.select_by_length(
        [len(i) for i in pool_ids], wanted, config.length_buckets, config.length_distribution, config.seed
    )
    held_ids = [data.render(r, tokenizer) for r in held]
    held_wanted = config.holdout_count(len(sel.indices), len(held))
    if held_wanted < len(held):  # along the held-out pool's own lengths
        keep = data.select_by_length(
            [len(i) for i in held_ids], held_wanted, config.length_buckets, None, config.seed
        ).indices
        held, held_ids = [held[i] for i in keep], [held_ids[i] for i in keep]
    cal = [data.truncate(pool_ids[i], config.max_seq_length, pool[i].source, pool[i].kind) for i in sel.indices]
    hold = [data.truncate(ids, config.max_seq_length, r.source, r.kind) for r, ids in zip(held, held_ids, strict=True)]
    for name, samples in (("calibration", cal), ("holdout", hold)):
        cut = [s for s in samples if s.truncated]
        if cut:
            log.warning(
                "%s: %d of %d samples truncated to %d tokens (%d tokens dropped)",
                name,
                len(cut),
                len(samples),
                config.max_seq_length,
                sum(s.original_length - len(s.input_ids) for s in cut),
            )
    return DataPlan(
        cal,
        hold,
        sel.buckets,
        data.content_hash([config.data]),
        data.content_hash([config.holdout_data]) if config.holdout_data else None,
    )


def preflight(config: CalibrationConfig) -> tuple[ModelInfo, Any, DataPlan]:
    info = inspect_model(config.model_dir)
    check_lengths(config, info)
    check_output(config, info)
    parsed = read_data(config)  # malformed lines fail here, before the (slow) modeling and tokenizer imports
    check_attention(config.model_dir)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(config.model_dir)
    except Exception as e:  # transformers raises many types for a broken tokenizer
        raise InputError(f"model {config.model_dir}: tokenizer does not load ({e}); save it with the checkpoint") from e
    return info, tokenizer, plan_data(config, tokenizer, parsed)


def save_with_llmcompressor(model: torch.nn.Module, config: CalibrationConfig) -> None:
    model.save_pretrained(config.out, save_compressed=True)  # type: ignore[operator]  # llm-compressor's wrapper


def save_checkpoint(
    model: torch.nn.Module,
    config: CalibrationConfig,
    writer: Callable[[torch.nn.Module, CalibrationConfig], None] = save_with_llmcompressor,
) -> None:
    """Weights unchanged + k_scale/v_scale + quantization_config; tokenizer, chat template and generation config are
    copied byte for byte so vLLM serves the calibrated model exactly like the original."""
    writer(model, config)
    for f in config.model_dir.iterdir():
        if f.is_file() and not (config.out / f.name).exists() and f.suffix not in (".safetensors", ".bin"):
            shutil.copy2(f, config.out / f.name)
    for name in ("generation_config.json", *TOKENIZER_FILES, "chat_template.jinja"):
        if (config.model_dir / name).is_file():
            shutil.copy2(config.model_dir / name, config.out / name)


def _percentiles(s: TensorStats, head: int) -> Percentiles:
    return Percentiles(
        absmax=float(s.absmax[head]), p999=float(s.percentile(0.999)[head]), p9999=float(s.percentile(0.9999)[head])
    )


def _per_head(scale: torch.Tensor, heads: int) -> list[float]:
    flat = scale.flatten()
    return [float(flat[0] if flat.numel() == 1 else flat[h]) for h in range(heads)]


def build_layers(
    calib: dict[tuple[int, str], TensorStats], result: HoldoutResult, saved: ScaleSet, heads: int
) -> list[LayerStats]:
    layers = []
    for i in range(len(saved["k"])):
        per_kind: dict[str, list[HeadStats]] = {}
        for kind in KINDS:
            errs = {n: result.errors[(n, i, kind)] for n in SCALE_SETS}
            clip = {n: e.clip_rate() for n, e in errs.items()}
            sqnr = {n: e.sqnr_db() for n, e in errs.items()}
            scale = _per_head(saved[kind][i], heads)
            per_kind[kind] = [
                HeadStats(
                    head=h,
                    scale=scale[h],
                    calibration=_percentiles(calib[(i, kind)], h),
                    holdout=_percentiles(result.observed[(i, kind)], h),
                    holdout_clip_rate=PerScaleSet(**{n: float(clip[n][h]) for n in SCALE_SETS}),
                    holdout_sqnr_db=PerScaleSet(**{n: finite(float(sqnr[n][h])) for n in SCALE_SETS}),
                )
                for h in range(heads)
            ]
        layers.append(LayerStats(layer=i, k=per_kind["k"], v=per_kind["v"]))
    return layers


def overall_clip(result: HoldoutResult, scale_set: str, layers: int) -> ClipStats:
    rates = {}
    for kind in KINDS:
        errs = [result.errors[(scale_set, i, kind)] for i in range(layers)]
        rates[kind] = float(sum(e.clipped.sum() for e in errs) / max(sum(e.count.sum() for e in errs), 1))
    return ClipStats(**rates)


def sensitive_layers(layers: list[LayerStats], strategy: str) -> list[SensitiveLayer]:
    cal = "head" if strategy == "head" else "tensor"
    rows = []
    for layer in layers:
        pairs: tuple[tuple[Literal["k", "v"], list[HeadStats]], ...] = (("k", layer.k), ("v", layer.v))
        for kind, heads in pairs:
            sqnr = min(getattr(h.holdout_sqnr_db, cal) for h in heads)
            oracle = min(h.holdout_sqnr_db.oracle for h in heads)
            clip = max(getattr(h.holdout_clip_rate, cal) for h in heads)
            why = ["lowest SQNR"]
            if clip > 0:
                why.append(f"clips {100 * clip:.3f}% of holdout values")
            if oracle - sqnr > 1.0:
                why.append(f"{oracle - sqnr:.1f} dB below the oracle scale")
            rows.append(
                SensitiveLayer(layer=layer.layer, kind=kind, sqnr_db=sqnr, clip_rate=clip, reason="; ".join(why))
            )
    return sorted(rows, key=lambda r: r.sqnr_db)[:SENSITIVE_LAYERS]


def kv_bytes_per_token(info: ModelInfo, dtype: str) -> int:
    """K and V of every layer for one token; scales are per layer, not per token, so they add nothing here."""
    return info.layers * 2 * info.kv_heads * info.head_dim * BYTES_PER_ELEMENT[dtype]


def end_to_end(result: HoldoutResult, info: ModelInfo, config: CalibrationConfig) -> EndToEnd:
    """The four variants on the same held-out tokens; the strategy not saved is derived from the same calibration
    statistics (static min-max) and marked simulated, as is per head where the serving backend may not use it."""
    m = {k: v.as_dict() for k, v in result.metrics.items()}

    def variant(name: str, dtype: str, scales: ScaleOrigin, simulated: str | None = None) -> VariantResult:
        return VariantResult(
            nll=m[name]["nll"],
            kl_to_bf16=m[name]["kl"],
            top1_agreement=m[name]["top1"],
            kv_bytes_per_token=kv_bytes_per_token(info, dtype),
            scales=scales,
            simulated=simulated,
        )

    not_saved = f"not in this checkpoint (strategy {config.strategy}): derived from the same calibration max|x|"
    if config.strategy == "tensor":
        tensor = variant("fp8-tensor", "fp8", "saved")
        head = variant("fp8-head", "fp8", "derived", f"{not_saved}; {PER_HEAD_SERVING}")
    else:
        tensor = variant("fp8-tensor", "fp8", "derived", not_saved)
        head = variant("fp8-head", "fp8", "saved", PER_HEAD_SERVING)
    return EndToEnd(
        tokens=result.metrics["bf16"].tokens,
        rounding=config.rounding,
        bf16=variant("bf16", "bf16", "none"),
        fp8_default=variant("fp8-default", "fp8", "1.0"),
        fp8_calibrated=head if config.strategy == "head" else tensor,
        fp8_tensor=tensor,
        fp8_head=head,
    )


def coverage(config: CalibrationConfig, info: ModelInfo, plan: DataPlan) -> LengthCoverage:
    if config.max_model_len:
        served, source = config.max_model_len, "maxModelLen"
    else:  # what vLLM serves without --max-model-len
        served, source = info.max_positions or config.max_seq_length, "max_position_embeddings"
    return length_coverage(
        [len(s.input_ids) for s in plan.calibration],
        served,
        source,
        config.max_seq_length,
        sum(s.truncated for s in plan.calibration),
    )


def versions() -> dict[str, str]:
    out = {}
    for name in VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def calibrate_oneshot(
    model: torch.nn.Module, config: CalibrationConfig, plan: DataPlan, pipeline: str, calib_tap: Tap, timer: Timer
) -> tuple[ScaleSet, list[torch.Tensor]]:
    """llm-compressor's oneshot, our taps riding along; the scales it set (and Q scales, if asked for)."""
    handles = attach(model, calib_tap)
    try:
        with timer.step(ONESHOT_STEP), model_attention(pipeline):
            run_oneshot(
                model,
                plan.calibration,
                config.compressor_strategy,
                config.compressor_observer,
                pipeline,
                query=config.query_scales,
            )
    finally:
        detach(handles)
    return read_scales(model), read_query_scales(model)


def place(config: CalibrationConfig, info: ModelInfo, plan: DataPlan, started: float) -> Placement:
    """Where the model computes, and whether it fits the pod's memory and the Job's deadline, before it loads."""
    accelerators = [] if config.device == "cpu" else visible_accelerators()
    placement = plan_placement(
        config.device, info, working_bytes(info, config.max_seq_length), accelerators, host_memory_bytes()
    )
    log.info("placement: %s (%s)", placement.describe(), placement.why)
    if config.deadline_seconds is not None:
        rate = measure_flops_per_second(placement.execution_device)
        estimate = estimate_work(
            info,
            [len(s.input_ids) for s in plan.calibration],
            [len(s.input_ids) for s in plan.holdout],
            placement,
            rate,
            layerwise_calibration=choose_pipeline(config.pipeline) == "sequential",
        )
        log.info("estimated %.0f s of work at %.3g FLOP/s measured", estimate.seconds, rate)
        check_deadline(estimate, config.deadline_seconds, time.perf_counter() - started, placement.describe())
    return placement


def calibrate(config: CalibrationConfig, placement: Placement | None = None) -> Report:
    """Run the whole calibration; returns the report (its `.summary` is the termination message).
    `placement`: where the model computes, instead of planning it from the visible devices (tests)."""
    started = time.perf_counter()
    timer = Timer()
    with timer.step("preflight"):
        info, tokenizer, plan = preflight(config)
        placement = placement or place(config, info, plan, started)
    _prepare_output(config)
    pipeline = choose_pipeline(config.pipeline)
    oneshot_reason = forward.needs_oneshot(config, pipeline)
    with timer.step("import transformers" + (" and llm-compressor" if oneshot_reason else "")):
        if oneshot_reason:
            import llmcompressor  # noqa: F401
        from transformers import AutoModelForCausalLM  # noqa: F401  # the import's cost, not the load's
    offload_dir = Path(tempfile.mkdtemp(prefix="kvcal-offload-"))  # weights beyond host memory, layer by layer
    try:
        with timer.step("load model"):
            model = load_model(config.model_dir, placement, offload_dir)
        return _calibrate_loaded(
            config, info, tokenizer, plan, placement, model, pipeline, oneshot_reason, timer, started
        )
    finally:
        shutil.rmtree(offload_dir, ignore_errors=True)


def _calibrate_loaded(
    config: CalibrationConfig,
    info: ModelInfo,
    tokenizer: Any,
    plan: DataPlan,
    placement: Placement,
    model: torch.nn.Module,
    pipeline: str,
    oneshot_reason: str | None,
    timer: Timer,
    started: float,
) -> Report:
    reset_peak_memory(placement)
    calib_tap = Tap(info.kv_heads)
    calibration_step = ONESHOT_STEP if oneshot_reason else FORWARD_STEP
    if oneshot_reason:
        log.info("calibrating with llm-compressor's oneshot: %s", oneshot_reason)
        saved, query_scales = calibrate_oneshot(model, config, plan, pipeline, calib_tap, timer)
        calib_tap.to_cpu()
    else:
        with timer.step(FORWARD_STEP):
            handles = attach(model, calib_tap)
            try:
                forward.observe(model, plan.calibration)
            finally:
                detach(handles)
            calib_tap.to_cpu()
            saved, query_scales = forward.static_minmax(calib_tap.observed, info.layers, config.strategy), []
            forward.apply_scales(model, config, saved)
    with timer.step("save checkpoint"):
        save_checkpoint(model, config, forward.save if not oneshot_reason else save_with_llmcompressor)
        artifact_hash = weights_digest(config.out)
    derived_tensor = per_tensor_scales(calib_tap.observed, info.layers)
    derived_head = per_head_scales(calib_tap.observed, info.layers)
    saved_view = {k: [s.view(-1, 1, 1) if s.numel() > 1 else s.view(1) for s in v] for k, v in saved.items()}
    with timer.step("holdout evaluation"):
        result = evaluate_holdout(
            model,
            plan.holdout,
            per_tensor=saved_view if config.strategy == "tensor" else derived_tensor,
            per_head=saved_view if config.strategy == "head" else derived_head,
            heads=info.kv_heads,
            rounding=config.rounding,
        )
    cal_tokens = sum(len(s.input_ids) for s in plan.calibration)
    device = DeviceReport(
        placement=placement.path,
        devices=list(placement.devices),
        dtype=DTYPE,
        peak_device_memory_bytes=peak_device_memory(placement),
        host_weight_bytes=placement.host_weight_bytes,
        disk_weight_bytes=placement.disk_weight_bytes,
        calibration_tokens_per_second=round(cal_tokens / max(timer.seconds[calibration_step], 1e-9), 1),
        why=placement.why,
    )
    with timer.step("report"):
        by = f"llm-compressor oneshot ({oneshot_reason})" if oneshot_reason else forward.CALIBRATED_BY
        report = assemble(config, info, tokenizer, plan, pipeline, by, calib_tap, result, saved, timer, started)
        provenance = report.provenance.model_copy(update={"artifact_hash": artifact_hash})
        summary = report.summary.model_copy(update=device.summary_fields())
        if query_scales:
            summary = summary.model_copy(update={"q_scale_max": max(float(scale.max()) for scale in query_scales)})
        report = report.model_copy(update={"provenance": provenance, "summary": summary, "device": device})
        write_json(report, config.out)
        (config.out / "report.md").write_text(markdown(report), encoding="utf-8")
        if config.plots:
            plot(report, config.out)
    return report


def assemble(
    config: CalibrationConfig,
    info: ModelInfo,
    tokenizer: Any,
    plan: DataPlan,
    pipeline: str,
    calibrated_by: str,
    calib_tap: Tap,
    result: HoldoutResult,
    saved: ScaleSet,
    timer: Timer,
    started: float,
) -> Report:
    heads = info.kv_heads
    layers = build_layers(calib_tap.observed, result, saved, heads)
    e2e = end_to_end(result, info, config)
    clip = {name: overall_clip(result, name, info.layers) for name in ("default", "tensor", "head")}
    clip["calibrated"] = clip[config.strategy]
    lengths = coverage(config, info, plan)
    if lengths.warning:
        log.warning("length coverage: %s", lengths.warning)
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    cal_tokens = sum(len(s.input_ids) for s in plan.calibration)
    every = [*plan.calibration, *plan.holdout]
    provenance = Provenance(
        model_dir=str(config.model_dir),
        model_hash=weights_digest(config.model_dir),
        model_revision=config.model_revision,
        tokenizer_hash=sha256_files(
            [config.model_dir / f for f in TOKENIZER_FILES if (config.model_dir / f).is_file()]
        ),
        chat_template_hash=hashlib.sha256(template.encode()).hexdigest() if template else None,
        dataset=str(config.data),
        dataset_hash=plan.dataset_hash,
        holdout_dataset=str(config.holdout_data) if config.holdout_data else None,
        holdout_hash=plan.holdout_hash,
        seed=config.seed,
        samples=len(plan.calibration),
        tokens=cal_tokens,
        holdout_samples=len(plan.holdout),
        holdout_tokens=result.tokens,
        max_seq_length=config.max_seq_length,
        truncated_samples=sum(s.truncated for s in every),
        truncated_tokens=sum(s.original_length - len(s.input_ids) for s in every),
        length_buckets={str(k): v for k, v in plan.buckets.items()},
        strategy=config.strategy,
        observer=config.observer,
        compressor_observer=config.compressor_observer,
        pipeline=pipeline,
        calibrated_by=calibrated_by,
        layers=info.layers,
        kv_heads=heads,
        head_dim=info.head_dim,
        versions=versions(),
    )
    scales = {kind: [_per_head(s, heads) for s in saved[kind]] for kind in KINDS}
    sensitive = sensitive_layers(layers, config.strategy)
    summary = Summary(
        samples=len(plan.calibration),
        tokens=cal_tokens,
        strategy=config.strategy,
        observer=config.observer,
        k_scale_max=max(max(r) for r in scales["k"]),
        v_scale_max=max(max(r) for r in scales["v"]),
        holdout_clip_rate_default=clip["default"],
        holdout_clip_rate_calibrated=clip["calibrated"],
        top1_agreement_default=e2e.fp8_default.top1_agreement,
        top1_agreement_calibrated=e2e.fp8_calibrated.top1_agreement,
        duration_seconds=round(time.perf_counter() - started, 2),
        artifact=str(config.out),
        longest_sample_tokens=lengths.longest_sample_tokens,
        served_context_tokens=lengths.served_context_tokens,
        context_warning=lengths.warning,
        sensitive_layers=sorted({row.layer for row in sensitive}),
        model_hash=provenance.model_hash,
        model_revision=config.model_revision,
    )
    return Report(
        provenance=provenance,
        scales=scales,
        layers=layers,
        end_to_end=e2e,
        holdout_clip_rate=clip,
        length_coverage=lengths,
        sensitive_layers=sensitive,
        timings_seconds=dict(timer.seconds),
        summary=summary,
    )
