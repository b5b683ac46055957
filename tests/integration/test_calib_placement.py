"""The real calibrate path on each placement the CPU can host, injected (calibrator/placement.py): the plain CPU
load, compressed-tensors' offloaded dispatch with every module resident (what one accelerator gets), and layer by
layer (weights beyond the budget onloaded per forward pass, here from local disk to the CPU as they would be from
host memory to an accelerator). Forward pre-hooks on every Linear assert that its input sits on its weight's device
and that the weight is materialised (not meta) when it runs; the scales and the checkpoint match the plain path."""

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvcal.calibrator.placement import Placement

pytestmark = pytest.mark.model

SAMPLES, MAX_SEQ_LENGTH, HOLDOUT = 3, 48, 2
PLACEMENTS = {
    "cpu": Placement("cpu", ("cpu",), {"cpu": 1 << 40}, why="test: plain CPU load"),
    "one-device": Placement("one-device", ("cpu",), {"cpu": 1 << 40}, why="test: every module resident"),
    # ~1/3 of SmolLM2's 269 MB on the device, the rest onloaded layer by layer
    "layer-by-layer": Placement(
        "layer-by-layer", ("cpu",), {"cpu": 90 << 20}, host_weight_bytes=0, disk_weight_bytes=180 << 20, why="test"
    ),
}


@dataclass
class DeviceCheck:
    """Every Linear's input against its weight, at call time."""

    calls: int = 0
    offloaded: int = 0
    wrong: list[str] = field(default_factory=list)

    def attach(self, model: Any) -> None:
        import torch

        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_pre_hook(self._hook(name))

    def _hook(self, name: str) -> Any:
        def check(module: Any, args: tuple[Any, ...]) -> None:
            weight = module.weight
            self.calls += 1
            if type(module._parameters).__name__ != "dict":  # compressed-tensors' OffloadCache
                self.offloaded += 1
            if weight.device.type == "meta" or args[0].device != weight.device:
                self.wrong.append(f"{name}: input on {args[0].device}, weight on {weight.device}")

        return check


@pytest.fixture(scope="module")
def runs(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Any, Any]]]:
    from kvcal.calibrator import run
    from kvcal.calibrator.config import CalibrationConfig
    from kvcal.demo import CALIBRATION_SET, HOLDOUT_SET

    real_load = run.load_model
    results: dict[str, tuple[Any, Any]] = {}
    for label, placement in PLACEMENTS.items():
        check = DeviceCheck()

        def load(model_dir: Path, chosen: Placement, offload_dir: Path, check: DeviceCheck = check) -> Any:
            model = real_load(model_dir, chosen, offload_dir)
            check.attach(model)
            return model

        run.load_model = load  # type: ignore[assignment]
        try:
            config = CalibrationConfig(
                model_dir=demo_model_dir,
                data=CALIBRATION_SET,
                holdout_data=HOLDOUT_SET,
                out=tmp_path_factory.mktemp(label) / "checkpoint",
                samples=SAMPLES,
                max_seq_length=MAX_SEQ_LENGTH,
                holdout_samples=HOLDOUT,
                length_distribution={256: 1.0},
                plots=False,
            )
            results[label] = (run.calibrate(config, placement), check)
        finally:
            run.load_model = real_load  # type: ignore[assignment]
    yield results


@pytest.mark.parametrize("label", list(PLACEMENTS))
def test_every_layer_computes_where_its_weights_are(runs: dict[str, tuple[Any, Any]], label: str) -> None:
    report, check = runs[label]
    layers = report.provenance.layers
    # 7 Linear per layer (q, k, v, o, gate, up, down) per forward pass; the LM head is read by the report directly
    assert check.calls >= 7 * layers * (SAMPLES + 4 * HOLDOUT), check.calls
    assert check.wrong == []
    assert report.device.placement == label and report.device.devices == ["cpu"]
    assert report.summary.device == "cpu" and report.summary.placement == label
    if label == "layer-by-layer":
        assert check.offloaded > 0 and report.device.disk_weight_bytes > 0
    if label == "cpu":
        assert check.offloaded == 0


@pytest.mark.parametrize("label", ["one-device", "layer-by-layer"])
def test_placements_give_the_plain_paths_scales_and_checkpoint(runs: dict[str, tuple[Any, Any]], label: str) -> None:
    plain, _ = runs["cpu"]
    placed, _ = runs[label]
    assert placed.scales == plain.scales
    assert placed.provenance.artifact_hash == plain.provenance.artifact_hash  # same safetensors bytes, same config
    assert placed.end_to_end.fp8_calibrated.top1_agreement == plain.end_to_end.fp8_calibrated.top1_agreement


def refusal(demo_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **config: Any) -> str:
    """The calibrator's error for this config; fails the test if the model was loaded first."""
    from kvcal.calibrator import run
    from kvcal.calibrator.config import CalibrationConfig
    from kvcal.calibrator.preflight import InputError
    from kvcal.demo import CALIBRATION_SET

    def no_load(*_args: object) -> None:
        raise AssertionError("the model was loaded before preflight refused")

    monkeypatch.setattr(run, "load_model", no_load)
    settings = CalibrationConfig(
        model_dir=demo_model_dir, data=CALIBRATION_SET, out=tmp_path / "out", plots=False, **config
    )
    with pytest.raises(InputError) as refused:
        run.calibrate(settings)
    assert not (tmp_path / "out").exists()  # refused before the output was touched
    return str(refused.value)


def test_preflight_refuses_a_calibration_that_outlasts_the_deadline(
    demo_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 16 samples of up to 512 tokens: tens of seconds of measured CPU work against a 1-second deadline
    message = refusal(demo_model_dir, tmp_path, monkeypatch, samples=16, max_seq_length=512, deadline_seconds=1)
    assert "spec.calibration.job.activeDeadlineSeconds" in message and "spec.calibration.samples" in message


def test_preflight_refuses_a_calibration_larger_than_the_pods_memory(
    demo_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvcal.calibrator import run

    monkeypatch.setattr(run, "host_memory_bytes", lambda: 1 << 30)  # a pod limited to 1 GiB
    message = refusal(demo_model_dir, tmp_path, monkeypatch, samples=4, device="cpu")
    assert "spec.calibration.job.resources.limits.memory" in message


def test_the_job_passes_its_deadline_to_preflight(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from kvcal.calibrator.cli import config_from_args, register
    from kvcal.core.manifests.jobs import DEADLINE_ENV

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    monkeypatch.setenv(DEADLINE_ENV, "1800")
    args = parser.parse_args(["calibrate", "model", "--data", "d.jsonl", "--out", "o"])
    assert config_from_args(args).deadline_seconds == 1800
