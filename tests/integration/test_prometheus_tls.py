"""The operator's Prometheus client against the real Prometheus serving its API only over TLS, with a client
certificate and basic auth required (its own --web.config.file; a throw-away CA from kvcal.devenv.pki).

The configured CA, client certificate and credentials get answers. Everything else fails closed, as one Error
measurement that never lets an analysis pass: another CA, the system's CAs (certificates are verified by default),
a wrong password, no credentials, no client certificate.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal.adapters.prometheus import PrometheusSource, connect, run_query
from kvcal.core.analysis.verdict import assess_run
from kvcal.core.guard.policy import Policy, PrometheusAccess
from kvcal.devenv.pki import CertificateAuthority
from kvcal.models.spec import AnalysisSpec, PrometheusRef
from kvcal.models.status import AnalysisStatus
from tests.support.prereq import require
from tests.support.prometheus import PrometheusServer, find_prometheus, free_port, role_selector

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

USER = "kvcal"
PASSWORD = "kvcal-test-only"
# bcrypt of PASSWORD (Prometheus's basic_auth_users holds hashes), made once with libcrypt: crypt_gensalt("$2b$", 4).
PASSWORD_HASH = "$2b$04$moiVxn1f3gr42ADv4cFhWOBmie35v29Z55eQGKaKAPLxtWcoYRI1i"


@dataclass(frozen=True)
class Secured:
    server: PrometheusServer
    access: PrometheusAccess  # everything right: the CA, the client certificate, the credentials
    other_ca: Path
    wrong_password: Path


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    binary = find_prometheus()
    require(binary, "prometheus binary not found: run `make prometheus` (installs Debian's package)")
    assert binary is not None
    work = tmp_path_factory.mktemp("prometheus-tls")
    (work / "pki").mkdir()
    (work / "other").mkdir()
    ca = CertificateAuthority(work / "pki", "prometheus-test-ca")
    serving = ca.issue("server", "prometheus", server_ips=("127.0.0.1",))
    client = ca.issue("client", "kvcal-operator")
    other_ca = CertificateAuthority(work / "other", "another-ca").cert
    web: dict[str, Any] = {
        "tls_server_config": {
            "cert_file": str(serving.cert),
            "key_file": str(serving.key),
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca_file": str(ca.cert),
        },
        "basic_auth_users": {USER: PASSWORD_HASH},
    }
    (work / "web.yml").write_text(yaml.safe_dump(web))
    for name, text in (("username", USER), ("password", PASSWORD), ("wrong-password", "guessed")):
        (work / name).write_text(text)
    server = PrometheusServer(binary=binary, workdir=work, port=free_port(), web_config=work / "web.yml")
    server.start()
    access = PrometheusAccess(
        name="secured",
        address=server.url,
        ca_file=str(ca.cert),
        cert_file=str(client.cert),
        key_file=str(client.key),
        username_file=str(work / "username"),
        password_file=str(work / "password"),
    )
    try:
        yield Secured(server, access, other_ca, work / "wrong-password")
    finally:
        server.stop()


def spec() -> AnalysisSpec:
    return AnalysisSpec(prometheus=PrometheusRef(name="secured"), latency=[], min_requests=0, consecutive_error_limit=2)


def intervals(access: PrometheusAccess, count: int = 3) -> list[tuple[str | None, str]]:
    """(interval phase, outcome) of `count` analysis intervals measured through `access`."""
    metrics = PrometheusSource(role_selector("tls"), policy=Policy(prometheus_default=access))
    status, out = AnalysisStatus(), []
    for _ in range(count):
        verdict = assess_run(spec(), status, metrics.measure(spec(), 60), datetime.now(UTC))
        status = verdict.status
        out.append((verdict.interval, verdict.outcome))
    return out


def test_the_configured_ca_client_certificate_and_credentials_get_answers(secured: Secured) -> None:
    client = connect(secured.access)
    try:
        (sample,) = run_query(client, "vector(1)")
    finally:
        client.close()
    assert sample["value"][1] == "1"
    # A whole interval: no data for these pods yet, so Inconclusive, but no Error: Prometheus answered every query.
    metrics = PrometheusSource(role_selector("tls"), policy=Policy(prometheus_default=secured.access))
    measured = metrics.measure(spec(), 60)
    assert measured and all(m.phase != "Error" for m in measured), measured


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ca_file": "other"}, "Prometheus 'secured' unreachable: its TLS certificate is not trusted"),
        ({"ca_file": None}, "Prometheus 'secured' unreachable: its TLS certificate is not trusted"),
        ({"password_file": "wrong"}, "Prometheus 'secured' refused the operator's credentials (HTTP 401)"),
        ({"username_file": None, "password_file": None}, "Prometheus 'secured' refused the operator's credentials"),
        ({"cert_file": None, "key_file": None}, "Prometheus 'secured' unreachable: the TLS handshake failed"),
    ],
    ids=["another-ca", "system-cas", "wrong-password", "no-credentials", "no-client-certificate"],
)
def test_anything_else_fails_closed(secured: Secured, change: dict[str, str | None], message: str) -> None:
    paths = {"other": str(secured.other_ca), "wrong": str(secured.wrong_password)}
    access = secured.access.model_copy(update={k: paths.get(v, v) if v else None for k, v in change.items()})
    metrics = PrometheusSource(role_selector("tls"), policy=Policy(prometheus_default=access))
    (error,) = metrics.measure(spec(), 60)
    assert (error.metric, error.phase) == ("prometheus", "Error")
    assert error.message is not None and error.message.startswith(message), error.message
    assert PASSWORD not in error.message and "guessed" not in error.message
    assert metrics.kv_cache(spec()).error is not None
    # consecutiveErrorLimit 2 errors tolerated: the third interval of errors ends the analysis as Failed, never Passed.
    assert intervals(access) == [("Error", "Running"), ("Error", "Running"), ("Error", "Failed")]
