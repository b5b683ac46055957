"""Report schema, markdown table and the termination-message summary (synthetic numbers, no model)."""

import json
from pathlib import Path

from kvcal.calibrator import report as R
from tests.support.calib_report import make_report
from tests.support.prereq import require_module


def test_json_round_trip_is_versioned_camel_case(tmp_path: Path) -> None:
    report = make_report(tmp_path)
    path = R.write_json(report, tmp_path)
    raw = json.loads(path.read_text())
    assert raw["reportVersion"] == 1 and raw["kind"] == "KVCalibrationReport"
    assert "holdoutClipRate" in raw["layers"][0]["k"][0] and "endToEnd" in raw
    assert R.load(path) == report


def test_summary_fits_the_termination_message_with_contract_keys(tmp_path: Path) -> None:
    text = R.summary_json(make_report(tmp_path).summary)
    assert len(text.encode()) <= R.SUMMARY_LIMIT
    assert set(json.loads(text)) >= {"kScaleMax", "holdoutClipRateCalibrated", "top1AgreementDefault", "reportVersion"}


def test_error_summary_is_cut_to_4096_bytes() -> None:
    text = R.error_json("é" * 5000)
    assert len(text.encode()) <= R.SUMMARY_LIMIT and json.loads(text)["error"].endswith("…")


def test_markdown_and_plots(tmp_path: Path) -> None:
    report = make_report(tmp_path)
    md = R.markdown(report)
    assert "| BF16 | none | 1,024 | 2.0000 | 0.00000 | 100.00% | - | - |" in md
    assert "| FP8 scale 1.0 | 1.0 | 512 | 2.0000 | 0.01000 | 95.00% | 0.5000% | 0 |" in md
    assert "| FP8 per tensor | saved | 512 | 2.0000 | 0.01000 | 95.00% | 0 | 0 |" in md
    assert "| FP8 per head [1] | derived | 512 | 1.9000 | 0.00500 | 97.00% | 0 | 0 |" in md
    assert "[1] FP8 per head: simulated; why" in md
    require_module("matplotlib", "matplotlib draws the report's plots")
    paths = R.plot(report, tmp_path)
    assert [p.name for p in paths] == ["scales.png", "clip-rate.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)


def test_json_has_no_infinities() -> None:
    assert R.finite(float("inf")) == 1e9 and R.finite(float("nan")) == 0.0
