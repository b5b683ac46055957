"""The Job entrypoint (`python -m kvcal.calibrator --config FILE`) rejects bad config files before any work."""

import json
from pathlib import Path

import pytest

from kvcal.calibrator.__main__ import main


def run(tmp_path: Path, config: object, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, dict[str, object]]:
    cfg = tmp_path / "config.json"
    cfg.write_text(config if isinstance(config, str) else json.dumps(config))
    term = tmp_path / "termination-log"
    rc = main(["--config", str(cfg), "--termination-log", str(term)])
    return rc, capsys.readouterr().err, json.loads(term.read_text())


def test_unreadable_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err, term = run(tmp_path, "{not json", capsys)
    assert rc == 2 and "cannot read JSON" in err and "cannot read JSON" in str(term["error"])
    assert term["reportVersion"] == 1


def test_invalid_field_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {"modelDir": "/m", "data": "/d", "out": str(tmp_path / "o"), "observer": "percentile"}
    rc, err, term = run(tmp_path, config, capsys)
    assert rc == 2 and "observer" in err and "static-minmax" in err and "observer" in str(term["error"])


def test_missing_required_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err, _ = run(tmp_path, {"modelDir": "/m"}, capsys)
    assert rc == 2 and "--data" in err and "--out" in err
