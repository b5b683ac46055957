"""Issue 25 item 3 on the real API server, with the real Gateway API CRDs and the chart's RBAC: the shadow stage
asks the route's GatewayClass whether it mirrors before it writes anything, mirrors with a RequestMirror filter (no
user-facing weight), hands over to the weighted steps after shadow.intervals, and a delete mid-shadow removes the
mirror before the canary Service goes.

The GatewayClasses here are the tests' own: their status.supportedFeatures is written by the test, as a gateway
controller writes it. A gateway that really mirrors cannot run here (Traefik, the Go gateway the tests build, has no
RequestMirror: tests/e2e/test_gateway_traffic.py shows the refusal against it with real requests).
"""

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kvcal.adapters.router import canary_share, mirror_share
from kvcal.core.manifests.traffic import MIRROR_FEATURE, PERCENTAGE_MIRROR_FEATURE
from tests.support.cluster import Cluster, wait_for
from tests.support.gateway_crds import GATEWAY_API, httproute_rules, install_gateway_api_crds
from tests.support.world import (
    World,
    baseline,
    dataset_configmap,
    kvcalibration,
)

pytestmark = pytest.mark.cluster
DRAIN_SECONDS = 2
SHADOW = {"percent": 25, "intervals": 2}


@pytest.fixture
def world(gateway_world: World, control_plane: Cluster) -> World:
    install_gateway_api_crds(control_plane)
    return gateway_world


def api(w: World) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(w.cluster.api_client())


def route_rules(w: World) -> list[dict[str, Any]]:
    return httproute_rules(w.cluster, w.namespace)


def gateway(w: World, class_name: str, features: list[str]) -> list[dict[str, Any]]:
    """A GatewayClass whose controller (not running here) says it supports `features`, a Gateway of that class, and
    the HTTPRoute the KVCalibration names, attached to it; returns the route's rules as stored."""
    gateway_class = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GatewayClass",
        "metadata": {"name": class_name},
        "spec": {"controllerName": "example.com/mirroring-gateway"},
    }
    api(w).create_cluster_custom_object(*GATEWAY_API, "gatewayclasses", gateway_class)
    status = {"status": {"conditions": [], "supportedFeatures": [{"name": f} for f in sorted(features)]}}
    api(w).patch_cluster_custom_object_status(*GATEWAY_API, "gatewayclasses", class_name, status)
    gw = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "gw"},
        "spec": {"gatewayClassName": class_name, "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]},
    }
    api(w).create_namespaced_custom_object(*GATEWAY_API, w.namespace, "gateways", gw)
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "llm"},
        "spec": {"parentRefs": [{"name": "gw"}], "rules": [{"backendRefs": [{"name": "llm", "port": 80}]}]},
    }
    api(w).create_namespaced_custom_object(*GATEWAY_API, w.namespace, "httproutes", route)
    return route_rules(w)  # as the API server stored it (the real schema fills in defaults)


def deploying(w: World, name: str, tmp_path: Path, steps: list[int]) -> None:
    """Baseline (4 pods) and a KVCalibration with a shadow stage, its calibration skipped (status written: the
    calibrator and verifier are proven in test_lifecycle) so the operator deploys the canary next."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    for manifest in [*baseline(model, replicas=4), dataset_configmap()]:
        w.apply(manifest)
    w.kubelet.hold("calibration")
    traffic = {
        "router": "gateway-api",
        "httpRoute": "llm",
        "steps": steps,
        "drainDelay": f"{DRAIN_SECONDS}s",
        "shadow": SHADOW,
    }
    w.apply(
        kvcalibration(
            name, model, w.out, serving={"baseline": {"deployment": "llm", "service": "llm"}, "traffic": traffic}
        )
    )
    obj = w.wait_phase(name, "Calibrating", 30)
    status = {
        "phase": "Deploying",
        "verification": {"job": f"{obj['status']['calibration']['job']}-v", "layers": 1, "mismatches": 0},
    }
    w.cluster.kubectl(
        "patch",
        "-n",
        w.namespace,
        f"kvcalibration/{name}",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def test_a_gateway_that_does_not_mirror_blocks_before_any_canary(world: World, tmp_path: Path) -> None:
    w, name = world, "shadow-refused"
    original = gateway(w, "plain", ["HTTPRouteQueryParamMatching"])  # as Traefik v3.6 lists its features: no mirror
    deploying(w, name, tmp_path, [30])

    def refused() -> dict[str, Any] | None:
        obj = w.kvcal(name)
        return obj if "does not list HTTPRouteRequestMirror" in obj["status"].get("message", "") else None

    obj = wait_for(refused, 30, "the refusal in status")
    assert obj["status"]["phase"] == "Deploying"
    wait_for(lambda: "MirrorUnsupported" in w.events(name), 10, "a MirrorUnsupported event")
    assert w.children("Deployment", name) == [] and w.children("Service", name) == []
    assert route_rules(w) == original  # nothing written to the route


def test_shadow_mirrors_then_weights_move(world: World, tmp_path: Path) -> None:
    w, name = world, "shadow-steps"
    gateway(w, "mirroring", [MIRROR_FEATURE, PERCENTAGE_MIRROR_FEATURE])
    deploying(w, name, tmp_path, [30])
    obj = w.wait_phase(name, "Analyzing", 60)
    canary = f"{name}-canary"
    assert obj["status"]["canary"]["mirror"] == 25 and obj["status"]["canary"]["weight"] == 0
    rules = route_rules(w)
    assert canary_share(rules, "llm", canary) == 0 and mirror_share(rules, canary) == 25
    (mirror,) = rules[0]["filters"]
    assert mirror["type"] == "RequestMirror" and mirror["requestMirror"]["percent"] == 25
    assert (
        mirror["requestMirror"]["backendRef"]["name"] == canary and mirror["requestMirror"]["backendRef"]["port"] == 80
    )
    entered = next(h for h in obj["status"]["history"] if h["phase"] == "Analyzing")
    assert "shadow" in entered["message"] and "users see only the baseline's answers" in entered["message"]
    # The analysis passes on the mirrored load: the weighted step replaces the mirror in one route write.
    w.backends.metrics_fake.held.clear()

    def weighted() -> dict[str, Any] | None:
        obj = w.kvcal(name)
        shadowed = obj["status"]["canary"].get("shadowed") and obj["status"]["canary"]["weight"] == 30
        return obj if shadowed and obj["status"]["phase"] in ("Analyzing", "AwaitingPromotion") else None

    obj = wait_for(weighted, 60, "the first weighted step after the shadow stage")
    w.backends.metrics_fake.held.set()
    rules = route_rules(w)
    assert canary_share(rules, "llm", canary) == 30 and mirror_share(rules, canary) == 0 and "filters" not in rules[0]
    reasons = [h["reason"] for h in obj["status"]["history"]]
    assert reasons.index("ShadowPassed") > reasons.index("CanaryReady")


def test_delete_mid_shadow_removes_the_mirror_before_the_canary_service(world: World, tmp_path: Path) -> None:
    w, name = world, "shadow-delete"
    original = gateway(w, "mirroring-delete", [MIRROR_FEATURE, PERCENTAGE_MIRROR_FEATURE])
    deploying(w, name, tmp_path, [30])
    w.wait_phase(name, "Analyzing", 60)
    canary = f"{name}-canary"
    seen: dict[str, float] = {}
    stop = threading.Event()

    def record() -> None:
        while not stop.is_set():
            now = time.monotonic()
            if "unmirrored" not in seen and mirror_share(route_rules(w), canary) == 0:
                seen["unmirrored"] = now
            if "service_gone" not in seen and w.kube.get("Service", w.namespace, canary) is None:
                seen["service_gone"] = now
            stop.wait(0.05)  # the recorder's poll period

    recorder = threading.Thread(target=record, daemon=True)
    recorder.start()
    try:
        w.cluster.kubectl("delete", "-n", w.namespace, f"kvcalibration/{name}", "--wait=true", "--timeout=60s")
        wait_for(lambda: "service_gone" in seen, 10, "the canary Service gone")
    finally:
        stop.set()
        recorder.join(10)
    assert seen["service_gone"] - seen["unmirrored"] >= DRAIN_SECONDS - 0.5, seen
    assert route_rules(w) == original  # the route as it was
