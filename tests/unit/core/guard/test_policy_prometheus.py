"""core.guard.policy on spec.analysis.prometheus (issue #23): the operator queries only a Prometheus the cluster admin
configured, picked by name or by its exact address; any other URL is refused before anything is created."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal.core.decide import decide
from kvcal.core.guard.policy import (
    DEFAULT_PROMETHEUS_ADDRESS,
    PROMETHEUS_ADDITIONAL_VALUE,
    PROMETHEUS_DEFAULT_VALUE,
    Policy,
    PrometheusAccess,
    check,
    resolve_prometheus,
)
from kvcal.models.spec import KVCalibrationSpec, PrometheusRef
from kvcal.models.status import KVCalibrationStatus, Phase
from tests.support.decide import NOW, observations, spec_with

CHART_VALUES = yaml.safe_load((Path(__file__).resolve().parents[4] / "charts/kvcal/values.yaml").read_text())
THANOS = PrometheusAccess(
    name="thanos", address="https://thanos-query.monitoring.svc:9090", ca_file="/etc/kvcal/prometheus/thanos/ca/ca.crt"
)
ADMIN = Policy(prometheus_additional=(THANOS,))  # the chart's default Prometheus and one more


def with_prometheus(**ref: Any) -> KVCalibrationSpec:
    return spec_with(**{"analysis.prometheus": ref})


# The class of URLs an author could point the operator at, none of them configured: cloud metadata (IPv4, IPv6, its
# DNS name), the API server (ClusterIP, DNS name), other in-cluster Services (the operator's own metrics), the
# configured Prometheus spelt differently or on another port or path, and a configured one as the userinfo of
# another host.
FOREIGN = [
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "https://10.96.0.1:443",
    "https://kubernetes.default.svc",
    "http://kvcal-metrics.kvcal-system.svc:9090",
    "http://prometheus.monitoring.svc.cluster.local:9090",
    "http://prometheus.monitoring:9091",
    "https://prometheus.monitoring:9090",
    "http://prometheus.monitoring:9090/api/v1/query?query=up",
    "http://prometheus.monitoring:9090/../admin",
    "http://prometheus.monitoring:9090@169.254.169.254/latest/meta-data/",
    "https://thanos-query.monitoring.svc:9090/federate",
]


@pytest.mark.parametrize("address", FOREIGN)
def test_any_address_that_is_not_configured_is_refused_naming_the_chart_value(address: str) -> None:
    (violation,) = check(with_prometheus(address=address), ADMIN)
    assert violation.field == "spec.analysis.prometheus.address"
    assert violation.chart_value == PROMETHEUS_ADDITIONAL_VALUE
    message = str(violation)
    assert message.startswith("spec.analysis.prometheus.address: ")
    assert "is not a Prometheus the operator may query" in message
    assert f"chart value {PROMETHEUS_ADDITIONAL_VALUE} (or {PROMETHEUS_DEFAULT_VALUE})" in message
    assert f"default ({DEFAULT_PROMETHEUS_ADDRESS}), thanos ({THANOS.address})" in message
    assert resolve_prometheus(with_prometheus(address=address).analysis.prometheus, ADMIN) is None


def test_userinfo_in_a_refused_address_is_not_repeated() -> None:
    (violation,) = check(with_prometheus(address="http://admin:hunter2@10.0.0.7:9090"), ADMIN)
    assert "hunter2" not in str(violation) and "http://***@10.0.0.7:9090" in str(violation)


@pytest.mark.parametrize(
    ("ref", "picked"),
    [
        ({}, "default"),
        ({"address": DEFAULT_PROMETHEUS_ADDRESS}, "default"),  # kvcal 0.1's CRD default, stored in old objects
        ({"address": DEFAULT_PROMETHEUS_ADDRESS + "/"}, "default"),
        ({"name": "default"}, "default"),
        ({"name": "thanos"}, "thanos"),
        ({"address": "https://thanos-query.monitoring.svc:9090"}, "thanos"),
        ({"name": "thanos", "address": "https://thanos-query.monitoring.svc:9090/"}, "thanos"),
    ],
)
def test_configured_servers_are_picked_by_name_or_exact_address(ref: dict[str, str], picked: str) -> None:
    spec = with_prometheus(**ref)
    assert check(spec, ADMIN) == []
    chosen = resolve_prometheus(spec.analysis.prometheus, ADMIN)
    assert chosen is not None and chosen.name == picked
    assert chosen in ADMIN.prometheus_servers  # the configured entry, its CA and credentials: not the spec's string


def test_an_unknown_name_and_a_mismatched_pair_are_refused() -> None:
    (unknown,) = check(with_prometheus(name="imds"), ADMIN)
    assert unknown.field == "spec.analysis.prometheus.name" and unknown.chart_value == PROMETHEUS_ADDITIONAL_VALUE
    assert str(unknown).startswith("spec.analysis.prometheus.name: 'imds' is not a Prometheus the operator may query")
    (pair,) = check(with_prometheus(name="thanos", address=DEFAULT_PROMETHEUS_ADDRESS), ADMIN)
    assert (pair.field, pair.chart_value) == ("spec.analysis.prometheus", None)  # the spec contradicts itself
    assert "two different Prometheus servers" in str(pair)
    (bad_address,) = check(with_prometheus(name="thanos", address="http://169.254.169.254/"), ADMIN)
    assert bad_address.field == "spec.analysis.prometheus.address"


def test_the_chart_default_can_move_and_then_the_old_address_is_refused() -> None:
    """docs/operations.md (Upgrade): objects that stored kvcal 0.1's default keep working only while the chart's
    default Prometheus is that address, or while it is listed in policy.prometheus.additional."""
    moved = Policy(prometheus_default=PrometheusAccess(name="default", address="http://kube-prom.monitoring:9090"))
    legacy = with_prometheus(address=DEFAULT_PROMETHEUS_ADDRESS)
    assert [v.chart_value for v in check(legacy, moved)] == [PROMETHEUS_ADDITIONAL_VALUE]
    assert check(with_prometheus(), moved) == []
    kept = moved.model_copy(
        update={"prometheus_additional": (PrometheusAccess(name="legacy", address=DEFAULT_PROMETHEUS_ADDRESS),)}
    )
    assert check(legacy, Policy.model_validate(kept.model_dump())) == []


def test_decide_creates_nothing_and_an_active_run_rolls_back() -> None:
    spec = with_prometheus(address="http://169.254.169.254/latest/meta-data/")
    pending = decide(spec, KVCalibrationStatus(), observations(policy=ADMIN), NOW)
    assert pending.actions == ()
    assert pending.status.phase == Phase.INVALID_SPEC and pending.status.history[-1].reason == "PolicyDenied"
    assert PROMETHEUS_ADDITIONAL_VALUE in (pending.status.message or "")
    analyzing = decide(spec, KVCalibrationStatus(phase=Phase.ANALYZING), observations(policy=ADMIN), NOW)
    assert analyzing.status.phase == Phase.ROLLING_BACK and analyzing.status.history[-1].reason == "PolicyDenied"


def test_the_chart_default_is_the_operators_and_names_the_values_in_messages() -> None:
    prometheus = CHART_VALUES["policy"]["prometheus"]
    assert prometheus["default"]["name"] == Policy().prometheus_default.name == "default"
    assert prometheus["default"]["address"] == Policy().prometheus_default.address == DEFAULT_PROMETHEUS_ADDRESS
    assert prometheus["additional"] == []
    for dotted in (PROMETHEUS_DEFAULT_VALUE, PROMETHEUS_ADDITIONAL_VALUE):
        node: Any = CHART_VALUES
        for key in dotted.split("."):
            node = node[key]


@pytest.mark.parametrize(
    ("server", "error"),
    [
        ({"address": "http://p:9090", "bearer_token_file": "/t"}, "need an https:// address"),
        ({"address": "http://p:9090", "ca_file": "/ca.crt"}, "need an https:// address"),
        ({"address": "https://user:pw@p:9090"}, "credentials belong in a Secret"),
        ({"address": "https://p:9090", "cert_file": "/tls.crt"}, "both its certificate and its key"),
        ({"address": "https://p:9090", "username_file": "/u"}, "both a username and a password"),
        (
            {"address": "https://p:9090", "bearer_token_file": "/t", "username_file": "/u", "password_file": "/p"},
            "not both",
        ),
        ({"address": "p:9090"}, "pattern"),
    ],
)
def test_a_configured_server_is_consistent(server: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        PrometheusAccess(name="p", **server)


def test_names_and_addresses_are_unique() -> None:
    with pytest.raises(ValueError, match="same name"):
        Policy(prometheus_additional=(PrometheusAccess(name="default", address="http://other:9090"),))
    with pytest.raises(ValueError, match="same address"):
        Policy(prometheus_additional=(PrometheusAccess(name="again", address=DEFAULT_PROMETHEUS_ADDRESS + "/"),))


def test_a_spec_ref_is_only_a_name_or_an_address() -> None:
    with pytest.raises(ValueError):
        PrometheusRef.model_validate({"name": "Thanos"})
    with pytest.raises(ValueError):
        PrometheusRef.model_validate({"url": "http://169.254.169.254/"})
