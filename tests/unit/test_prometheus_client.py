"""adapters.prometheus against a local HTTP server: what a server answers never reaches a measurement (issue #23).

The reproduction: a server answering 403 with cloud credentials in its body ({"AccessKeyId": ..., "SecretAccessKey":
...}). Before, the body came back in the QueryError and so in the measurement's message in status; now the status
code and a fixed description do, and the body goes only to the log, redacted. The client also sends the configured
credentials, follows no redirect, and fetches nothing for a spec that picks no configured Prometheus.
"""

import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvcal.adapters.prometheus import PrometheusSource, QueryError, Unreachable, connect, run_query
from kvcal.core.analysis import promql
from kvcal.core.analysis.verdict import assess_run
from kvcal.core.guard.policy import Policy, PrometheusAccess
from kvcal.models.spec import AnalysisSpec, PrometheusRef
from kvcal.models.status import AnalysisStatus

ACCESS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET_ACCESS_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
METADATA_BODY = json.dumps(
    {"Code": "MetadataAnswer", "AccessKeyId": ACCESS_KEY_ID, "SecretAccessKey": SECRET_ACCESS_KEY}
)
EMPTY_VECTOR = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}})
# Any selector: the test server answers every query alike.
SELECTOR = promql.pod_label_selector("ns", "llm", {"app": "llm"})
LEAKS = (ACCESS_KEY_ID, SECRET_ACCESS_KEY, "AccessKeyId", "SecretAccessKey", "MetadataAnswer")


@dataclass
class Server:
    url: str
    status: int = 200
    body: str = EMPTY_VECTOR
    headers: dict[str, str] = field(default_factory=dict)
    received: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # (path, headers) of each request


@pytest.fixture
def server() -> Iterator[Server]:
    """A local HTTP server answering every GET with the fixture's status, headers and body (changeable per test)."""
    state = Server(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.received.append((self.path, dict(self.headers)))
            self.send_response(state.status)
            for name, value in {"Content-Type": "application/json", **state.headers}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(state.body.encode())

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{httpd.server_port}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


def access(url: str, **files: str) -> PrometheusAccess:
    return PrometheusAccess(name="metrics", address=url, **files)


def test_an_error_answers_body_reaches_neither_the_error_nor_the_status(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    server.status, server.body = 403, METADATA_BODY
    with caplog.at_level(logging.WARNING, logger="kvcal.adapters.prometheus"), pytest.raises(Unreachable) as raised:
        run_query(connect(access(server.url)), "up")
    assert str(raised.value) == "Prometheus 'metrics' refused the operator's credentials (HTTP 403)"

    spec = AnalysisSpec(prometheus=PrometheusRef(address=server.url), latency=[], min_requests=0)
    policy = Policy(prometheus_default=access(server.url))
    measurements = PrometheusSource(SELECTOR, policy=policy).measure(spec, 60)
    assert [(m.metric, m.phase) for m in measurements] == [("prometheus", "Error")]
    status = assess_run(spec, AnalysisStatus(), measurements, datetime.now(UTC)).status
    written = json.dumps(status.to_wire())
    assert "HTTP 403" in written
    for leak in LEAKS:
        assert leak not in written
    # The operator's log keeps what the server said, without the credentials.
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "HTTP 403" in logged and '"AccessKeyId": "***"' in logged and '"SecretAccessKey": "***"' in logged
    assert ACCESS_KEY_ID not in logged and SECRET_ACCESS_KEY not in logged


@pytest.mark.parametrize(
    ("status", "body", "error", "message"),
    [
        (400, METADATA_BODY, QueryError, "Prometheus 'metrics' answered HTTP 400: the query was refused"),
        (500, METADATA_BODY, QueryError, "Prometheus 'metrics' answered HTTP 500: an error"),
        (200, METADATA_BODY, QueryError, "Prometheus 'metrics' answered HTTP 200 with an unexpected body"),
        (200, "<html>" + SECRET_ACCESS_KEY, QueryError, "Prometheus 'metrics' answered HTTP 200 with an unexpected"),
        (401, METADATA_BODY, Unreachable, "Prometheus 'metrics' refused the operator's credentials (HTTP 401)"),
    ],
    ids=["400", "500", "200-not-prometheus", "200-not-json", "401"],
)
def test_every_error_is_a_status_and_a_fixed_description(
    server: Server, status: int, body: str, error: type[Exception], message: str
) -> None:
    server.status, server.body = status, body
    with pytest.raises(error) as raised:
        run_query(connect(access(server.url)), "up")
    assert str(raised.value).startswith(message)
    for leak in LEAKS:
        assert leak not in str(raised.value)


def test_a_redirect_is_not_followed(server: Server) -> None:
    """An allowed Prometheus (or whatever answers at its address) cannot send the operator on to another URL."""
    server.status, server.headers = 302, {"Location": "http://169.254.169.254/latest/meta-data/"}
    with pytest.raises(Unreachable, match=r"redirect \(HTTP 302\), which is not followed"):
        run_query(connect(access(server.url)), "up")
    assert len(server.received) == 1


def test_a_spec_that_picks_no_configured_prometheus_fetches_nothing(server: Server) -> None:
    policy = Policy(prometheus_default=access("http://prometheus.monitoring:9090"))
    metrics = PrometheusSource(SELECTOR, policy=policy)
    for ref in (PrometheusRef(address=server.url), PrometheusRef(name="other")):
        spec = AnalysisSpec(prometheus=ref, latency=[], min_requests=0)
        (error,) = metrics.measure(spec, 60)
        assert (error.metric, error.phase) == ("prometheus", "Error")
        assert "not a Prometheus the operator may query" in (error.message or "")
        assert metrics.kv_cache(spec).error
    assert server.received == []


def test_the_configured_entry_is_queried_whatever_the_spec_spells(server: Server) -> None:
    """Picked by name, the configured address is used; the spec's own string never becomes a URL."""
    policy = Policy(prometheus_additional=(access(server.url + "/"),))
    spec = AnalysisSpec(prometheus=PrometheusRef(name="metrics"), latency=[], min_requests=0)
    measurements = PrometheusSource(SELECTOR, policy=policy).measure(spec, 60)
    assert all(m.phase != "Error" for m in measurements), measurements
    assert server.received and all(path.startswith("/api/v1/query?") for path, _ in server.received)


def test_the_configured_credentials_are_sent(server: Server, tmp_path: Path) -> None:
    """Read from their files at each connection (a rotated Secret's new content is used)."""
    token = tmp_path / "token"
    token.write_text("first-token\n")
    with pytest.raises(ValueError, match="need an https:// address"):
        access(server.url, bearer_token_file=str(token))
    # The wire format of the credentials, over plain HTTP here only to read the headers back.
    bearer = access(server.url).model_copy(update={"bearer_token_file": str(token)})
    run_query(connect(bearer), "up")
    token.write_text("rotated-token")
    run_query(connect(bearer), "up")
    (tmp_path / "user").write_text("kvcal")
    (tmp_path / "password").write_text("s3cret")
    basic = access(server.url).model_copy(
        update={"username_file": str(tmp_path / "user"), "password_file": str(tmp_path / "password")}
    )
    run_query(connect(basic), "up")
    sent = [headers.get("Authorization") for _, headers in server.received]
    assert sent == ["Bearer first-token", "Bearer rotated-token", "Basic a3ZjYWw6czNjcmV0"]


def test_an_unreadable_credentials_file_fails_closed(server: Server, tmp_path: Path) -> None:
    # Read before connecting: the server (here behind an https:// address) is never reached.
    missing = access(server.url.replace("http:", "https:"), bearer_token_file=str(tmp_path / "absent"))
    policy = Policy(prometheus_default=missing)
    spec = AnalysisSpec(prometheus=PrometheusRef(), latency=[], min_requests=0)
    (error,) = PrometheusSource(SELECTOR, policy=policy).measure(spec, 60)
    assert (error.phase, error.message) == (
        "Error",
        "Prometheus 'metrics': its bearerTokenFile cannot be read (see the operator's log)",
    )
    assert server.received == []


def test_nothing_answers_is_one_error_without_the_url() -> None:
    dead = access("http://127.0.0.1:9")
    spec = AnalysisSpec(prometheus=PrometheusRef(), latency=[], min_requests=0)
    (error,) = PrometheusSource(SELECTOR, policy=Policy(prometheus_default=dead)).measure(spec, 60)
    assert (error.metric, error.phase, error.message) == (
        "prometheus",
        "Error",
        "Prometheus 'metrics' unreachable: connection failed",
    )
