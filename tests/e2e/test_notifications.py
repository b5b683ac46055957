"""Issue #25 item 4 on the real API server: webhook notifications posted over real HTTP (httpx) to a receiver on
loopback, by the real reconciler and sender. A transition is posted once, with its Idempotency-Key, and recorded in
status after the 2xx; a receiver that is down at first gets it after backoff once it is up; a restart of the operator
(a new reconciler and sender, status as the killed one left it) neither repeats a recorded delivery nor loses one.
The transition told is a real one: an abort in Calibrating rolls back (RolledBack, cause Aborted)."""

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal.adapters.kube import KubeClient
from kvcal.adapters.webhook import HttpxPoster
from kvcal.core.notifications import WebhookTarget
from kvcal.handlers.operator import OperatorOptions, run
from kvcal.ports import Manifest
from kvcal.services.notifier import Notifier
from kvcal.services.reconciler import Reconciler
from tests.support.cluster import Cluster, wait_for
from tests.support.world import HOST_PATHS_POLICY, DiesAfterStatusWrite, Killed, kvcalibration, setup_namespace

pytestmark = pytest.mark.cluster
TOKEN = "receiver-token"


@dataclass
class Receiver:
    """A webhook receiver on loopback: records each POST (headers, JSON body) and answers the next of `codes`, then
    200."""

    port: int
    posts: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def start(self) -> "Receiver":
        posts, codes = self.posts, self.codes

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                posts.append((dict(self.headers.items()), json.loads(body)))
                self.send_response(codes.pop(0) if codes else 200)
                self.end_headers()
                self.wfile.write(b'{"ok": true}')

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def events(self, name: str) -> list[str]:
        return [body["event"] for _, body in self.posts if body["object"]["name"] == name]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver(free_port())
    yield started
    started.stop()


class Operator:
    """One operator process's reconciler and sender; `restart` is a new one of each (nothing kept in memory)."""

    def __init__(self, cluster: Cluster, files: Path, kube: KubeClient | None = None, first_delay: float = 0.2) -> None:
        self.api = cluster.api_client()
        self.target = WebhookTarget(name="ops", url_file=str(files / "url"), token_file=str(files / "token"))
        self.notifier = Notifier([self.target], HttpxPoster(timeout_seconds=2), first_delay=first_delay, max_delay=2.0)
        self.woken = threading.Event()
        self.notifier.listen(lambda *_: self.woken.set())
        self.notifier.start()
        self.reconciler = Reconciler(
            kube or KubeClient(self.api), lambda: datetime.now(UTC), policy=HOST_PATHS_POLICY, notifier=self.notifier
        )

    def pass_when_woken(self, namespace: str, name: str) -> None:
        """The pass the sender's wake-up queues (handlers.operator wires it to the work queue)."""
        assert self.woken.wait(30), "the sender woke no pass"
        self.woken.clear()
        self.reconciler.reconcile(namespace, name)

    def stop(self) -> None:
        self.notifier.stop()


@pytest.fixture
def files(tmp_path: Path, receiver: Receiver) -> Path:
    """The chart's mounts: the URL and token Secrets as files."""
    (tmp_path / "url").write_text(f"http://127.0.0.1:{receiver.port}/hooks/kvcal\n")
    (tmp_path / "token").write_text(TOKEN)
    return tmp_path


def start(cluster: Cluster, namespace: str, name: str, tmp_path: Path) -> None:
    body = kvcalibration(name, tmp_path / "model", tmp_path / "out" / name)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body))


def abort(cluster: Cluster, namespace: str, name: str) -> None:
    cluster.kubectl("annotate", "-n", namespace, f"kvcalibration/{name}", "kvcal.dev/abort=e2e")


def status(kube: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    obj: Manifest | None = kube.get("KVCalibration", namespace, name)
    assert obj is not None
    return dict(obj.get("status") or {})


def roll_back(operator: Operator, kube: KubeClient, cluster: Cluster, namespace: str, name: str) -> None:
    """Pending -> Calibrating, then an abort: RollingBack -> RolledBack (passes until it gets there)."""
    operator.reconciler.reconcile(namespace, name)
    abort(cluster, namespace, name)

    def rolled_back() -> bool:
        operator.reconciler.reconcile(namespace, name)
        return bool(status(kube, namespace, name)["phase"] == "RolledBack")

    wait_for(rolled_back, 30, f"{name} rolled back")


def test_a_restart_neither_repeats_nor_loses_a_notification(
    control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path, receiver: Receiver, files: Path
) -> None:
    cluster, kube = control_plane, KubeClient(control_plane.api_client())
    setup_namespace(cluster, namespace, tmp_path / "model")
    receiver.start()
    name = "restarted"
    start(cluster, namespace, name, tmp_path)
    # The first operator writes every status of the rollback and dies right after each write, before its sender
    # got anything: the RolledBack notification exists only as status.history.
    dying = Operator(cluster, files, DiesAfterStatusWrite(cluster.api_client()))

    def dying_pass_to(phase: str) -> bool:
        with contextlib.suppress(Killed):
            dying.reconciler.reconcile(namespace, name)
        return bool(status(kube, namespace, name).get("phase") == phase)

    wait_for(lambda: dying_pass_to("Calibrating"), 30, "Calibrating")
    abort(cluster, namespace, name)
    wait_for(lambda: dying_pass_to("RolledBack"), 30, "RolledBack")
    dying.stop()
    assert [h["phase"] for h in status(kube, namespace, name)["history"]][-1] == "RolledBack"
    assert receiver.posts == []

    # A restart: the notification is not lost. Posted once, then recorded in status by the pass it wakes.
    restarted = Operator(cluster, files)
    restarted.reconciler.reconcile(namespace, name)
    restarted.pass_when_woken(namespace, name)
    ((headers, body),) = receiver.posts
    assert body["event"] == "RolledBack" and body["cause"] == "Aborted" and body["object"]["name"] == name
    assert headers["Idempotency-Key"] == body["idempotencyKey"] and headers["Authorization"] == f"Bearer {TOKEN}"
    assert status(kube, namespace, name)["notifications"] == {"delivered": [f"ops/{body['idempotencyKey']}"]}
    restarted.stop()

    # Another restart: status records the delivery, so nothing is posted again. Proven by ordering: this operator's
    # sender posts in submission order, so a repeat for `name` would arrive before the other object's notification.
    again = Operator(cluster, files)
    again.reconciler.reconcile(namespace, name)
    start(cluster, namespace, "other", tmp_path)
    roll_back(again, kube, cluster, namespace, "other")
    wait_for(lambda: receiver.events("other"), 30, "the other object's notification")
    again.stop()
    assert receiver.events(name) == ["RolledBack"] and receiver.events("other") == ["RolledBack"]


def test_a_receiver_down_at_first_gets_it_after_backoff(
    control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path, receiver: Receiver, files: Path
) -> None:
    cluster, kube = control_plane, KubeClient(control_plane.api_client())
    setup_namespace(cluster, namespace, tmp_path / "model")
    name = "down"
    start(cluster, namespace, name, tmp_path)
    operator = Operator(cluster, files)
    try:
        roll_back(operator, kube, cluster, namespace, name)  # the receiver is not listening yet
        operator.pass_when_woken(namespace, name)  # the first failure, recorded
        notifications = status(kube, namespace, name)["notifications"]
        assert notifications == {
            "delivered": [],
            "lastError": "webhook ops: no answer (ConnectError); retrying with backoff",
        }
        receiver.start()
        wait_for(lambda: receiver.posts, 30, "the delivery once the receiver is up")
        # The wake-ups of the failures before it may come first: passes until the status records the delivery.
        wait_for(
            lambda: (
                operator.pass_when_woken(namespace, name) is None
                and status(kube, namespace, name)["notifications"].get("delivered")
            ),
            30,
            "the delivery recorded",
        )
    finally:
        operator.stop()
    ((headers, body),) = receiver.posts
    assert body["event"] == "RolledBack" and headers["Idempotency-Key"] == body["idempotencyKey"]
    assert status(kube, namespace, name)["notifications"] == {"delivered": [f"ops/{body['idempotencyKey']}"]}


def test_the_running_operator_records_a_delivery_without_waiting_for_a_resync(
    control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path, receiver: Receiver, files: Path
) -> None:
    """kopf and the work queue (handlers.operator): the sender's wake-ups queue the passes that record its error, then
    its delivery. The receiver fails the first post and the retry comes a second later, long after the passes the
    RolledBack write itself causes; a terminal object's next timed pass would be 10 minutes away."""
    cluster, kube = control_plane, KubeClient(control_plane.api_client())
    setup_namespace(cluster, namespace, tmp_path / "model")
    receiver.codes.append(503)
    receiver.start()
    operator = Operator(cluster, files, first_delay=1.0)
    stop, ready = threading.Event(), threading.Event()
    options = OperatorOptions(namespaces=[namespace], standalone=True)
    thread = threading.Thread(target=run, args=(operator.reconciler, operator.api, options, stop, ready), daemon=True)
    thread.start()
    try:
        assert ready.wait(60), "operator did not start"
        name = "running"
        start(cluster, namespace, name, tmp_path)
        wait_for(lambda: status(kube, namespace, name).get("phase") == "Calibrating", 30, "Calibrating")
        abort(cluster, namespace, name)
        wait_for(lambda: status(kube, namespace, name).get("notifications", {}).get("delivered"), 30, "recorded")
    finally:
        stop.set()
        thread.join(60)
        operator.stop()
    (_, failed), (_, body) = receiver.posts
    assert failed == body  # the same notification, the same idempotency key
    assert status(kube, namespace, name)["notifications"] == {"delivered": [f"ops/{body['idempotencyKey']}"]}
