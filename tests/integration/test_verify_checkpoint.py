"""Static verification of the real checkpoint from `kvcal calibrate` (the session's demo_checkpoint), and of copies
corrupted in different ways: each must fail with the message that names the layer and the tensor."""

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvcal.verify import static
from kvcal.verify.digest import weights_digest
from kvcal.verify.tensors import encode, read_raw, write_safetensors

pytestmark = pytest.mark.model

Raw = dict[str, tuple[str, tuple[int, ...], bytes]]


@pytest.fixture(scope="module")
def checkpoint_raw(demo_checkpoint: Path) -> Raw:
    files = sorted(Path(demo_checkpoint).glob("*.safetensors"))
    assert len(files) == 1, f"expected one safetensors file in {demo_checkpoint}, found {files}"
    return read_raw(files[0])


def corrupt(src: Path, dst: Path, raw: Raw | None = None, config: dict[str, Any] | None = None,
            report: dict[str, Any] | None = None) -> Path:  # fmt: skip
    """A copy of the checkpoint folder with the weights, config or report replaced."""
    dst.mkdir()
    for item in src.iterdir():
        if item.is_file() and item.suffix != ".safetensors":
            shutil.copy(item, dst / item.name)
    if raw is None:
        for f in src.glob("*.safetensors"):
            (dst / f.name).symlink_to(f)
    else:
        write_safetensors(dst / "model.safetensors", raw)
    if config is not None:
        (dst / "config.json").write_text(json.dumps(config))
    if report is not None:
        (dst / "kvcal-report.json").write_text(json.dumps(report))
    rerecord_artifact_hash(dst)
    return dst


def rerecord_artifact_hash(folder: Path) -> None:
    """A corrupted copy stands for a checkpoint SAVED that way: its report records its own weights' hash, as the
    calibrator does, so only the corruption under test is reported (test_changed_in_place covers the other case)."""
    path = folder / static.REPORT_NAME
    report = json.loads(path.read_text()) if path.is_file() else {}
    if static.recorded_artifact_hash(report):
        report["provenance"]["artifactHash"] = weights_digest(folder)
        path.write_text(json.dumps(report))


def test_calibrated_checkpoint_is_sound(demo_checkpoint: Path) -> None:
    result = static.verify(Path(demo_checkpoint))
    assert result.ok, "\n".join(p.line() for p in result.problems)
    assert result.strategy == "tensor"
    assert len(result.scales) == result.shape.layers == 30
    values = [x for s in result.scales.values() for x in (*s.k, *s.v)]
    assert len(values) == 60 and all(0 < x < 1 for x in values)  # real calibration: far from the default 1.0
    assert (Path(demo_checkpoint) / static.REPORT_NAME).is_file()  # so coverage of the maxima was checked too


def test_corruptions_fail_naming_layer_and_tensor(demo_checkpoint: Path, checkpoint_raw: Raw, tmp_path: Path) -> None:
    src = Path(demo_checkpoint)
    raw = dict(checkpoint_raw)
    del raw["model.layers.4.self_attn.v_scale"]
    raw["model.layers.9.self_attn.k_scale"] = ("BF16", (1,), encode("BF16", [math.nan]))
    raw["model.layers.12.self_attn.v_scale"] = ("BF16", (1,), encode("BF16", [0.0]))
    raw["model.layers.15.self_attn.k_scale"] = ("BF16", (3, 1, 1), encode("BF16", [0.1, 0.2, 0.3]))
    raw["model.layers.20.self_attn.kv_scale"] = raw.pop("model.layers.20.self_attn.k_scale")
    result = static.verify(corrupt(src, tmp_path / "bad", raw=raw))
    lines = sorted(p.line() for p in result.problems)
    expected = {
        ("missing", 4, "model.layers.4.self_attn.v_scale"),
        ("not-finite", 9, "model.layers.9.self_attn.k_scale"),
        ("not-positive", 12, "model.layers.12.self_attn.v_scale"),
        ("shape", 15, "model.layers.15.self_attn.k_scale"),
        ("legacy-name", 20, "model.layers.20.self_attn.kv_scale"),
    }
    found = {(p.code, p.layer, p.tensor) for p in result.problems}
    assert expected <= found, lines
    # nothing else is reported, except that the NaN/zero scales may also fail the calibration-coverage check
    assert {f for f in found - expected if f[0] != "clipped"} == set(), lines


def test_all_ones_fails(demo_checkpoint: Path, checkpoint_raw: Raw, tmp_path: Path) -> None:
    raw = {n: (("BF16", (1,), encode("BF16", [1.0])) if n.endswith(("k_scale", "v_scale")) else t)
           for n, t in checkpoint_raw.items()}  # fmt: skip
    result = static.verify(corrupt(Path(demo_checkpoint), tmp_path / "ones", raw=raw))
    assert "all-default" in {p.code for p in result.problems}


def test_scheme_missing_or_inconsistent(demo_checkpoint: Path, tmp_path: Path) -> None:
    src = Path(demo_checkpoint)
    config = json.loads((src / "config.json").read_text())
    no_scheme = {k: v for k, v in config.items() if k != "quantization_config"}
    result = static.verify(corrupt(src, tmp_path / "noscheme", config=no_scheme))
    assert [p.code for p in result.problems] == ["scheme-missing"]

    head = json.loads(json.dumps(config))
    head["quantization_config"]["kv_cache_scheme"]["strategy"] = "attn_head"
    result = static.verify(corrupt(src, tmp_path / "head", config=head))
    assert {p.code for p in result.problems} == {"shape"}  # per-tensor scales under a per-head scheme
    assert len(result.problems) == 60


def test_scale_below_recorded_calibration_max(demo_checkpoint: Path, tmp_path: Path) -> None:
    src = Path(demo_checkpoint)
    result = static.verify(src)
    k3 = result.scales[3].k[0]
    report = json.loads((src / static.REPORT_NAME).read_text())
    assert static.calibration_maxima(report), f"no per-layer maxima found in the report: {list(report)}"
    for entry in report["layers"]:
        if entry["layer"] == 3:
            for head in entry["k"]:  # calibration saw 1.5x what the saved scale can hold
                head["calibration"]["absmax"] = k3 * 448 * 1.5
    result = static.verify(corrupt(src, tmp_path / "clip", report=report))
    assert [(p.code, p.layer, p.tensor) for p in result.problems] == [
        ("clipped", 3, "model.layers.3.self_attn.k_scale")
    ]


def test_changed_in_place(demo_checkpoint: Path, checkpoint_raw: Raw, tmp_path: Path) -> None:
    """The calibrator records the saved folder's weights_digest; the same folder with other weights (here one scale
    1% higher: sound on its own) fails static verification, naming both hashes."""
    src = Path(demo_checkpoint)
    recorded = static.recorded_artifact_hash(json.loads((src / static.REPORT_NAME).read_text()))
    assert recorded == weights_digest(src), "the calibrator records the saved checkpoint's weights_digest"
    raw = dict(checkpoint_raw)
    dtype, shape, _ = raw["model.layers.5.self_attn.k_scale"]
    raw["model.layers.5.self_attn.k_scale"] = (dtype, shape, encode(dtype, [static.verify(src).scales[5].k[0] * 1.01]))
    changed = tmp_path / "changed"
    shutil.copytree(src, changed)
    (weights,) = changed.glob("*.safetensors")
    write_safetensors(weights, raw)  # rewritten at the same path, the report kept
    (problem,) = static.verify(changed).problems
    assert (problem.code, problem.tensor) == ("changed-in-place", static.REPORT_NAME)
    assert recorded[:12] in problem.message and weights_digest(changed)[:12] in problem.message
