"""Issue 25 item 2: real requests through a real gateway. Traefik (tests/support/gateway.py) routes an HTTPRoute to
the EndpointSlices of the baseline and canary Services, written by the real EndpointSlice controller from pods the
kubelet harness runs as local processes (tests/support/echo_server.py: each answer says whether the baseline or
the canary served it). The operator runs under the chart's RBAC with the real HTTPRoute router; the verdicts come
from the lifecycle tests' fake metrics (the point here is where requests go).

- gateway-api: at each step the canary answers its weight's share of 400 requests (within a 99.9% binomial
  interval); a rollback sends it nothing from the pass that starts it; a delete mid-Analyzing never answers 5xx.
- none: every request through the baseline's route reaches the baseline (issue 25's label bug: the canary's pods
  carried the baseline Service's labels, so the Service sent them requests).
"""

import math
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client, config

from kvcal.adapters.kube import KubeClient
from kvcal.adapters.router import GatewayApiRouter, NopRouter, canary_share
from kvcal.ports import Router, Target
from tests.support.chart import install_chart, operator_policy, release_name, uninstall_chart
from tests.support.cluster import Cluster, wait_for
from tests.support.gateway import NODE, POD_NETWORK, Traefik, require_traefik, traefik
from tests.support.kubelet import FakeKubelet
from tests.support.world import (
    HOST_PATHS_ALLOWED,
    GatewayBackends,
    OperatorThread,
    World,
    baseline,
    dataset_configmap,
    kvcalibration,
)

pytestmark = pytest.mark.cluster
ECHO = Path(__file__).resolve().parents[1] / "support" / "echo_server.py"
ROUTE_API = ("gateway.networking.k8s.io", "v1", "httproutes")
NAME = "smollm2"
CANARY = f"{NAME}-canary"
REQUESTS = 400
# The model server's pods (not the operator's) carry this label, which the baseline Service does not select.
SERVED = {"tier": "serving"}
Z_999 = 3.2905  # the two-sided 99.9% normal quantile


@dataclass
class SpecRouterBackends(GatewayBackends):
    """The router the spec names, as the operator builds it (handlers/backends.py), under the chart's account."""

    def router(self, target: Target) -> Router | None:
        if target.spec.serving.traffic.router == "gateway-api":
            return self.router_fake
        return NopRouter()


@dataclass
class GatewayWorld(World):
    gateway: Traefik | None = None

    @property
    def gw(self) -> Traefik:
        assert self.gateway is not None
        return self.gateway


@pytest.fixture
def gw_world(control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path) -> Iterator[GatewayWorld]:
    require_traefik()
    values = {"rbac.scope": "namespace", **HOST_PATHS_ALLOWED}
    release = install_chart(control_plane, namespace, release_name(), values, tmp_path)
    kube = KubeClient(control_plane.api_client())
    with traefik(control_plane, namespace, tmp_path) as gateway:
        kubelet = FakeKubelet(
            kube,
            namespace,
            tmp_path,
            serve={"baseline", "canary"},
            serve_labels=SERVED,
            node=NODE,
            pod_network=POD_NETWORK,
        ).start()
        sa_api = config.new_client_from_config(config_file=str(release.kubeconfig))  # type: ignore[no-untyped-call]
        backends = SpecRouterBackends(router_fake=GatewayApiRouter(sa_api))
        backends.metrics_fake.held.set()
        operator = OperatorThread(release.kubeconfig, namespace, backends, operator_policy(control_plane, release))  # type: ignore[arg-type]
        operator.start()
        try:
            yield GatewayWorld(control_plane, namespace, kube, kubelet, operator, backends, tmp_path / "out", gateway)  # type: ignore[arg-type]
            assert not kubelet.serve_failures, kubelet.serve_failures
        finally:
            operator.stop()
            kubelet.stop()
            uninstall_chart(control_plane, release)


# --- the workloads ------------------------------------------------------------------------------------------------


def echo_baseline(model_dir: Path, replicas: int) -> list[dict[str, Any]]:
    """test_lifecycle's baseline with the echo server as its container (vLLM's flags, so the canary's rewrite
    applies) and a second pod label the Service does not select."""
    deployment, service = baseline(model_dir, replicas)
    template = deployment["spec"]["template"]
    template["metadata"]["labels"] = {**template["metadata"]["labels"], **SERVED}
    container = template["spec"]["containers"][0]
    container.update(command=["python3", str(ECHO)], args=["--model", "/models/smollm2", "--port", "8000"])
    return [deployment, service]


def routes(w: GatewayWorld) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(w.cluster.api_client())


def route_weight(w: GatewayWorld) -> int:
    obj: dict[str, Any] = routes(w).get_namespaced_custom_object(*ROUTE_API[:2], w.namespace, ROUTE_API[2], "llm")  # type: ignore[assignment]
    return canary_share(obj["spec"]["rules"], "llm", CANARY)


def start(w: GatewayWorld, tmp_path: Path, replicas: int, traffic: dict[str, Any]) -> None:
    """The echo baseline behind an HTTPRoute on the gateway, serving; a KVCalibration past its (held) calibration
    and verification, on its way to Deploying."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    for m in [*echo_baseline(model, replicas), dataset_configmap()]:
        w.apply(m)
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "llm"},
        "spec": {"parentRefs": [w.gw.parent_ref()], "rules": [{"backendRefs": [{"name": "llm", "port": 80}]}]},
    }
    routes(w).create_namespaced_custom_object(*ROUTE_API[:2], w.namespace, ROUTE_API[2], route)
    wait_for(lambda: len(answered_by(w, 20)["baseline"]) == 20, 60, "the baseline answering through the gateway")
    w.kubelet.hold("calibration")
    serving = {"baseline": {"deployment": "llm", "service": "llm"}, "traffic": traffic}
    w.apply(kvcalibration(NAME, model, w.out, serving=serving, promotion={"mode": "manual"}))
    obj = w.wait_phase(NAME, "Calibrating", 30)
    # Skip the calibrator and the verifier (proven in test_lifecycle): the operator deploys the canary next.
    verification = {"job": f"{obj['status']['calibration']['job']}-v", "layers": 1, "mismatches": 0}
    status = {"phase": "Deploying", "verification": verification}
    w.cluster.kubectl("patch", "-n", w.namespace, f"kvcalibration/{NAME}", "--subresource=status", "--type=merge",
                      "-p", yaml.safe_dump({"status": status}))  # fmt: skip


# --- requests -----------------------------------------------------------------------------------------------------


def role(answer: dict[str, Any]) -> str:
    return "canary" if str(answer["kv_cache_dtype"]).startswith("fp8") else "baseline"


def answered_by(w: GatewayWorld, n: int) -> dict[str, list[int]]:
    """n requests through the gateway, one at a time: role -> the request indices it answered; "error" -> the
    status codes of the non-2xx answers."""
    out: dict[str, list[int]] = {"baseline": [], "canary": [], "error": []}
    with httpx.Client(base_url=w.gw.url, timeout=10) as http:
        for i in range(n):
            r = http.post("/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 1})
            if r.status_code != 200:
                out["error"].append(r.status_code)
            else:
                out[role(r.json())].append(i)
    return out


def binomial_bounds(n: int, percent: int) -> tuple[float, float]:
    p = percent / 100
    half = Z_999 * math.sqrt(n * p * (1 - p))
    return n * p - half, n * p + half


def assert_share(w: GatewayWorld, percent: int, shares: dict[int, int]) -> None:
    """REQUESTS requests: the canary answers `percent`% of them within a 99.9% binomial interval."""
    got = answered_by(w, REQUESTS)
    canary = len(got["canary"])
    shares[percent] = canary
    assert not got["error"], f"non-2xx answers at {percent}%: {Counter(got['error'])}"
    low, high = binomial_bounds(REQUESTS, percent)
    assert low <= canary <= high, f"{canary}/{REQUESTS} canary answers at {percent}%: outside [{low:.0f}, {high:.0f}]"


def wait_weight(w: GatewayWorld, percent: int, timeout: float = 30) -> None:
    """The route reads `percent` on the canary and Traefik runs that weight (its own API)."""
    wait_for(lambda: route_weight(w) == percent, timeout, f"the HTTPRoute at {percent}% on the canary")

    def running() -> bool:
        weights = w.gw.weights()
        canary = sum(v for k, v in weights.items() if CANARY in k)
        total = sum(weights.values())
        return (100 * canary / total if total else 0) == percent

    wait_for(running, timeout, f"Traefik running {percent}% on the canary (log: {w.gw.log})")


def ready_ips(w: GatewayWorld, service: str) -> set[str]:
    """The ready addresses the EndpointSlice controller published for `service`."""
    slices = w.cluster.get_json("endpointslices", "-n", w.namespace, "-l", f"kubernetes.io/service-name={service}")
    return {
        address
        for s in slices["items"]  # type: ignore[attr-defined]
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready")
        for address in e["addresses"]
    }


def traefik_ips(w: GatewayWorld, service: str) -> set[str]:
    """The pod IPs Traefik sends `service`'s share to (its servers for that Kubernetes Service)."""
    return {
        httpx.URL(url).host
        for name, urls in w.gw.servers().items()
        if name.startswith(f"{w.namespace}-{service}-")
        for url in urls
    }


class Load:
    """Requests through the gateway, one after another, until stopped: every answer's status and role."""

    def __init__(self, w: GatewayWorld) -> None:
        self.w = w
        self.answers: list[tuple[int, str]] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Load":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with httpx.Client(base_url=self.w.gw.url, timeout=10) as http:
            while not self._stop.is_set():
                try:
                    r = http.post("/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 1})
                except httpx.HTTPError as e:
                    self.failures.append(f"{type(e).__name__}: {e}")
                    continue
                self.answers.append((r.status_code, role(r.json()) if r.status_code == 200 else ""))

    def count(self, what: str) -> int:
        return sum(1 for code, who in self.answers if who == what)


# --- the tests ----------------------------------------------------------------------------------------------------


def test_each_step_sends_the_canary_its_weight_and_a_rollback_none(
    gw_world: GatewayWorld, tmp_path: Path, record_property: Any
) -> None:
    w, shares = gw_world, {}
    start(w, tmp_path, replicas=2, traffic={"router": "gateway-api", "httpRoute": "llm", "steps": [10, 50]})
    w.wait_phase(NAME, "Analyzing", 60)
    wait_weight(w, 10)
    assert_share(w, 10, shares)

    w.backends.metrics_fake.held.clear()  # the step passes; the last one waits for a manual promotion at 50%
    w.wait_phase(NAME, "AwaitingPromotion", 60)
    wait_weight(w, 50)
    assert_share(w, 50, shares)

    with Load(w) as load:
        w.cluster.kubectl("annotate", "-n", w.namespace, f"kvcalibration/{NAME}", "kvcal.dev/abort=e2e")
        # One pass: the pass that leaves AwaitingPromotion writes the route back to 100% on the baseline.
        wait_for(lambda: w.phase(NAME) != "AwaitingPromotion", 30, "the abort taken")
        assert route_weight(w) == 0, "the rollback's first pass left the canary on the route"
        wait_weight(w, 0)
        seen = len(load.answers)
        assert_share(w, 0, shares)
        w.wait_phase(NAME, "RolledBack", 60)
    late = load.answers[seen:]
    assert not load.failures and all(code == 200 for code, _ in load.answers), (
        load.failures[:3],
        Counter(load.answers),
    )
    assert all(who == "baseline" for _, who in late), Counter(late)
    record_property("canary_answers", shares)
    print(f"canary answers of {REQUESTS} per step (weight -> count): {shares}; rollback load: {Counter(load.answers)}")


def test_a_delete_mid_analysis_never_answers_5xx(gw_world: GatewayWorld, tmp_path: Path) -> None:
    w = gw_world
    traffic = {"router": "gateway-api", "httpRoute": "llm", "steps": [50], "drainDelay": "2s"}
    start(w, tmp_path, replicas=1, traffic=traffic)
    w.wait_phase(NAME, "Analyzing", 60)
    wait_weight(w, 50)
    with Load(w) as load:
        wait_for(lambda: load.count("canary") >= 20, 30, "the canary answering under load")
        w.cluster.kubectl("delete", "-n", w.namespace, f"kvcalibration/{NAME}", "--wait=false")
        wait_for(lambda: w.kube.get("KVCalibration", w.namespace, NAME) is None, 60, "the KVCalibration gone")
        wait_for(lambda: w.kube.get("Service", w.namespace, CANARY) is None, 30, "the canary Service gone")
        wait_for(lambda: w.kube.get("Deployment", w.namespace, CANARY) is None, 30, "the canary Deployment gone")
        after = len(load.answers)
        wait_for(lambda: len(load.answers) >= after + 100, 30, "100 requests after the canary is gone")
    codes = Counter(code for code, _ in load.answers)
    print(f"delete under load: {len(load.answers)} requests, statuses {dict(codes)}, canary {load.count('canary')}")
    assert not load.failures, load.failures[:3]
    assert set(codes) == {200}, f"answers other than 200 while the canary was deleted: {codes}"
    assert all(who == "baseline" for _, who in load.answers[after:])


def test_router_none_sends_every_request_to_the_baseline(gw_world: GatewayWorld, tmp_path: Path) -> None:
    w = gw_world
    start(w, tmp_path, replicas=1, traffic={"router": "none", "steps": [50]})
    w.wait_phase(NAME, "Analyzing", 60)
    canary_ips = wait_for(lambda: ready_ips(w, CANARY), 30, "the canary's EndpointSlice")
    # Wait until the data plane runs what the EndpointSlice controller published for the baseline Service (with the
    # old labels: the canary's pod too), so the requests below test the labels, not a race.
    baseline_ips = ready_ips(w, "llm")
    wait_for(lambda: traefik_ips(w, "llm") == baseline_ips, 30, f"Traefik routing to {baseline_ips}")
    got = answered_by(w, REQUESTS)
    print(f"router none: {len(got['baseline'])} baseline, {len(got['canary'])} canary of {REQUESTS}")
    assert not got["error"] and len(got["canary"]) == 0, {k: len(v) for k, v in got.items()}
    assert not canary_ips & baseline_ips, f"the baseline Service selects the canary's pod {canary_ips}"
