"""The real calibrator (llm-compressor oneshot on SmolLM2-135M) through the Job's entrypoint, shared per session."""

import json
from pathlib import Path
from typing import Any

import pytest

from kvcal.calibrator.report import load
from kvcal.models.status import CALIBRATION_SUMMARY_FIELDS
from tests.support.demo import DemoCheckpoint

pytestmark = pytest.mark.model

SUMMARY_KEYS = CALIBRATION_SUMMARY_FIELDS | {"artifact", "reportVersion"}


def tensors(path: Path) -> dict[str, "object"]:
    from safetensors.torch import load_file

    out: dict[str, object] = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_saved_scales_equal_what_the_report_says(demo_checkpoint: Path) -> None:
    import torch

    report = json.loads((demo_checkpoint / "kvcal-report.json").read_text())
    saved = tensors(demo_checkpoint)
    layers = report["provenance"]["layers"]
    for kind in ("k", "v"):
        for i in range(layers):
            t = saved[f"model.layers.{i}.self_attn.{kind}_scale"]
            assert isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 and t.shape == (1,)
            assert [t.float().item()] * report["provenance"]["kvHeads"] == report["scales"][kind][i]
    assert report["summary"]["kScaleMax"] == max(max(r) for r in report["scales"]["k"])


def clipping_heads(report: dict[str, Any]) -> int:
    """Asserts calibrated < 1.0 on every (layer, K/V, head) where scale 1.0 clips held-out values; returns how many."""
    cal = "head" if report["provenance"]["strategy"] == "head" else "tensor"
    clipping = 0
    for layer in report["layers"]:
        for kind in ("k", "v"):
            for head in layer[kind]:
                rate = head["holdoutClipRate"]
                if rate["default"] > 0:
                    clipping += 1
                    assert rate[cal] < rate["default"], (layer["layer"], kind, head["head"], rate)
    return clipping


def test_holdout_clip_rate_calibrated_below_default_wherever_default_clips(
    demo_checkpoint: Path, amplified_calibration: Path
) -> None:
    # SmolLM2's |K|, |V| stay below ~30: scale 1.0 never clips there (it loses precision instead) ...
    clipping_heads(json.loads((demo_checkpoint / "kvcal-report.json").read_text()))
    # ... so the same model with K/V amplified 64x (same function) makes 1.0 clip, and calibration must fix it.
    report = json.loads((amplified_calibration / "kvcal-report.json").read_text())
    assert clipping_heads(report) > 0, "scale 1.0 clipped nowhere: the comparison would prove nothing"
    s = report["summary"]
    assert s["holdoutClipRateCalibrated"]["k"] < s["holdoutClipRateDefault"]["k"]
    assert s["holdoutClipRateCalibrated"]["v"] < s["holdoutClipRateDefault"]["v"]
    assert s["top1AgreementCalibrated"] > s["top1AgreementDefault"]


def test_per_head_scales_saved_with_one_scale_per_kv_head(amplified_calibration: Path) -> None:
    import torch

    report = json.loads((amplified_calibration / "kvcal-report.json").read_text())
    saved = tensors(amplified_calibration)
    for kind in ("k", "v"):
        for i, row in enumerate(report["scales"][kind]):
            t = saved[f"model.layers.{i}.self_attn.{kind}_scale"]
            assert isinstance(t, torch.Tensor) and t.shape == (3, 1, 1)
            assert t.float().flatten().tolist() == row
    cfg = json.loads((amplified_calibration / "config.json").read_text())
    assert cfg["quantization_config"]["kv_cache_scheme"]["strategy"] == "attn_head"
    e = load(amplified_calibration / "kvcal-report.json").end_to_end
    assert e.fp8_head is not None and e.fp8_tensor is not None and e.fp8_calibrated == e.fp8_head
    assert (e.fp8_head.scales, e.fp8_tensor.scales) == ("saved", "derived") and e.fp8_tensor.simulated


def test_weights_bit_identical_to_the_bf16_input(demo_checkpoint: Path, demo_model_dir: Path) -> None:
    import torch

    before, after = tensors(demo_model_dir), tensors(demo_checkpoint)
    scales = {k for k in after if k.endswith(("k_scale", "v_scale"))}
    assert len(scales) == 2 * 30
    assert set(after) - scales == set(before)
    for name, t in before.items():
        a = after[name]
        assert isinstance(t, torch.Tensor) and isinstance(a, torch.Tensor)
        assert torch.equal(t, a) and t.dtype == a.dtype == torch.bfloat16, name


def test_checkpoint_declares_the_kv_cache_scheme_and_keeps_serving_files(demo_checkpoint: Path) -> None:
    cfg = json.loads((demo_checkpoint / "config.json").read_text())
    kv = cfg["quantization_config"]["kv_cache_scheme"]
    assert (kv["num_bits"], kv["type"], kv["symmetric"], kv["dynamic"], kv["strategy"]) == (
        8,
        "float",
        True,
        False,
        "tensor",
    )
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (demo_checkpoint / f).is_file(), f
    for f in ("report.md", "scales.png", "clip-rate.png"):
        assert (demo_checkpoint / f).stat().st_size > 0, f


def test_termination_summary_fits_and_has_the_contract_keys(demo_calibration: DemoCheckpoint) -> None:
    raw = demo_calibration.termination_log.read_bytes()
    assert len(raw) <= 4096
    summary = json.loads(raw)
    # no accelerator, so no peak device memory; no revision given
    assert set(summary) == SUMMARY_KEYS - {"peakDeviceMemoryBytes", "modelRevision"}
    assert (summary["device"], summary["placement"], summary["dtype"]) == ("cpu", "cpu", "bfloat16")
    assert summary["tokensPerSecond"] > 0
    report = demo_calibration.report
    assert summary["modelHash"] == report["provenance"]["modelHash"]  # type: ignore[index]
    assert summary["reportVersion"] == 1 and summary["strategy"] == "tensor" and summary["observer"] == "static-minmax"
    assert summary["artifact"] == str(demo_calibration.path)
    assert set(summary["holdoutClipRateDefault"]) == {"k", "v"}


def test_demo_report_says_where_it_computed(demo_checkpoint: Path) -> None:
    from kvcal.verify.digest import weights_digest

    report = json.loads((demo_checkpoint / "kvcal-report.json").read_text())
    assert report["device"]["devices"] == ["cpu"] and report["device"]["placement"] == "cpu"
    assert "device: cpu (cpu: no accelerator visible), bfloat16" in (demo_checkpoint / "report.md").read_text()
    assert report["provenance"]["artifactHash"] == weights_digest(demo_checkpoint)


def test_report_validates_against_its_schema(demo_checkpoint: Path) -> None:
    report = load(demo_checkpoint / "kvcal-report.json")
    p = report.provenance
    assert report.report_version == 1 and p.samples == 6 and p.tokens > 0 and p.layers == 30 and p.kv_heads == 3
    assert len(p.model_hash) == len(p.dataset_hash) == 64 and p.chat_template_hash
    assert p.versions["llmcompressor"].startswith("0.14")
    e = report.end_to_end
    assert e.bf16.kl_to_bf16 == pytest.approx(0.0, abs=1e-6) and e.bf16.top1_agreement == 1.0
    assert 0 <= e.fp8_calibrated.top1_agreement <= 1 and e.tokens > 0
    for layer in report.layers:
        for h in [*layer.k, *layer.v]:
            # static min-max: the scale is the calibration max / 448, rounded to bf16 (<0.4% apart)
            assert h.calibration.p999 <= h.calibration.p9999 <= h.calibration.absmax
        # static min-max: the saved scale is the calibration max / 448 rounded to bf16 (< 0.4% apart)
        for heads in (layer.k, layer.v):
            assert max(h.calibration.absmax for h in heads) / 448 == pytest.approx(heads[0].scale, rel=4e-3)
    assert len(report.sensitive_layers) == 3


def test_demo_report_shows_the_four_variants_with_kv_bytes_per_token(demo_checkpoint: Path) -> None:
    """BF16, FP8 1.0, FP8 per tensor (saved here) and FP8 per head (derived, marked simulated) on the same held-out
    tokens, in the JSON report and in the table report.md and `kvcal calibrate` print."""
    report = load(demo_checkpoint / "kvcal-report.json")
    e = report.end_to_end
    assert e.fp8_tensor is not None and e.fp8_head is not None
    rows = {"bf16": e.bf16, "fp8 1.0": e.fp8_default, "tensor": e.fp8_tensor, "head": e.fp8_head}
    fp8_bytes = 30 * 2 * 3 * 64  # SmolLM2-135M: 30 layers x K,V x 3 KV heads x 64 dims x 1 byte
    assert {n: r.kv_bytes_per_token for n, r in rows.items()} == {
        "bf16": 2 * fp8_bytes, "fp8 1.0": fp8_bytes, "tensor": fp8_bytes, "head": fp8_bytes
    }  # fmt: skip
    assert [r.scales for r in rows.values()] == ["none", "1.0", "saved", "derived"]
    assert e.fp8_calibrated == e.fp8_tensor and e.bf16.top1_agreement == 1.0
    assert e.fp8_head.simulated and "not in this checkpoint" in e.fp8_head.simulated and e.fp8_tensor.simulated is None
    # four separate passes: FP8 perturbs BF16's output, each variant by its own amount
    assert all(r.kl_to_bf16 > 0 for n, r in rows.items() if n != "bf16"), rows
    assert set(report.holdout_clip_rate) >= {"default", "tensor", "head", "calibrated"}
    md = (demo_checkpoint / "report.md").read_text()
    for row in (
        "| BF16 | none | 23,040 |",
        "| FP8 scale 1.0 | 1.0 | 11,520 |",
        "| FP8 per tensor | saved | 11,520 |",
        "| FP8 per head [1] | derived | 11,520 |",
        "[1] FP8 per head: simulated; not in this checkpoint",
    ):
        assert row in md, row  # fmt: skip


def test_demo_report_warns_that_calibration_stops_far_below_the_served_context(
    demo_calibration: DemoCheckpoint,
) -> None:
    """The fixture calibrates on <= 128 tokens; SmolLM2 serves 8192 (max_position_embeddings, no maxModelLen)."""
    c = load(demo_calibration.path / "kvcal-report.json").length_coverage
    assert c is not None and c.served_context_tokens == 8192 and c.served_context_source == "max_position_embeddings"
    assert 0 < c.longest_sample_tokens <= 128 and c.warning and "8192-token context" in c.warning
    summary = json.loads(demo_calibration.termination_log.read_text())
    assert (summary["longestSampleTokens"], summary["servedContextTokens"]) == (c.longest_sample_tokens, 8192)
    assert summary["contextWarning"] == c.warning
    assert c.warning in (demo_calibration.path / "report.md").read_text()
