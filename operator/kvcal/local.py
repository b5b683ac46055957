"""What local runs (the demo, the dev control plane, a vLLM server for `kvcal compare`) take from this machine."""

import contextlib
import os
import signal
import socket
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Self


def cache_dir() -> Path:
    """$KVCAL_CACHE, else ~/.cache/kvcal: downloaded models and the control plane's binaries."""
    return Path(os.environ.get("KVCAL_CACHE") or Path.home() / ".cache" / "kvcal")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def stop_process_group(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM the process group that `process` leads (started with start_new_session=True), SIGKILL it after
    `timeout` seconds, then SIGKILL what is left of the group: a child may outlive its parent a moment."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


class LocalProcesses:
    """Processes this machine runs for a while: ``with X(...) as x`` starts them and always stops them."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
