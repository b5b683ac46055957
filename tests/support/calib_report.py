"""A calibration report with synthetic numbers (no model), for the report and matrix tests."""

from pathlib import Path

from kvcal.calibrator import report as R


def head(h: int, scale: float, clip_default: float) -> R.HeadStats:
    p = R.Percentiles(absmax=scale * 448, p999=1.0, p9999=2.0)
    return R.HeadStats(
        head=h,
        scale=scale,
        calibration=p,
        holdout=p,
        holdout_clip_rate=R.PerScaleSet(default=clip_default, tensor=0.0, head=0.0, oracle=0.0),
        holdout_sqnr_db=R.PerScaleSet(default=10.0, tensor=30.0 - h, head=31.0, oracle=31.5),
    )


def make_report(tmp_path: Path) -> R.Report:
    layers = [
        R.LayerStats(layer=i, k=[head(0, 1.5, 0.01), head(1, 1.5, 0.0)], v=[head(0, 0.2, 0.0)] * 2) for i in range(4)
    ]
    variant = R.VariantResult(nll=2.0, kl_to_bf16=0.01, top1_agreement=0.95, kv_bytes_per_token=512, scales="saved")
    derived = R.VariantResult(
        nll=1.9, kl_to_bf16=0.005, top1_agreement=0.97, kv_bytes_per_token=512, scales="derived", simulated="why"
    )
    clip = {"default": R.ClipStats(k=0.005, v=0.0), "calibrated": R.ClipStats(k=0.0, v=0.0)}
    clip |= {"tensor": clip["calibrated"], "head": R.ClipStats(k=0.0, v=0.0)}
    summary = R.Summary(
        samples=8,
        tokens=900,
        strategy="tensor",
        observer="static-minmax",
        k_scale_max=1.5,
        v_scale_max=0.2,
        holdout_clip_rate_default=clip["default"],
        holdout_clip_rate_calibrated=clip["calibrated"],
        top1_agreement_default=0.9,
        top1_agreement_calibrated=0.99,
        duration_seconds=12.5,
        artifact=str(tmp_path),
    )
    prov = R.Provenance(
        model_dir="/m",
        model_hash="a" * 64,
        tokenizer_hash="b" * 64,
        chat_template_hash=None,
        dataset="/d",
        dataset_hash="c" * 64,
        holdout_dataset=None,
        holdout_hash=None,
        seed=0,
        samples=8,
        tokens=900,
        holdout_samples=2,
        holdout_tokens=200,
        max_seq_length=512,
        truncated_samples=1,
        truncated_tokens=40,
        length_buckets={"256": {"available": 5, "target": 1.0, "selected": 5}},
        strategy="tensor",
        observer="static-minmax",
        compressor_observer="static_minmax",
        pipeline="basic",
        layers=4,
        kv_heads=2,
        head_dim=64,
        versions={"torch": "x"},
    )
    return R.Report(
        provenance=prov,
        scales={"k": [[1.5, 1.5]] * 4, "v": [[0.2, 0.2]] * 4},
        layers=layers,
        end_to_end=R.EndToEnd(
            tokens=198,
            rounding="nearest",
            bf16=R.VariantResult(nll=2.0, kl_to_bf16=0.0, top1_agreement=1.0, kv_bytes_per_token=1024, scales="none"),
            fp8_default=variant.model_copy(update={"scales": "1.0"}),
            fp8_calibrated=variant,
            fp8_tensor=variant,
            fp8_head=derived,
        ),
        holdout_clip_rate=clip,
        sensitive_layers=[],
        timings_seconds={"calibrate": 3.0},
        summary=summary,
    )
