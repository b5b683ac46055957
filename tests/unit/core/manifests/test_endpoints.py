"""core.manifests.endpoints: probes reach one ready pod per role by pod IP, never the canary through the baseline
Service."""

from typing import Any

import pytest

from kvcal.core.manifests.endpoints import NoEndpoint, probe_urls

SELECTOR = {"app": "llm"}


def pod(name: str, ip: str, *, canary: bool = False, ready: bool = True, owner: str = "smollm2") -> dict[str, Any]:
    labels = {**SELECTOR, **({"role": "canary", "kvcal.dev/calibration": owner} if canary else {})}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": 8000}]}]},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


BASELINE = {"spec": {"selector": {"matchLabels": SELECTOR}}}


def service(target_port: Any) -> dict[str, Any]:
    return {"spec": {"selector": SELECTOR, "ports": [{"port": 80, "targetPort": target_port}]}}


def test_each_role_gets_its_own_ready_pod_on_the_target_port() -> None:
    pods = [
        pod("smollm2-canary-a-1", "10.0.0.9", canary=True),
        pod("llm-b-2", "10.0.0.3"),
        pod("llm-b-1", "10.0.0.2", ready=False),
        pod("llm-b-3", "10.0.0.4"),
    ]
    assert probe_urls("smollm2", pods, BASELINE, service(8000)) == ("http://10.0.0.3:8000", "http://10.0.0.9:8000")


def test_named_target_port_resolves_against_the_container() -> None:
    pods = [pod("llm-b-1", "10.0.0.2"), pod("c-1", "fd00::5", canary=True)]
    assert probe_urls("smollm2", pods, BASELINE, service("http")) == ("http://10.0.0.2:8000", "http://[fd00::5]:8000")


def test_another_calibrations_canary_is_not_this_ones() -> None:
    pods = [pod("llm-b-1", "10.0.0.2"), pod("other-canary-1", "10.0.0.7", canary=True, owner="other")]
    with pytest.raises(NoEndpoint, match="no ready canary pod of smollm2"):
        probe_urls("smollm2", pods, BASELINE, service(8000))


@pytest.mark.parametrize(
    ("pods", "baseline", "message"),
    [
        ([pod("c-1", "10.0.0.9", canary=True)], BASELINE, "no ready baseline pod"),
        ([pod("llm-b-1", "10.0.0.2", ready=False), pod("c-1", "10.0.0.9", canary=True)], BASELINE, "baseline"),
        ([pod("llm-b-1", "10.0.0.2")], None, "baseline workload is gone"),
    ],
)
def test_missing_endpoints_are_errors(pods: list[dict[str, Any]], baseline: Any, message: str) -> None:
    with pytest.raises(NoEndpoint, match=message):
        probe_urls("smollm2", pods, baseline, service(8000))


def test_unknown_port_name_names_the_target_port() -> None:
    with pytest.raises(NoEndpoint, match="'metrics'"):
        probe_urls(
            "smollm2", [pod("llm-b-1", "10.0.0.2"), pod("c", "1.2.3.4", canary=True)], BASELINE, service("metrics")
        )
