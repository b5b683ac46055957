"""The Job entrypoint (`python -m kvcal.calibrator --config FILE`) rejects bad config files before any work."""

import argparse
import json
from pathlib import Path

import pytest

from kvcal.calibrator.__main__ import main
from kvcal.calibrator.cli import FLAG_FIELDS, register
from kvcal.calibrator.config import CalibrationConfig


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


def calibrate_parser() -> argparse.ArgumentParser:
    sub = argparse.ArgumentParser(prog="kvcal").add_subparsers()
    register(sub)
    parser: argparse.ArgumentParser = sub.choices["calibrate"]
    return parser


# Options with nothing to default to: the inputs themselves, and the config file.
NO_DEFAULT = {"--data", "--out", "--config"}


def test_help_shows_every_default() -> None:
    parser = calibrate_parser()
    helps = {a.dest: a.help or "" for a in parser._actions}
    for action in parser._actions:
        flag = action.option_strings[0] if action.option_strings else None
        if flag is None or action.nargs == 0 or flag in NO_DEFAULT:  # positional, --help and on/off switches
            continue
        assert "(default: " in helps[action.dest], flag
    for name in FLAG_FIELDS:
        field = CalibrationConfig.model_fields[name]
        if not field.is_required() and field.default is not None:  # shown: the value the config model applies
            assert f"(default: {field.default})" in helps[name], name
    text = " ".join(parser.format_help().split())
    assert "(default: all available, up to 512)" in text and "(default: the model's max_position_embeddings)" in text
    assert "(default: 4096)" in text and "(default: static-minmax)" in text
