"""adapters.kube.retrying with a recording sleep: the backoff schedule of a transient failure, the give-up, and what is
never retried, all without waiting; KubeClient hands its own sleep and clock to every call."""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from kvcal.adapters.kube import KubeClient, retrying


def failing(*errors: Exception, result: str = "ok") -> Callable[[], str]:
    """A call that raises `errors` one by one, then returns `result`."""
    pending = list(errors)

    def call() -> str:
        if pending:
            raise pending.pop(0)
        return result

    return call


def test_transient_errors_are_retried_with_doubling_delays() -> None:
    slept: list[float] = []
    call = failing(ApiException(status=503), ApiException(status=429), ApiException(status=500))
    assert retrying(call, sleep=slept.append) == "ok"
    assert slept == [0.2, 0.4, 0.8]


def test_connection_errors_are_retried_like_transient_answers() -> None:
    slept: list[float] = []
    call = failing(urllib3.exceptions.ProtocolError("reset"), ConnectionError("refused"))
    assert retrying(call, base_delay=1.0, sleep=slept.append) == "ok"
    assert slept == [1.0, 2.0]


def test_gives_up_after_the_last_attempt_without_sleeping_after_it() -> None:
    slept: list[float] = []
    calls = 0

    def call() -> str:
        nonlocal calls
        calls += 1
        raise ApiException(status=502)

    with pytest.raises(ApiException) as raised:
        retrying(call, sleep=slept.append)
    assert raised.value.status == 502
    assert calls == 5
    assert slept == [0.2, 0.4, 0.8, 1.6]


def test_gives_up_on_a_connection_error_after_the_last_attempt() -> None:
    slept: list[float] = []
    with pytest.raises(ConnectionError):
        retrying(failing(*[ConnectionError("refused")] * 3), attempts=3, sleep=slept.append)
    assert slept == [0.2, 0.4]


@pytest.mark.parametrize("status", [400, 403, 404, 409, 422])
def test_an_answer_that_is_not_transient_is_raised_at_once(status: int) -> None:
    slept: list[float] = []
    with pytest.raises(ApiException):
        retrying(failing(ApiException(status=status)), sleep=slept.append)
    assert slept == []


@dataclass
class Response:
    status: int
    data: bytes = b"{}"
    reason: str = ""

    def read(self) -> bytes:
        return self.data


@dataclass
class ScriptedApi:
    """Answers each call with the next of `answers`; records the bodies it was sent."""

    answers: list[Response]
    bodies: list[Any] = field(default_factory=list)

    def param_serialize(self, method: str, path: str, **kwargs: Any) -> tuple[Any, ...]:
        self.bodies.append(kwargs.get("body"))
        return (method, path)

    def call_api(self, *request: Any) -> Response:
        return self.answers.pop(0)


def test_the_client_retries_with_its_own_sleep() -> None:
    slept: list[float] = []
    api = ScriptedApi([Response(503), Response(504), Response(200, b'{"metadata": {"name": "x"}}')])
    kube = KubeClient(api, sleep=slept.append)  # type: ignore[arg-type]
    assert kube.get("ConfigMap", "llm", "x") == {"metadata": {"name": "x"}}
    assert slept == [0.2, 0.4]


def test_an_event_is_stamped_by_the_clients_clock() -> None:
    at = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    api = ScriptedApi([Response(201)])
    kube = KubeClient(api, sleep=lambda _: None, clock=lambda: at)  # type: ignore[arg-type]
    involved = {
        "apiVersion": "kvcal.dev/v1alpha1",
        "kind": "KVCalibration",
        "metadata": {"name": "m", "namespace": "llm"},
    }
    assert kube.emit_event(involved, "Normal", "Started", "started")
    (body,) = api.bodies
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2030-01-02T03:04:05Z"
    assert body["eventTime"] == "2030-01-02T03:04:05.678901Z"
