"""Bad input fails before any heavy work, with rc 2 and a message naming the problem and the fix."""

import json
from pathlib import Path

import pytest

from kvcal.cli import main

pytestmark = pytest.mark.model


def calibrate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = main(["calibrate", *args])
    return rc, capsys.readouterr().err


@pytest.fixture
def data(tmp_path: Path) -> Path:
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(json.dumps({"text": f"sample number {i}"}) for i in range(10)) + "\n")
    return p


def test_missing_model_dir(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = calibrate(capsys, str(tmp_path / "nope"), "--data", str(data), "--out", str(tmp_path / "o"))
    assert rc == 2 and "folder not found" in err


def test_malformed_jsonl_names_the_line(
    demo_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": "ok"}\n{"text": broken}\n')
    term = tmp_path / "term"
    rc, err = calibrate(
        capsys, str(demo_model_dir), "--data", str(bad), "--out", str(tmp_path / "o"), "--termination-log", str(term)
    )
    assert rc == 2 and f"{bad}:3" in err and "not valid JSON" in err
    assert f"{bad}:3" in json.loads(term.read_text())["error"]


def test_output_not_empty_without_force(
    demo_model_dir: Path, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    rc, err = calibrate(capsys, str(demo_model_dir), "--data", str(data), "--out", str(out))
    assert rc == 2 and "not empty" in err and "--force" in err
    assert (out / "keep.txt").exists()


def test_max_seq_length_above_model_max(
    demo_model_dir: Path, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, err = calibrate(
        capsys, str(demo_model_dir), "--data", str(data), "--out", str(tmp_path / "o"), "--max-seq-length", "9000"
    )
    assert rc == 2 and "above the model's maximum 8192" in err


def test_fewer_samples_than_asked(
    demo_model_dir: Path, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, err = calibrate(
        capsys, str(demo_model_dir), "--data", str(data), "--out", str(tmp_path / "o"), "--samples", "50"
    )
    assert rc == 2 and "asked for 50 calibration samples but only 9" in err


def test_unsupported_architecture(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "bert"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "model_type": "bert"}))
    rc, err = calibrate(capsys, str(model), "--data", str(data), "--out", str(tmp_path / "o"))
    assert rc == 2 and "unsupported architecture" in err


def test_bad_flag_value_names_the_field(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = calibrate(
        capsys, str(tmp_path), "--data", str(data), "--out", str(tmp_path / "o"), "--holdout-fraction", "0.9"
    )
    assert rc == 2 and "holdoutFraction" in err


def test_default_sample_count_works_with_the_bundled_data(demo_model_dir: Path, tmp_path: Path) -> None:
    """No --samples on the 38 bundled prompts: all 34 left after the holdout split (it asked for 512 and failed)."""
    from kvcal.calibrator.config import CalibrationConfig
    from kvcal.calibrator.run import preflight
    from kvcal.demo import CALIBRATION_SET

    config = CalibrationConfig(model_dir=demo_model_dir, data=CALIBRATION_SET, out=tmp_path / "o")
    _, _, plan = preflight(config)  # everything that can fail about the data, with the real tokenizer
    assert (len(plan.calibration), len(plan.holdout)) == (34, 4)
