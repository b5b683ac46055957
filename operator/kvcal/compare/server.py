"""A real `vllm serve` subprocess on a free loopback port: started, waited on (GET /health, or the process dying),
logged to a file, and torn down with its whole process group (vLLM forks an engine-core process)."""

import contextlib
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import httpx

from kvcal.local import LocalProcesses, free_port, stop_process_group

SERVED_NAME = "kvcal"


def vllm_command() -> list[str]:
    """The venv's `vllm` entry point when present, else the module (same interpreter either way)."""
    script = Path(sys.executable).with_name("vllm")
    return [str(script)] if script.exists() else [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def cpu_env(base: dict[str, str] | None = None, kv_cache_gib: int = 1) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))  # GiB on the CPU backend (default would take more)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    return env


@dataclass
class ServerConfig:
    model: Path
    kv_cache_dtype: str = "auto"
    max_model_len: int = 2048
    enforce_eager: bool = True  # skips torch.compile warm-up: start-up in seconds rather than minutes on CPU
    max_num_seqs: int = 8
    extra_args: Sequence[str] = ()
    startup_timeout: float = 900.0
    env: dict[str, str] = field(default_factory=dict)
    # Exact KV space (--kv-cache-memory-bytes) instead of VLLM_CPU_KVCACHE_SPACE's whole GiB.
    kv_cache_memory_bytes: int | None = None
    # HTTPS: vLLM's --ssl-certfile/--ssl-keyfile, and the CA the health wait checks them against.
    tls: tuple[Path, Path, Path] | None = None  # (certificate, key, CA)


class VllmServer(LocalProcesses):
    """Context manager: `with VllmServer(cfg, log_path) as server: server.url`."""

    def __init__(self, config: ServerConfig, log_path: Path, port: int | None = None) -> None:
        self.config = config
        self.log_path = log_path
        self.port = port or free_port()
        self.url = f"{'https' if config.tls else 'http'}://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None

    def args(self) -> list[str]:
        c = self.config
        args = [
            *vllm_command(),
            "serve",
            str(c.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            SERVED_NAME,
            "--dtype",
            "bfloat16",
            "--max-model-len",
            str(c.max_model_len),
            "--kv-cache-dtype",
            c.kv_cache_dtype,
            "--max-num-seqs",
            str(c.max_num_seqs),
            "--seed",
            "0",
            "--distributed-executor-backend",
            "uni",  # one GPU or CPU: the worker lives in the engine process (one spawn and ~30 s of imports less)
        ]
        if c.enforce_eager:
            args.append("--enforce-eager")
        if c.kv_cache_memory_bytes is not None:
            args += ["--kv-cache-memory-bytes", str(c.kv_cache_memory_bytes)]
        if c.tls is not None:
            args += ["--ssl-certfile", str(c.tls[0]), "--ssl-keyfile", str(c.tls[1])]
        return [*args, *c.extra_args]

    def start(self) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        started = time.monotonic()
        self.process = subprocess.Popen(
            self.args(),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env(),
            start_new_session=True,  # its own process group, so stop() reaches the engine-core child too
        )
        log.close()
        try:
            self._wait_healthy(started)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def env(self) -> dict[str, str]:
        env = cpu_env() | self.config.env
        if self.config.kv_cache_memory_bytes is not None:
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # vLLM's CPU platform would override the flag with it
        return env

    def _wait_healthy(self, started: float) -> None:
        assert self.process is not None
        verify = ssl.create_default_context(cafile=str(self.config.tls[2])) if self.config.tls else True
        with httpx.Client(timeout=5.0, verify=verify) as client:
            while True:
                code = self.process.poll()
                if code is not None:
                    raise RuntimeError(f"vllm serve exited with {code} before becoming healthy:\n{self.log_tail()}")
                if time.monotonic() - started > self.config.startup_timeout:
                    raise TimeoutError(
                        f"vllm serve not healthy after {self.config.startup_timeout:.0f}s:\n{self.log_tail()}"
                    )
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # not listening yet
                self.process_wait(0.5)

    def process_wait(self, seconds: float) -> None:
        """Waits for the process to exit, at most `seconds` (the poll interval of the health wait)."""
        assert self.process is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=seconds)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self) -> None:
        if self.process is not None:  # the whole group: vLLM's engine-core child too
            stop_process_group(self.process, timeout=30)
