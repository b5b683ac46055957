"""A background poller for e2e tests: records what it sees of the cluster while the test drives the operator."""

import threading
from typing import Self

POLL_SECONDS = 0.05


class PollingRecorder:
    """``with Recorder(...) as recorder``: ``poll()`` runs in a thread until the block ends."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def poll(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(POLL_SECONDS)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
