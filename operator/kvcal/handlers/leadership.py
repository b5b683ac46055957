"""`kvcal operator run --leader-elect`: stand by until this replica holds the Lease, then run the operator.

A standby runs no kopf (no watches, no reconciles, no memory per object) and answers the liveness probe itself, on
the port kopf's endpoint takes over once it leads. The leader renews the lease in a thread; if it loses the lease the
operator stops and the process exits 1, so Kubernetes restarts it as a standby. SIGTERM stops a standby at once and a
leader gracefully, after which it releases the lease for a standby to take at once.
"""

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from urllib.parse import urlparse

from kvcal.services.leader import LeaderElector

log = logging.getLogger(__name__)
EXIT_LOST_LEASE = 1


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path.startswith("/healthz") else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass  # the kubelet probes every few seconds: nothing worth a log line


@contextmanager
def standby_liveness(liveness: str | None) -> Iterator[None]:
    """Answer kopf's liveness URL (e.g. http://0.0.0.0:8080/healthz) while standing by; free the port after."""
    if not liveness:
        yield
        return
    url = urlparse(liveness)
    server = ThreadingHTTPServer((url.hostname or "0.0.0.0", url.port or 80), _Healthy)
    thread = threading.Thread(target=server.serve_forever, name="standby-liveness", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM/SIGINT set `stop` while standing by (kopf installs its own handlers once it runs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %s while standing by: stopping", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_elected(
    elector: LeaderElector,
    run_operator: Callable[[threading.Event], None],
    liveness: str | None,
    on_leading: Callable[[bool], None] = lambda _leading: None,
) -> int:
    """Stand by, lead (run_operator(stop_flag) until it returns), release. Returns the process exit code."""
    stop = threading.Event()
    with stop_on_signals(stop), standby_liveness(liveness):
        if not elector.wait_for_leadership(stop):
            return 0
    lost = threading.Event()
    operator_stop = threading.Event()

    def lose() -> None:
        lost.set()
        operator_stop.set()

    renewer = threading.Thread(target=elector.hold, args=(operator_stop, lose), name="lease-renewer", daemon=True)
    on_leading(True)
    renewer.start()
    try:
        run_operator(operator_stop)  # kopf handles SIGTERM/SIGINT from here on
    finally:
        operator_stop.set()
        renewer.join(elector.timing.retry_seconds + 5)
        on_leading(False)
        if not lost.is_set():
            elector.release()
    if lost.is_set():
        log.error("exiting: another replica may lead now")
        return EXIT_LOST_LEASE
    return 0
