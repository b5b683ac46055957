"""The calibrator empties its output folder in place: in the Job that folder is a mount point (a subPath or a
hostPath), which can be emptied but never removed."""

import errno
import os
from pathlib import Path

import pytest

from kvcal.calibrator.config import CalibrationConfig
from kvcal.calibrator.preflight import prepare_output


def test_force_empties_the_output_folder_without_removing_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    real_rmdir = os.rmdir

    def rmdir(path: str | os.PathLike[str], *args: object, **kwargs: object) -> None:
        if Path(path) == out or (kwargs.get("dir_fd") is not None and str(path) == out.name):
            raise OSError(errno.EBUSY, "Device or resource busy (a mount point)", str(path))
        real_rmdir(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "rmdir", rmdir)
    (out / "old-shards").mkdir(parents=True)
    (out / "old-shards" / "model.safetensors").write_text("stale")
    (out / "kvcal-report.json").write_text("{}")
    (out / "link").symlink_to(tmp_path)  # a link is removed, never followed
    prepare_output(CalibrationConfig(model_dir=tmp_path / "m", data=tmp_path / "d.jsonl", out=out, force=True))
    assert out.is_dir() and list(out.iterdir()) == []
    assert tmp_path.is_dir()


def test_missing_output_folder_is_created(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    prepare_output(CalibrationConfig(model_dir=tmp_path / "m", data=tmp_path / "d.jsonl", out=out))
    assert out.is_dir()
