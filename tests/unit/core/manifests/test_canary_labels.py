"""The canary's pod labels per router: only `replicas` puts the canary behind the baseline Service (issue 25's label
bug: under gateway-api the Service also sent the canary a share of the baseline's traffic, under none users reached
the canary at all)."""

from typing import Any

import pytest

from kvcal.core.decide import decide
from kvcal.core.manifests import build_canary_service, build_canary_workload, canary_name
from kvcal.core.manifests.canary import keep_existing_selector
from kvcal.core.manifests.endpoints import probe_urls
from kvcal.core.manifests.traffic import canary_behind_baseline_service
from kvcal.core.observations import Apply, DeploymentState
from kvcal.models.spec import KVCalibrationSpec, Router
from kvcal.models.status import CanaryStatus, KVCalibrationStatus, Phase
from tests.support.decide import (
    NOW,
    OWNER,
    baseline,
    baseline_manifest,
    baseline_service,
    observations,
    spec,
    started,
    statefulset_manifest,
)

ROUTERS: list[Router] = ["replicas", "gateway-api", "none"]


def router_spec(router: Router, kind: str = "Deployment") -> KVCalibrationSpec:
    traffic: dict[str, Any] = {"router": router, "steps": [10, 50]}
    if router == "gateway-api":
        traffic["httpRoute"] = "llm"
    return spec(serving={"baseline": {"deployment": "llm", "service": "llm", "kind": kind}, "traffic": traffic})


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_only_the_replicas_router_puts_the_canary_behind_the_baseline_service() -> None:
    assert [canary_behind_baseline_service(r) for r in ROUTERS] == [True, False, False]


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet"])
@pytest.mark.parametrize("router", ROUTERS)
def test_the_baseline_service_selects_canary_pods_only_under_replicas(router: Router, kind: str) -> None:
    baseline = baseline_manifest() if kind == "Deployment" else statefulset_manifest()
    service = baseline_service()
    canary = build_canary_workload(OWNER, router_spec(router, kind), baseline, 1, service)
    pod_labels = canary["spec"]["template"]["metadata"]["labels"]
    assert selects(service["spec"]["selector"], pod_labels) == (router == "replicas")
    # The workload selects its own pods, the canary Service selects them, and the baseline's selector never does
    # (but under replicas, where the canary must share the baseline's labels).
    assert selects(canary["spec"]["selector"]["matchLabels"], pod_labels)
    assert selects(build_canary_service(OWNER, service)["spec"]["selector"], pod_labels)
    assert selects(baseline["spec"]["selector"]["matchLabels"], pod_labels) == (router == "replicas")
    assert pod_labels["role"] == "canary" and pod_labels["kvcal.dev/calibration"] == "smollm2"


def test_labels_the_service_does_not_select_stay_on_the_canary() -> None:
    baseline = baseline_manifest()
    baseline["spec"]["selector"]["matchExpressions"] = [{"key": "app", "operator": "In", "values": ["llm"]}]
    canary = build_canary_workload(OWNER, router_spec("gateway-api"), baseline, 1, baseline_service())
    assert canary["spec"]["template"]["metadata"]["labels"] == {
        "tier": "serving",
        "role": "canary",
        "kvcal.dev/calibration": "smollm2",
    }
    assert canary["spec"]["selector"] == {"matchLabels": {"role": "canary", "kvcal.dev/calibration": "smollm2"}}


def test_a_weight_router_needs_the_baseline_service_to_build_the_canary() -> None:
    with pytest.raises(ValueError, match="baseline Service is needed"):
        build_canary_workload(OWNER, router_spec("none"), baseline_manifest(), 1, None)
    d = decide(router_spec("none"), started(Phase.DEPLOYING), observations(baseline_service=None, canary=None), NOW)
    assert not d.actions and d.status.phase == Phase.DEPLOYING
    assert "baseline Service llm was not found" in (d.status.message or "")


def test_a_canary_of_an_older_kvcal_keeps_its_immutable_selector() -> None:
    """Created when canary pods kept every baseline label: re-applied (a step scales it) with its own selector and
    pod labels, so the apply is not refused; the next run's canary gets the new labels."""
    old = build_canary_workload(OWNER, router_spec("replicas"), baseline_manifest(), 1, baseline_service())
    new = build_canary_workload(OWNER, router_spec("gateway-api"), baseline_manifest(), 2, baseline_service())
    kept = keep_existing_selector(new, old)
    assert kept["spec"]["selector"] == old["spec"]["selector"]
    assert kept["spec"]["template"]["metadata"]["labels"] == old["spec"]["template"]["metadata"]["labels"]
    assert kept["spec"]["replicas"] == 2 and keep_existing_selector(new, new) == new

    status: KVCalibrationStatus = started(Phase.DEPLOYING).model_copy(
        update={"canary": CanaryStatus(deployment=canary_name(OWNER.name), step_index=1)}
    )
    running = DeploymentState(manifest=old, replicas=1, ready_replicas=1)
    d = decide(
        router_spec("gateway-api"), status, observations(baseline=baseline(4), canary=running), NOW
    )  # 50% of 4: 2 pods
    applied = [a.manifest for a in d.actions if isinstance(a, Apply) and a.manifest["kind"] == "Deployment"]
    assert len(applied) == 1 and applied[0]["spec"]["selector"] == old["spec"]["selector"]


@pytest.mark.parametrize("router", ROUTERS)
def test_probes_find_the_canary_pod_whatever_its_labels(router: Router) -> None:
    def pod(name: str, ip: str, labels: dict[str, str]) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "vllm"}]},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
        }

    canary = build_canary_workload(OWNER, router_spec(router), baseline_manifest(), 1, baseline_service())
    pods = [
        pod("llm-a-1", "10.0.0.2", baseline_manifest()["spec"]["template"]["metadata"]["labels"]),
        pod("smollm2-canary-a-1", "10.0.0.9", canary["spec"]["template"]["metadata"]["labels"]),
    ]
    urls = probe_urls(OWNER.name, pods, baseline_manifest(), baseline_service())
    assert urls == ("http://10.0.0.2:8000", "http://10.0.0.9:8000")
