"""`kvcal validate FILE...` as a GitOps CI step runs it: a subprocess, its exit status and its output."""

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
MINIMAL = yaml.safe_load((REPO / "examples" / "minimal-per-tensor.yaml").read_text())


def kvcal_validate(*files: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
    return subprocess.run(
        [sys.executable, "-m", "kvcal.cli", "validate", *map(str, files)],
        input=stdin, capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip


def bad_copy(name: str, **calibration: object) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(yaml.safe_dump(MINIMAL))
    doc["metadata"]["name"] = name
    doc["spec"]["calibration"].update(calibration)
    return doc


def test_every_example_is_valid() -> None:
    proc = kvcal_validate(*EXAMPLES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert f"{len(EXAMPLES)} KVCalibration object(s) checked: all valid" in proc.stderr


def test_bad_documents_are_named_with_their_fields_and_fail_the_run(tmp_path: Path) -> None:
    many = tmp_path / "many.yaml"
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    steps = yaml.safe_load(yaml.safe_dump(MINIMAL))
    steps["spec"]["serving"]["traffic"] = {"steps": []}
    steps["spec"]["analysis"] = {"interval": "0s", "latency": [{"metric": "ttft", "quantile": 1.5}]}
    documents = [other, bad_copy("zero-samples", samples=0), MINIMAL, steps]
    many.write_text(yaml.safe_dump_all(documents))
    proc = kvcal_validate(many, *EXAMPLES)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert f"{many}: document 2 (KVCalibration zero-samples): spec.calibration.samples:" in lines[0]
    assert "greater than or equal to 1" in lines[0]
    named = MINIMAL["metadata"]["name"]
    assert any(f"document 4 (KVCalibration {named}): spec.serving.traffic.steps: " in line for line in lines)
    assert any("spec.analysis.interval: must be at least 1s" in line for line in lines)
    assert any("spec.analysis.latency[0].quantile: must be in (0, 1)" in line for line in lines)
    assert not any("document 3" in line or "document 1" in line for line in lines)  # valid, and not ours
    assert f"{len(EXAMPLES) + 3} KVCalibration object(s) checked: problems found" in proc.stderr


def test_output_over_the_source_and_unknown_fields_from_stdin() -> None:
    same = bad_copy("same", output=MINIMAL["spec"]["model"]["source"])
    typo = bad_copy("typo", sample=64)
    typo["apiVersion"] = "kvcal.dev/v1"
    head = bad_copy("head", strategy="head")
    proc = kvcal_validate("-", stdin=yaml.safe_dump_all([same, typo, head]))
    assert proc.returncode == 1
    assert "-: document 1 (KVCalibration same): spec.calibration.output: must differ from spec.model.source" in (
        proc.stdout
    )
    assert "document 2 (KVCalibration typo): apiVersion: 'kvcal.dev/v1' is not served" in proc.stdout
    assert "document 2 (KVCalibration typo): spec.calibration.sample: Extra inputs are not permitted" in proc.stdout
    assert "document 3 (KVCalibration head): spec.calibration.strategy: 'head' needs" in proc.stdout


def test_unreadable_files_fail(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [unclosed")
    proc = kvcal_validate(broken, tmp_path / "missing.yaml")
    assert proc.returncode == 1
    assert f"{broken}: not valid YAML" in proc.stdout
    assert "missing.yaml: No such file or directory" in proc.stderr


def test_listed_in_kvcal_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvcal.cli", "--help"], capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO / "operator")},
    )  # fmt: skip
    assert "validate" in proc.stdout
