"""The chart's policy.prometheus.* values reach the operator as the Prometheus servers it may query, and the Secrets
they name as read-only files in its pod (chart -> --prometheus flags + Secret volumes -> Policy); the operator's
ServiceAccount never gets access to Secrets (tests/unit/test_chart.py checks its RBAC)."""

from pathlib import PurePosixPath
from typing import Any

import pytest

from kvcal.core.guard.policy import DEFAULT_PROMETHEUS_ADDRESS, Policy, PrometheusAccess
from tests.support.helm_template import CHART, KUBE_VERSION, helm, one, operator_policy, render, set_args

SECURED = {
    "policy.prometheus.default.address": "https://prometheus.monitoring.svc:9090",
    "policy.prometheus.default.tls.caSecret": "prometheus-ca",
    "policy.prometheus.default.auth.basicAuthSecret": "kvcal-prometheus-basic",
    "policy.prometheus.additional[0].name": "thanos",
    "policy.prometheus.additional[0].address": "https://thanos-query.monitoring.svc:10902/",
    "policy.prometheus.additional[0].tls.caSecret": "thanos-ca",
    "policy.prometheus.additional[0].tls.clientCertSecret": "kvcal-thanos-client",
    "policy.prometheus.additional[0].auth.bearerTokenSecret": "kvcal-thanos-token",
    "policy.prometheus.additional[1].name": "plain",
    "policy.prometheus.additional[1].address": "http://victoria.monitoring:8428",
}


def test_the_default_chart_queries_kvcal_0_1s_default_address(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render()
    assert operator_policy(docs, monkeypatch).prometheus_servers == (
        PrometheusAccess(name="default", address=DEFAULT_PROMETHEUS_ADDRESS),
    )
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]


def test_a_release_without_prometheus_values_keeps_the_old_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """`helm upgrade --reuse-values` from a chart without policy.prometheus: the address kvcal 0.1 queried."""
    for values in ({"policy": "null"}, {"policy.prometheus": "null"}):
        assert operator_policy(render(values), monkeypatch).prometheus_servers == Policy().prometheus_servers


def test_servers_and_their_secrets_reach_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(SECURED)
    policy = operator_policy(docs, monkeypatch)
    base = "/etc/kvcal/prometheus"
    assert policy.prometheus_default == PrometheusAccess(
        name="default",
        address="https://prometheus.monitoring.svc:9090",
        ca_file=f"{base}/default/ca/ca.crt",
        username_file=f"{base}/default/basic/username",
        password_file=f"{base}/default/basic/password",
    )
    assert policy.prometheus_additional == (
        PrometheusAccess(
            name="thanos",
            address="https://thanos-query.monitoring.svc:10902/",
            ca_file=f"{base}/thanos/ca/ca.crt",
            cert_file=f"{base}/thanos/client/tls.crt",
            key_file=f"{base}/thanos/client/tls.key",
            bearer_token_file=f"{base}/thanos/token/token",
        ),
        PrometheusAccess(name="plain", address="http://victoria.monitoring:8428"),
    )
    # Every file the operator reads is a key of the named Secret, mounted read-only where the path says.
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    read: dict[str, tuple[str, str]] = {}
    for server in policy.prometheus_servers:
        for path in (server.ca_file, server.cert_file, server.key_file, server.bearer_token_file,
                     server.username_file, server.password_file):  # fmt: skip
            if path is None:
                continue
            file = PurePosixPath(path)
            mount = mounts[str(file.parent)]
            assert mount["readOnly"] is True
            secret = volumes[mount["name"]]["secret"]
            assert {"key": file.name, "path": file.name} in secret["items"] and secret["defaultMode"] == 0o440
            read[path] = (secret["secretName"], file.name)
    assert sorted(set(read.values())) == sorted(
        [("prometheus-ca", "ca.crt"), ("kvcal-prometheus-basic", "username"), ("kvcal-prometheus-basic", "password"),
         ("thanos-ca", "ca.crt"), ("kvcal-thanos-client", "tls.crt"), ("kvcal-thanos-client", "tls.key"),
         ("kvcal-thanos-token", "token")]
    )  # fmt: skip
    assert len(volumes) == 1 + 5 and len(container["volumeMounts"]) == 1 + 5  # tmp + one per Secret per server


def assert_refused(values: dict[str, str], *expected: str) -> None:
    proc = helm("template", "rel", str(CHART), "--kube-version", KUBE_VERSION, *set_args(values), check=False)
    assert proc.returncode != 0, f"helm accepted {values}"
    for text in expected:
        assert text in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"policy.prometheus.default.auth.bearerTokenSecret": "t"}, ["/policy/prometheus/default/address", "https"]),
        ({"policy.prometheus.default.tls.caSecret": "ca"}, ["/policy/prometheus/default/address", "https"]),
        (
            {"policy.prometheus.default.address": "https://p:9090",
             "policy.prometheus.default.auth.basicAuthSecret": "b",
             "policy.prometheus.default.auth.bearerTokenSecret": "t"},
            ["/policy/prometheus/default/auth"],
        ),
        ({"policy.prometheus.default.address": "http://u:p@prometheus:9090"}, ["/policy/prometheus/default/address"]),
        ({"policy.prometheus.default.name": "Default"}, ["/policy/prometheus/default/name"]),
        ({"policy.prometheus.default.url": "http://p:9090"}, ["url"]),
        ({"policy.prometheus.additional[0].name": "x"}, ["address"]),
        (
            {"policy.prometheus.additional[0].name": "default", "policy.prometheus.additional[0].address": "http://q:1"},
            ["two servers are named default"],
        ),
        (
            {"policy.prometheus.additional[0].name": "again",
             "policy.prometheus.additional[0].address": DEFAULT_PROMETHEUS_ADDRESS + "/"},
            ["two servers have the address"],
        ),
    ],
    ids=["token-over-http", "ca-over-http", "token-and-basic", "userinfo", "name", "typo", "no-address", "same-name",
         "same-address"],
)  # fmt: skip
def test_inconsistent_prometheus_values_are_refused_at_install(values: dict[str, str], expected: list[str]) -> None:
    assert_refused(values, *expected)


def test_the_operator_refuses_what_the_chart_would_not_render(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rules on the command line (an operator run outside the chart): it exits instead of querying."""
    from kvcal.cli import build_parser
    from kvcal.handlers.cli import policy_from_args

    flag = '--prometheus={"name": "p", "address": "http://p:9090", "bearerTokenFile": "/t"}'
    args: Any = build_parser("operator").parse_args(["operator", "run", flag])
    with pytest.raises(ValueError, match="https://"):
        policy_from_args(args)
