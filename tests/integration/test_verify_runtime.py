"""`kvcal verify CHECKPOINT --runtime`, exactly as the verification Job runs it: real vLLM loads the calibrated
demo checkpoint (one engine load) and the scales it reads back must equal the checkpoint's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcal.verify import static

pytestmark = [pytest.mark.vllm, pytest.mark.model, pytest.mark.slow]


def test_runtime_read_back_equals_checkpoint(fp8_vllm: None, demo_checkpoint: Path, tmp_path: Path) -> None:
    term = tmp_path / "termination-log"
    cmd = [sys.executable, "-m", "kvcal", "verify", str(demo_checkpoint), "--runtime", "--json",
           "--termination-log", str(term)]  # fmt: skip
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    checkpoint = static.verify(Path(demo_checkpoint))

    assert doc["ok"] is True and doc["mismatches"] == 0 and doc["problems"] == []
    loaded = {row["layer"]: row for row in doc["loaded"]}
    assert sorted(loaded) == list(range(checkpoint.shape.layers))
    for layer, scales in checkpoint.scales.items():
        row = loaded[layer]
        assert row["kv_cache_dtype"] == "fp8"
        assert row["method"] == "CompressedTensorsKVCacheMethod"
        assert (row["k"], row["v"]) == (scales.k[0], scales.v[0]), f"layer {layer}"  # bit-exact: bf16 -> float32
    assert json.loads(term.read_text()) == {"ok": True, "layers": 30, "mismatches": 0, "problems": []}
