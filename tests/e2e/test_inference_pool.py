"""Router inference-pool on the real API server with the real CRDs (InferencePool inference.networking.k8s.io/v1 from
the gateway-api-inference-extension module, HTTPRoute from the Gateway API's standard channel; `make inference-crds`).

The operator runs in-process under the chart's ServiceAccount with rbac.inferencePool=true (tests/e2e/test_lifecycle's
harness) and the real GatewayApiRouter; the fake kubelet makes the canary's, the baseline's and the endpoint
pickers' pods Ready. Everything is read back from the API server: the canary's pool is created only once its pods
are Ready, the picker Deployment copies the baseline's (image, ServiceAccount, --pool-name pointed at the canary
pool), the HTTPRoute's InferencePool backendRefs carry each step's weight, rollback and delete route 100% to the
baseline pool before the canary pool, its picker and the canary are deleted, promotion leaves the baseline pool
serving the promoted pods, and without rbac.inferencePool the operator refuses the router.

No data plane: an InferencePool is served by a gateway that asks the endpoint picker over ext-proc (an Envoy-based
gateway), which nothing here can run; docs/concepts.md says so.
"""

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kvcal.adapters.router import INFERENCE_POOL, canary_share
from kvcal.core.manifests.endpoints import pod_ready
from tests.support.cluster import Cluster, wait_for
from tests.support.recorder import PollingRecorder
from tests.support.world import (
    HOST_PATHS_ALLOWED,
    World,
    baseline,
    dataset_configmap,
    kvcalibration,
    operated_world,
)

pytestmark = pytest.mark.cluster
CRD_DIR = Path(os.environ.get("KVCAL_CACHE", Path.home() / ".cache/kvcal")) / "share/gateway-api-inference-extension"
CRDS = {
    "inferencepools.inference.networking.k8s.io": CRD_DIR / "inference.networking.k8s.io_inferencepools.yaml",
    "httproutes.gateway.networking.k8s.io": CRD_DIR / "gateway.networking.k8s.io_httproutes.yaml",
}
ROUTE_API = ("gateway.networking.k8s.io", "v1", "httproutes")
POOL_API = ("inference.networking.k8s.io", "v1", "inferencepools")
POOL_REF = {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "llm-pool"}
ROUTE_RULES = [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": [POOL_REF]}]
# ROUTE_RULES as the API server stores them: the real CRD defaults a backendRef's weight to 1.
ORIGINAL_RULES = [{**ROUTE_RULES[0], "backendRefs": [{**POOL_REF, "weight": 1}]}]
TRAFFIC = {"router": "inference-pool", "httpRoute": "llm", "inferencePool": "llm-pool", "steps": [30, 60],
           "drainDelay": "1s"}  # fmt: skip
PICKER_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp:v1.0.0"


def install_crds(cluster: Cluster) -> None:
    missing = [str(path) for path in CRDS.values() if not path.exists()]
    assert not missing, f"{missing} missing: run `make inference-crds` (hack/fetch-inference-crds.sh)"
    for name, path in CRDS.items():
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")


@pytest.fixture
def world(
    control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> Iterator[World]:
    install_crds(control_plane)
    values = {"rbac.inferencePool": "true", **HOST_PATHS_ALLOWED}
    yield from operated_world(control_plane, namespace, tmp_path, caplog, values=values, gateway_router=True)


@pytest.fixture
def refusing_world(
    control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> Iterator[World]:
    install_crds(control_plane)  # rbac.inferencePool: the chart default (false)
    yield from operated_world(
        control_plane, namespace, tmp_path, caplog, values=HOST_PATHS_ALLOWED, gateway_router=True
    )


def custom(w: World) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(w.cluster.api_client())


def route_rules(w: World) -> list[dict[str, Any]]:
    route: dict[str, Any] = custom(w).get_namespaced_custom_object(
        ROUTE_API[0], ROUTE_API[1], w.namespace, ROUTE_API[2], "llm"
    )  # type: ignore[assignment]
    rules: list[dict[str, Any]] = route["spec"]["rules"]
    return rules


def pool(w: World, name: str) -> dict[str, Any] | None:
    return w.kube.get("InferencePool", w.namespace, name)


def canary_weight(w: World, name: str) -> int:
    return canary_share(route_rules(w), "llm-pool", f"{name}-canary", INFERENCE_POOL)


def ready_pods(w: World, labels: dict[str, str]) -> list[dict[str, Any]]:
    return [p for p in w.kube.list("Pod", w.namespace, labels) if pod_ready(p)]


def baseline_and_pool(w: World, model: Path) -> None:
    """The baseline (2 pods), its InferencePool, the endpoint picker behind it, and the HTTPRoute to the pool."""
    model.mkdir(exist_ok=True)
    for m in [*baseline(model, replicas=2), dataset_configmap()]:
        w.apply(m)
    picker_labels = {"app": "llm-epp"}
    args = ["--pool-name", "llm-pool", "--pool-namespace", w.namespace, "--grpc-port", "9002"]
    w.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "llm-epp"}})
    w.apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llm-epp"},
             "spec": {"replicas": 1, "selector": {"matchLabels": picker_labels},
                      "template": {"metadata": {"labels": picker_labels},
                                   "spec": {"serviceAccountName": "llm-epp", "containers": [
                                       {"name": "epp", "image": PICKER_IMAGE, "args": args}]}}}})  # fmt: skip
    ports = [{"name": "grpc", "port": 9002, "targetPort": 9002}]
    w.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "llm-epp"},
             "spec": {"selector": picker_labels, "ports": ports}})  # fmt: skip
    w.apply({"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": {"name": "llm-pool"},
             "spec": {"selector": {"matchLabels": {"app": "llm"}}, "targetPorts": [{"number": 8000}],
                      "endpointPickerRef": {"name": "llm-epp", "port": {"number": 9002}}}})  # fmt: skip
    w.apply({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "llm"},
             "spec": {"rules": ROUTE_RULES}})  # fmt: skip
    assert route_rules(w) == ORIGINAL_RULES  # with the real CRD's defaults


def to_deploying(w: World, name: str, model: Path, **spec: Any) -> None:
    """A KVCalibration with the calibrator and verifier skipped by writing status (test_lifecycle runs them)."""
    w.kubelet.hold("calibration")
    serving = {"baseline": {"deployment": "llm", "service": "llm"}, "traffic": TRAFFIC}
    w.apply(kvcalibration(name, model, w.out, serving=serving, **spec))
    obj = w.wait_phase(name, "Calibrating", 30)
    status = {"phase": "Deploying", "verification": {"job": f"{obj['status']['calibration']['job']}-v", "layers": 1,
                                                     "mismatches": 0}}  # fmt: skip
    w.cluster.kubectl("patch", "-n", w.namespace, f"kvcalibration/{name}", "--subresource=status", "--type=merge",
                      "-p", yaml.safe_dump({"status": status}))  # fmt: skip


class Recorder(PollingRecorder):
    """Polls the HTTPRoute and the canary's pool: every canary weight seen (in order), and whether the canary pool
    had ready endpoints whenever the route gave it weight, and the weight when the pool was first seen gone."""

    def __init__(self, w: World, name: str) -> None:
        super().__init__()
        self.w, self.name = w, name
        self.weights: list[int] = []
        self.weight_without_endpoints: list[int] = []
        self.pool_seen = False
        self.weight_when_pool_gone: int | None = None

    def poll(self) -> None:
        canary_pool = pool(self.w, f"{self.name}-canary")
        weight = canary_weight(self.w, self.name)
        if not self.weights or self.weights[-1] != weight:
            self.weights.append(weight)
        if weight > 0:
            selector = (canary_pool or {}).get("spec", {}).get("selector", {}).get("matchLabels")
            if not selector or not ready_pods(self.w, selector):
                self.weight_without_endpoints.append(weight)
        if canary_pool is not None:
            self.pool_seen = True
        elif self.pool_seen and self.weight_when_pool_gone is None:
            self.weight_when_pool_gone = canary_weight(self.w, self.name)


def wait_weight(w: World, name: str, weight: int, timeout: float = 60) -> None:
    wait_for(lambda: canary_weight(w, name) == weight, timeout, f"the HTTPRoute at {weight}% on the canary pool")


def steps_to_awaiting_promotion(w: World, name: str, tmp_path: Path) -> Recorder:
    """Both steps, read back from the API server; returns the running Recorder (the caller exits it)."""
    model = tmp_path / "model"
    baseline_and_pool(w, model)
    baseline_pool = pool(w, "llm-pool")
    w.kubelet.hold("canary")
    recorder = Recorder(w, name).__enter__()
    to_deploying(w, name, model)
    # The canary's pods are not Ready: no canary pool, no picker, no weight.
    wait_for(lambda: "0/1 canary pods ready" in (w.kvcal(name).get("status", {}).get("message") or ""), 60,
          "Deploying waiting for the canary pods")  # fmt: skip
    assert pool(w, f"{name}-canary") is None and w.kube.get("Deployment", w.namespace, f"{name}-canary-epp") is None
    assert route_rules(w) == ORIGINAL_RULES

    w.kubelet.release("canary")
    obj = w.wait_phase(name, "Analyzing", 60)
    assert obj["status"]["canary"]["weight"] == 30 and canary_weight(w, name) == 30
    refs = route_rules(w)[0]["backendRefs"]
    assert refs == [{**POOL_REF, "weight": 70}, {**POOL_REF, "name": f"{name}-canary", "weight": 30}]

    canary_pool = pool(w, f"{name}-canary")
    assert canary_pool is not None
    assert canary_pool["spec"]["selector"]["matchLabels"] == {"role": "canary", "kvcal.dev/calibration": name}
    assert canary_pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert canary_pool["spec"]["endpointPickerRef"]["name"] == f"{name}-canary-epp"
    assert canary_pool["spec"]["endpointPickerRef"]["port"] == {"number": 9002}
    picker = w.kube.get("Deployment", w.namespace, f"{name}-canary-epp")
    assert picker is not None
    pod = picker["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "llm-epp" and pod["containers"][0]["image"] == PICKER_IMAGE
    assert pod["containers"][0]["args"][:2] == ["--pool-name", f"{name}-canary"]
    assert w.kube.get("Service", w.namespace, f"{name}-canary-epp") is not None
    current = pool(w, "llm-pool")
    assert current is not None and baseline_pool is not None and current["spec"] == baseline_pool["spec"]
    # The label bug, twice: the baseline pool's selector picks no canary pod, the canary pool's no baseline pod.
    canary_pods = {p["metadata"]["name"] for p in ready_pods(w, canary_pool["spec"]["selector"]["matchLabels"])}
    baseline_pods = {p["metadata"]["name"] for p in ready_pods(w, {"app": "llm"})}
    assert len(canary_pods) == 1 and len(baseline_pods) == 2 and not canary_pods & baseline_pods

    w.backends.metrics_fake.held.clear()  # the analysis passes: step 2, then AwaitingPromotion (manual)
    obj = w.wait_phase(name, "AwaitingPromotion", 90)
    assert obj["status"]["canary"]["weight"] == 60 and canary_weight(w, name) == 60
    assert len(ready_pods(w, canary_pool["spec"]["selector"]["matchLabels"])) == 2
    assert recorder.weights == [0, 30, 60], recorder.weights
    assert recorder.weight_without_endpoints == []
    return recorder


def test_steps_then_rollback_to_the_baseline_pool_before_the_canary_pool_goes(world: World, tmp_path: Path) -> None:
    w, name = world, "pool-abort"
    recorder = steps_to_awaiting_promotion(w, name, tmp_path)
    try:
        w.cluster.kubectl("annotate", "-n", w.namespace, f"kvcalibration/{name}", "kvcal.dev/abort=e2e")
        obj = w.wait_phase(name, "RolledBack", 60)
        wait_for(lambda: recorder.weight_when_pool_gone is not None, 10, "the recorder to see the canary pool gone")
    finally:
        recorder.__exit__()
    assert recorder.weight_when_pool_gone == 0 and recorder.weights[-1] == 0
    assert route_rules(w) == ORIGINAL_RULES  # 100% baseline, as it was
    assert obj["status"]["canary"]["weight"] == 0
    assert w.children("Deployment", name) == [] and w.children("Service", name) == []
    assert pool(w, f"{name}-canary") is None and pool(w, "llm-pool") is not None


def test_promotion_leaves_the_baseline_pool_serving_the_calibrated_pods(world: World, tmp_path: Path) -> None:
    w, name = world, "pool-promote"
    recorder = steps_to_awaiting_promotion(w, name, tmp_path)
    try:
        w.cluster.kubectl("annotate", "-n", w.namespace, f"kvcalibration/{name}", "kvcal.dev/promote=e2e")
        w.wait_phase(name, "Succeeded", 120)
    finally:
        recorder.__exit__()
    assert recorder.weight_when_pool_gone == 0
    assert route_rules(w) == ORIGINAL_RULES
    assert pool(w, f"{name}-canary") is None and w.children("Deployment", name) == []
    serving = ready_pods(w, {"app": "llm"})  # what the baseline pool selects now
    assert len(serving) == 2
    for p in serving:
        args = p["spec"]["containers"][0]["args"]
        assert "--kv-cache-dtype" in args and "role" not in p["metadata"]["labels"], p["metadata"]["name"]


def test_delete_mid_analysis_routes_to_the_baseline_pool_before_deleting(world: World, tmp_path: Path) -> None:
    w, name = world, "pool-delete"
    model = tmp_path / "model"
    baseline_and_pool(w, model)
    to_deploying(w, name, model)
    w.wait_phase(name, "Analyzing", 60)
    assert canary_weight(w, name) == 30
    with Recorder(w, name) as recorder:
        w.cluster.kubectl("delete", "-n", w.namespace, f"kvcalibration/{name}", "--wait=true", "--timeout=60s")
        wait_for(lambda: recorder.weight_when_pool_gone is not None, 10, "the recorder to see the canary pool gone")
    assert recorder.weight_when_pool_gone == 0 and recorder.weight_without_endpoints == []
    assert route_rules(w) == ORIGINAL_RULES
    assert w.kube.get("KVCalibration", w.namespace, name) is None
    assert w.children("Deployment", name) == [] and w.children("Service", name) == []
    assert pool(w, f"{name}-canary") is None and pool(w, "llm-pool") is not None
    assert w.kube.get("Deployment", w.namespace, "llm-epp") is not None  # the baseline's picker is never touched


def test_refused_unless_the_chart_allows_it(refusing_world: World, tmp_path: Path) -> None:
    w, name = refusing_world, "pool-refused"
    model = tmp_path / "model"
    model.mkdir()
    serving = {"baseline": {"deployment": "llm", "service": "llm"}, "traffic": TRAFFIC}
    w.apply(kvcalibration(name, model, w.out, serving=serving))
    obj = w.wait_phase(name, "InvalidSpec", 30)
    assert "rbac.inferencePool=true" in obj["status"]["message"]
    (calibrated,) = [c for c in obj["status"]["conditions"] if c["type"] == "Calibrated"]
    assert calibrated["reason"] == "PolicyDenied"
    assert w.children("Job", name) == [] and w.children("Deployment", name) == []
    started = time.monotonic()
    w.cluster.kubectl("delete", "-n", w.namespace, f"kvcalibration/{name}", "--wait=true", "--timeout=60s")
    assert time.monotonic() - started < 60
