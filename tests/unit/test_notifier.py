"""services.notifier with a scripted poster: posts off the reconcile path, retries with bounded backoff, records a
delivery in status only after a 2xx, and a restarted operator (a new Notifier) neither repeats nor loses one."""

import json
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kvcal.core.notifications import WebhookTarget
from kvcal.core.timestamps import rfc3339
from kvcal.models.status import HistoryEntry, KVCalibrationStatus, Phase
from kvcal.services.notifier import Notifier, backoff
from kvcal.services.reconciler import Reconciler
from tests.support.cluster import wait_for
from tests.support.decide import NOW, OWNER, POLICY
from tests.support.fakekube import FakeKube, kvcal

URL = "https://hooks.example.com/services/T000/B000/secret-path"
TOKEN = "s3cr3t-token"
FAILED = KVCalibrationStatus(
    phase=Phase.FAILED, history=[HistoryEntry(phase=Phase.FAILED, at=rfc3339(NOW), reason="JobFailed", message="m")]
)
KEY = f"{OWNER.uid}/Failed/{rfc3339(NOW)}"


@dataclass
class ScriptedPoster:
    """Answers each POST with the next code of `codes` (then 200); an exception in `codes` is raised instead."""

    codes: list[int | Exception] = field(default_factory=list)
    posts: list[tuple[str, dict[str, object], dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> int:
        with self.lock:
            self.posts.append((url, json.loads(body), dict(headers)))
            answer = self.codes.pop(0) if self.codes else 200
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "url").write_text(URL + "\n")
    (tmp_path / "token").write_text(TOKEN)
    return str(tmp_path / "url"), str(tmp_path / "token")


@pytest.fixture
def senders() -> Iterator[list[Notifier]]:
    started: list[Notifier] = []
    yield started
    for notifier in started:
        notifier.stop()


def notifier(poster: ScriptedPoster, files: tuple[str, str], started: list[Notifier], **kw: float) -> Notifier:
    target = WebhookTarget(name="ops", url_file=files[0], token_file=files[1])
    options = {"first_delay": 0.01, "max_delay": 0.05, **kw}
    made = Notifier([target], poster, max_attempts=int(options.pop("max_attempts", 8)), **options).start()
    started.append(made)
    return made


def recorded(made: Notifier) -> KVCalibrationStatus:
    return made.record(OWNER, FAILED)


def test_backoff_doubles_up_to_its_bound() -> None:
    assert [backoff(n, 1.0, 60.0) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]


def test_a_2xx_is_recorded_and_not_posted_again(files: tuple[str, str], senders: list[Notifier]) -> None:
    poster = ScriptedPoster()
    made = notifier(poster, files, senders)
    woken: list[tuple[str, str]] = []
    made.listen(lambda namespace, name: woken.append((namespace, name)))
    made.submit(OWNER, FAILED, NOW)
    made.submit(OWNER, FAILED, NOW)  # a second pass before the answer: still one post
    wait_for(lambda: woken, 5, "the wake-up after the 2xx")
    ((url, body, headers),) = poster.posts
    assert url == URL and body["idempotencyKey"] == KEY and body["event"] == "Failed"
    assert headers["Idempotency-Key"] == KEY and headers["Authorization"] == f"Bearer {TOKEN}"
    assert woken == [("llm", "smollm2")]
    written = recorded(made)
    assert written.notifications.delivered == [f"ops/{KEY}"] and written.notifications.last_error is None
    made.submit(OWNER, written, NOW)  # the pass after the write: nothing due
    restarted = notifier(poster, files, senders)
    restarted.submit(OWNER, written, NOW)
    assert restarted.record(OWNER, written) == written
    assert len(poster.posts) == 1


def test_failures_are_retried_with_backoff_and_reported_until_a_2xx(
    files: tuple[str, str], senders: list[Notifier]
) -> None:
    poster = ScriptedPoster(codes=[503, ConnectionError("refused " + URL), 500])
    made = notifier(poster, files, senders)
    errors: list[str | None] = []
    made.listen(lambda *_: errors.append(recorded(made).notifications.last_error))
    made.submit(OWNER, FAILED, NOW)
    wait_for(lambda: recorded(made).notifications.delivered, 5, "the delivery after three failures")
    assert len(poster.posts) == 4 and {p[2]["Idempotency-Key"] for p in poster.posts} == {KEY}
    assert errors == [
        "webhook ops: HTTP 503; retrying with backoff",
        "webhook ops: no answer (ConnectionError); retrying with backoff",
        "webhook ops: HTTP 500; retrying with backoff",
        None,  # the 2xx clears it
    ]


def test_after_max_attempts_it_gives_up_until_a_restart(files: tuple[str, str], senders: list[Notifier]) -> None:
    poster = ScriptedPoster(codes=[502, 502])
    made = notifier(poster, files, senders, max_attempts=2)
    made.submit(OWNER, FAILED, NOW)
    wait_for(lambda: "gave up" in (recorded(made).notifications.last_error or ""), 5, "giving up")
    written = recorded(made)
    assert written.notifications.delivered == []
    made.submit(OWNER, written, NOW)  # later passes do not start it over
    assert len(poster.posts) == 2
    restarted = notifier(poster, files, senders)
    restarted.submit(OWNER, written, NOW)
    wait_for(lambda: restarted.record(OWNER, written).notifications.delivered, 5, "the delivery after the restart")
    assert len(poster.posts) == 3


def test_no_url_token_or_answer_reaches_status_or_log(
    files: tuple[str, str], senders: list[Notifier], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    poster = ScriptedPoster(codes=[ConnectionError(f"cannot reach {URL}"), 401])
    made = notifier(poster, files, senders, max_attempts=2)
    made.submit(OWNER, FAILED, NOW)
    wait_for(lambda: "gave up" in (recorded(made).notifications.last_error or ""), 5, "giving up")
    error = recorded(made).notifications.last_error or ""
    assert error.startswith("webhook ops: HTTP 401;")
    for text in (error, caplog.text):
        assert "secret-path" not in text and TOKEN not in text


def test_an_unreadable_or_non_http_url_is_an_error_without_a_post(
    tmp_path: Path, files: tuple[str, str], senders: list[Notifier]
) -> None:
    poster = ScriptedPoster()
    made = notifier(poster, (str(tmp_path / "missing"), files[1]), senders, max_attempts=1)
    made.submit(OWNER, FAILED, NOW)
    wait_for(lambda: recorded(made).notifications.last_error, 5, "the error")
    assert (recorded(made).notifications.last_error or "").startswith("webhook ops: its URL cannot be read")
    (tmp_path / "ftp").write_text("ftp://example.com/x")
    other = notifier(poster, (str(tmp_path / "ftp"), files[1]), senders, max_attempts=1)
    other.submit(OWNER, FAILED, NOW)
    wait_for(lambda: other.record(OWNER, FAILED).notifications.last_error, 5, "the error")
    assert "not http(s)" in (other.record(OWNER, FAILED).notifications.last_error or "")
    assert poster.posts == []


def test_the_reconciler_records_deliveries_in_its_status_write(files: tuple[str, str], senders: list[Notifier]) -> None:
    """Pending -> Calibrating is not told; an abort rolls back (nothing to drain yet): RolledBack is, once."""
    kube = FakeKube([kvcal()])
    poster = ScriptedPoster()
    made = notifier(poster, files, senders)
    woken = threading.Event()
    made.listen(lambda *_: woken.set())
    operator = Reconciler(kube, clock=lambda: NOW, policy=POLICY, notifier=made)
    operator.reconcile("llm", "smollm2")
    kube.objects[("KVCalibration", "smollm2")]["metadata"]["annotations"] = {"kvcal.dev/abort": "1"}
    while kube.objects[("KVCalibration", "smollm2")]["status"]["phase"] != "RolledBack":
        operator.reconcile("llm", "smollm2")
    assert woken.wait(5)
    operator.reconcile("llm", "smollm2")  # the pass the wake-up queues
    status = kube.objects[("KVCalibration", "smollm2")]["status"]
    ((_, body, _),) = poster.posts
    assert body["event"] == "RolledBack" and body["cause"] == "Aborted"
    assert status["notifications"]["delivered"] == [f"ops/{body['idempotencyKey']}"]
    writes = kube.calls.count("replace_status")
    restarted = Reconciler(kube, clock=lambda: NOW, policy=POLICY, notifier=notifier(poster, files, senders))
    restarted.reconcile("llm", "smollm2")
    assert kube.calls.count("replace_status") == writes and len(poster.posts) == 1
