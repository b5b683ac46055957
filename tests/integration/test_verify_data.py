"""`kvcal verify --data`: a checkpoint's scales held against what its own weights make of real prompts. A tiny random
Llama (the demo tokenizer) calibrated per head by the real calibrator passes; a copy made elsewhere (no kvcal report)
with its scales divided by 10, and one whose layer-1 value projection was changed after the scales were made, both
pass static verification and fail here, naming the layers."""

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from kvcal.demo import HOLDOUT_SET
from kvcal.verify.cli import main as verify
from tests.integration.test_calib_families import FAMILIES, LAYERS, calibrate, tiny

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def calibrated(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verify-data")
    config_class, extra = FAMILIES["llama (GQA)"]
    model = tiny(config_class, {**extra, "vocab_size": 49152, "max_position_embeddings": 512})
    model.to(torch.bfloat16).save_pretrained(root / "model")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy2(demo_model_dir / name, root / "model" / name)
    rc, checkpoint = calibrate(root / "model", root, "head", samples=16, maxSeqLength=256)
    assert rc == 0, (root / "termination-log").read_text()
    return checkpoint


def made_elsewhere(checkpoint: Path, into: Path, edit: Callable[[str, torch.Tensor], torch.Tensor]) -> Path:
    """A copy without kvcal's report (as a checkpoint from another pipeline arrives), its tensors edited."""
    shutil.copytree(checkpoint, into)
    (into / "kvcal-report.json").unlink()
    for path in into.glob("*.safetensors"):
        tensors = load_file(path)
        save_file({name: edit(name, tensor) for name, tensor in tensors.items()}, path, metadata={"format": "pt"})
    return into


def run(checkpoint: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    rc = verify([str(checkpoint), *args, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_the_calibrated_checkpoint_passes_on_held_out_prompts(
    calibrated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc = run(calibrated, "--data", str(HOLDOUT_SET), capsys=capsys)
    data = doc["data"]
    assert rc == 0 and doc["ok"], doc["problems"]
    assert isinstance(data, dict) and data["samples"] > 0 and data["tokens"] > 0
    heads = data["heads"]
    assert len(heads) == LAYERS * 2 * 2  # layers x (K, V) x KV heads
    assert max(head["rangeUsed"] for head in heads) > 0.5  # the scales fit this data: most of the range used


def test_scales_ten_times_too_small_fail_every_layer(
    calibrated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def shrink(name: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor / 10 if name.endswith(("k_scale", "v_scale")) else tensor

    copy = made_elsewhere(calibrated, tmp_path / "shrunk", shrink)
    assert verify([str(copy)]) == 0  # static verification: present, finite, the right shape
    capsys.readouterr()
    rc, doc = run(copy, "--data", str(HOLDOUT_SET), capsys=capsys)
    problems = doc["problems"]
    assert rc == 1 and isinstance(problems, list)
    failed = {(problem["layer"], problem["tensor"]) for problem in problems}
    assert failed == {(layer, f"{kind}_scale") for layer in range(LAYERS) for kind in ("k", "v")}, problems
    assert all(problem["code"] == "data-clips" for problem in problems)
    assert "clip on these prompts" in problems[0]["line"]


def test_weights_changed_after_the_scales_were_made_fail_that_layer(
    calibrated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def louder_values(name: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor * 4 if name.endswith("layers.1.self_attn.v_proj.weight") else tensor

    def quieter_keys(name: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor / 32 if name.endswith("layers.2.self_attn.k_proj.weight") else tensor

    for name, edit, expected in (("louder", louder_values, (1, "v_scale", "data-clips")),
                                 ("quieter", quieter_keys, (2, "k_scale", "data-range-unused"))):  # fmt: skip
        copy = made_elsewhere(calibrated, tmp_path / name, edit)
        assert verify([str(copy)]) == 0  # no report, no hash to compare: static verification cannot tell
        capsys.readouterr()
        rc, doc = run(copy, "--data", str(HOLDOUT_SET), capsys=capsys)
        problems = doc["problems"]
        assert rc == 1 and isinstance(problems, list), doc
        assert [(p["layer"], p["tensor"], p["code"]) for p in problems] == [expected], problems


def test_unreadable_prompts_are_a_clear_error(
    calibrated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert verify([str(calibrated), "--data", str(empty)]) == 2
    assert "kvcal verify --data" in capsys.readouterr().err
