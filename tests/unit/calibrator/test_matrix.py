"""The report's whole matrix: four variants with KV bytes per token, the length coverage rule, readable plots."""

from pathlib import Path

import pytest

from kvcal.calibrator import report as R
from kvcal.calibrator.config import CalibrationConfig
from kvcal.calibrator.coverage import FAR_BELOW_FRACTION, length_coverage
from tests.support.calib_report import make_report
from tests.support.prereq import require_module

# SmolLM2-135M: 30 layers, 3 KV heads of 64 dims -> K+V of one token: 30 * 2 * 3 * 64 elements.
SMOLLM2 = {"layers": 30, "kv_heads": 3, "head_dim": 64}
ELEMENTS_PER_TOKEN = 30 * 2 * 3 * 64


def holdout_result() -> object:
    require_module("torch", "the calibrator's evaluation runs on torch")
    from kvcal.calibrator.evaluate import VARIANTS, HoldoutResult, VariantMetrics

    metrics = {name: VariantMetrics(nll_sum=10.0 + i, kl_sum=0.1 * i, agree=100 - i, tokens=100) for i, name in
               enumerate(VARIANTS)}  # fmt: skip
    return HoldoutResult(observed={}, errors={}, oracle={}, metrics=metrics, tokens=100)


@pytest.mark.parametrize("strategy", ["tensor", "head"])
def test_end_to_end_has_four_variants_with_kv_bytes_and_marks_what_serving_cannot_use(
    strategy: str, tmp_path: Path
) -> None:
    result = holdout_result()
    from kvcal.calibrator.preflight import ModelInfo
    from kvcal.calibrator.run import end_to_end

    info = ModelInfo(config={}, weight_bytes=0, max_positions=8192, **SMOLLM2)
    config = CalibrationConfig(model_dir=tmp_path, data=tmp_path, out=tmp_path, strategy=strategy)  # type: ignore[arg-type]
    e = end_to_end(result, info, config)  # type: ignore[arg-type]
    assert e.fp8_tensor is not None and e.fp8_head is not None
    rows = [e.bf16, e.fp8_default, e.fp8_tensor, e.fp8_head]
    assert [r.top1_agreement for r in rows] == [1.0, 0.99, 0.98, 0.97]  # each variant its own pass, in order
    assert [r.kv_bytes_per_token for r in rows] == [2 * ELEMENTS_PER_TOKEN] + [ELEMENTS_PER_TOKEN] * 3
    saved, derived = (e.fp8_tensor, e.fp8_head) if strategy == "tensor" else (e.fp8_head, e.fp8_tensor)
    assert e.fp8_calibrated == saved and saved.scales == "saved" and derived.scales == "derived"
    assert derived.simulated and "not in this checkpoint" in derived.simulated
    # per head is marked whether saved or not: only some vLLM attention backends apply per-head scales
    assert e.fp8_head.simulated and "FlashAttention" in e.fp8_head.simulated and "CPU" in e.fp8_head.simulated
    assert e.bf16.simulated is None and e.fp8_default.simulated is None and e.fp8_default.scales == "1.0"
    table = R.comparison_table(make_report(tmp_path).model_copy(update={"end_to_end": e}))
    assert "| FP8 per head [" in table and "| FP8 per tensor" in table and f"| {2 * ELEMENTS_PER_TOKEN:,} |" in table


def test_length_coverage_warns_when_calibration_stops_under_a_quarter_of_the_served_context() -> None:
    assert FAR_BELOW_FRACTION == 0.25
    ok = length_coverage([100, 300, 512], 2048, "maxModelLen", 4096, truncated=0)
    assert (ok.longest_sample_tokens, ok.median_sample_tokens, ok.covered_fraction) == (512, 300, 0.25)
    assert ok.warning is None
    short = length_coverage([100, 300, 511], 2048, "maxModelLen", 4096, truncated=0)
    assert short.warning and "511 tokens" in short.warning and "2048" in short.warning
    assert "add longer calibration samples" in short.warning
    cut = length_coverage([512, 512], 8192, "max_position_embeddings", 512, truncated=2)
    assert cut.warning and "raise --max-seq-length (now 512; 2 samples were cut)" in cut.warning


def test_summary_carries_the_coverage_and_fits_the_termination_message(tmp_path: Path) -> None:
    from kvcal.models.status import CALIBRATION_SUMMARY_FIELDS

    warning = length_coverage([512], 8192, "max_position_embeddings", 512, truncated=1).warning
    summary = make_report(tmp_path).summary.model_copy(
        update={"longest_sample_tokens": 512, "served_context_tokens": 8192, "context_warning": warning}
    )
    wire = summary.to_wire()
    assert {"longestSampleTokens", "servedContextTokens", "contextWarning"} <= CALIBRATION_SUMMARY_FIELDS
    assert set(wire) <= CALIBRATION_SUMMARY_FIELDS | {"artifact", "reportVersion"}
    assert len(R.summary_json(summary).encode()) <= R.SUMMARY_LIMIT


def test_plots_share_one_colour_scale_per_comparison_show_zero_as_zero_and_whole_head_ticks(tmp_path: Path) -> None:
    require_module("matplotlib", "matplotlib draws the report's plots")
    import matplotlib.pyplot as plt
    import numpy as np

    figs = R.figures(make_report(tmp_path))  # K per-tensor/per-head and every V clip rate are all zero there
    try:
        assert list(figs) == ["scales.png", "clip-rate.png"]
        for fig in figs.values():
            fig.canvas.draw()
            images = [im for ax in fig.axes for im in ax.get_images()]
            assert len({(im.norm.vmin, im.norm.vmax, type(im.norm)) for im in images}) == 1  # one colour scale
            for ax in (ax for ax in fig.axes if ax.get_images()):
                low, high = sorted(ax.get_ylim())
                heads = [t for t in ax.get_yticks() if low <= t <= high]
                assert heads == [0, 1], heads  # 2 KV heads: whole numbers, no 0.25 steps
                layers = [t for t in ax.get_xticks() if min(ax.get_xlim()) <= t <= max(ax.get_xlim())]
                assert layers and all(float(t).is_integer() for t in layers)
        clip = [im for ax in figs["clip-rate.png"].axes for im in ax.get_images()]
        assert len(clip) == 6 and clip[0].norm.vmin == 0.0 and clip[0].norm.vmax == pytest.approx(1.0)  # 1% max
        zero_axes = [ax for ax in figs["clip-rate.png"].axes if "(all zero)" in ax.get_title()]
        assert len(zero_axes) == 5  # only K at scale 1.0 clips
        for ax in zero_axes:
            im = ax.get_images()[0]
            colours = im.to_rgba(np.asarray(im.get_array()))
            assert np.allclose(colours, im.cmap(0.0))  # drawn in the colour of 0, not mid-scale
        scales = [im for ax in figs["scales.png"].axes for im in ax.get_images()]
        assert scales[0].norm.vmin == pytest.approx(0.2) and scales[0].norm.vmax == pytest.approx(1.5)
    finally:
        for fig in figs.values():
            plt.close(fig)
