"""The verifier bundle run as the verification Job runs it in a stock vLLM image: `python3 kvcal-verifier.pyz ...`
with PYTHONPATH set to the bundle, by a Python that has vLLM but no kvcal.

The stand-in for the stock image is this venv's interpreter with `-S`: no site initialisation, so no .pth file
runs and the editable install of kvcal (a .pth naming operator/) is invisible; its site-packages directory (vLLM,
torch) is put on PYTHONPATH by hand."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from kvcal.compare import run
from kvcal.verify import static
from kvcal.verify.bundle import build_bundle
from kvcal.verify.tensors import encode, write_safetensors
from tests.support.prereq import require_hardware

SITE_PACKAGES = sysconfig.get_paths()["purelib"]
SCHEME = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": "tensor"}


def stock_python(
    bundle: Path | None, *args: str, timeout: float = 60, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python3 -S ARGS` with only the bundle (if any) and site-packages importable, from a folder outside the repo."""
    path = [str(bundle)] if bundle else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env |= {"PYTHONPATH": os.pathsep.join([*path, SITE_PACKAGES]), "PYTHONNOUSERSITE": "1", "HF_HUB_OFFLINE": "1"}
    env |= extra_env or {}
    cwd = bundle.parent if bundle else Path("/")
    return subprocess.run(
        [sys.executable, "-S", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("kvcal-verifier"))


def test_kvcal_is_importable_only_from_the_bundle(bundle: Path) -> None:
    probe = "import importlib.util as u; print(u.find_spec('kvcal') is None, u.find_spec('safetensors') is not None)"
    without = stock_python(None, "-c", probe)
    assert without.stdout.split() == ["True", "True"], without.stderr  # site-packages alone: no kvcal
    where = stock_python(bundle, "-c", "import kvcal.verify.readback as r; print(r.__file__)")
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip() == str(bundle / "kvcal" / "verify" / "readback.py")


def test_static_verification_from_the_bundle(bundle: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    config["quantization_config"] = {"quant_method": "compressed-tensors", "kv_cache_scheme": SCHEME}
    (checkpoint / "config.json").write_text(json.dumps(config))
    raw = {f"model.layers.{n}.self_attn.{kind}_scale": ("BF16", (1,), encode("BF16", [0.03 * (n + 1)]))
           for n in range(2) for kind in ("k", "v")}  # fmt: skip
    del raw["model.layers.1.self_attn.v_scale"]
    write_safetensors(checkpoint / "model.safetensors", raw)
    term = tmp_path / "termination-log"

    proc = stock_python(bundle, str(bundle), str(checkpoint), "--json", "--termination-log", str(term))
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert [(p["code"], p["layer"], p["tensor"]) for p in doc["problems"]] == [
        ("missing", 1, "model.layers.1.self_attn.v_scale")
    ]
    assert json.loads(term.read_text())["problems"] == [doc["problems"][0]["line"]]

    help_text = stock_python(bundle, str(bundle), "--help")
    assert help_text.returncode == 0 and "--tensor-parallel-size" in help_text.stdout


@pytest.mark.vllm
@pytest.mark.model
@pytest.mark.slow
def test_runtime_read_back_from_the_bundle(fp8_vllm: None, demo_checkpoint: Path, bundle: Path, tmp_path: Path) -> None:
    """The Job's command: real vLLM loads the calibrated demo checkpoint, the bundle reads the scales back."""
    term = tmp_path / "termination-log"
    args = [str(bundle), str(demo_checkpoint), "--runtime", "--kv-cache-dtype", "fp8", "--tensor-parallel-size", "1"]
    proc = stock_python(bundle, *args, "--json", "--termination-log", str(term), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True and doc["mismatches"] == 0 and doc["tensorParallelSize"] == 1
    checkpoint = static.verify(Path(demo_checkpoint))
    loaded = {row["layer"]: row for row in doc["loaded"]}
    assert sorted(loaded) == list(range(checkpoint.shape.layers))
    assert all(row["worker"] == 0 and row["kv_cache_dtype"] == "fp8" for row in loaded.values())
    assert all((loaded[n]["k"], loaded[n]["v"]) == (s.k[0], s.v[0]) for n, s in checkpoint.scales.items())
    assert json.loads(term.read_text()) == {"ok": True, "layers": 30, "mismatches": 0, "problems": []}


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


@pytest.mark.vllm
@pytest.mark.model
@pytest.mark.slow
def test_tensor_parallel_read_back_compares_every_worker_with_its_heads(
    fp8_vllm: None, amplified_calibration: Path, bundle: Path, tmp_path: Path
) -> None:
    """The per-head demo checkpoint (3 KV heads) at TP 3, the smallest TP the demo model's 9 query heads allow: real
    vLLM (mp executor, one process per rank) gives rank r KV head r, and each worker's read-back must equal that
    head's scales. Reading worker 0 alone, or comparing every worker with all heads, would fail here."""
    # A hardware limit, not a missing install: vLLM's CUDA build runs TP 3 only on 3 GPUs (require_hardware: it
    # skips, and fails under KVCAL_REQUIRE_HARDWARE, as the FP8-KV tests do).
    require_hardware(run.platform() == "cpu" or gpu_count() >= 3, "TP 3 on vLLM's CUDA build needs 3 GPUs")
    cores = sorted(os.sched_getaffinity(0))
    # vLLM's CPU workers each bind their own cores ("auto" wants a NUMA node per rank): share what this machine has.
    binding = "|".join(str(cores[rank % len(cores)]) for rank in range(3))
    args = [str(bundle), str(amplified_calibration), "--runtime", "--tensor-parallel-size", "3", "--json"]
    proc = stock_python(bundle, *args, timeout=900, extra_env={"VLLM_CPU_OMP_THREADS_BIND": binding})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True and doc["mismatches"] == 0 and doc["tensorParallelSize"] == 3
    checkpoint = static.verify(amplified_calibration)
    assert checkpoint.strategy == "attn_head" and checkpoint.shape.kv_heads == 3
    by_worker = {(row["worker"], row["layer"]): row for row in doc["loaded"]}
    assert len(by_worker) == 3 * checkpoint.shape.layers
    for (worker, layer), row in by_worker.items():
        scales = checkpoint.scales[layer]
        assert (row["k_values"], row["v_values"]) == ([scales.k[worker]], [scales.v[worker]]), (worker, layer)
