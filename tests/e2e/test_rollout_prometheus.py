"""The operator decides a whole promote and a whole rollback from real Prometheus data, on the real control plane.

The world of test_lifecycle (chart RBAC, kopf in a thread, FakeKubelet, real calibrator and verifier), with the
production metrics backend: ClusterBackends.metrics builds PrometheusMetrics(pod_regex_selector(...)) and queries the
session Prometheus. That Prometheus scrapes one stand-in vLLM exporter per REAL pod of the baseline and canary
Deployments, labelled with the pod's own name, so the operator's pod-name selectors decide which series is which.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kvcal.adapters.kube import KubeClient
from kvcal.handlers.backends import ClusterBackends
from kvcal.models.spec import AnalysisSpec
from kvcal.models.status import Measurement
from kvcal.ports import Metrics, Probes, Target
from tests.e2e.test_lifecycle import (
    CALIBRATION_TIMEOUT,
    FakeBackends,
    OperatorThread,
    World,
    baseline,
    dataset_configmap,
    kvcalibration,
    model_dir,  # noqa: F401 (a fixture)
)
from tests.support.chart import install_chart, release_name, uninstall_chart
from tests.support.cluster import Cluster, wait_for
from tests.support.exporter import Profile, VllmExporter
from tests.support.kubelet import FakeKubelet, component
from tests.support.prometheus import PrometheusServer

pytestmark = [pytest.mark.cluster, pytest.mark.model, pytest.mark.prometheus, pytest.mark.slow]

INTERVAL_SECONDS = 3  # the analysis interval, and so the query window: three 1 s scrapes
# TTFT medians chosen where vLLM's buckets (0.04, 0.06, 0.08, 0.1) resolve a 40% shift of the p95.
BASELINE = Profile(rate=40, ttft_median=0.05, itl_median=0.03, sigma=0.1)
SLOWER = replace(BASELINE, ttft_median=0.07)  # +40% TTFT, same ITL
TERMINAL = ("Succeeded", "RolledBack", "Failed", "InvalidSpec")


class PassingProbes:
    """Quality probes need a vLLM server behind each role; none runs here, so they pass. Metrics are the point."""

    def run(self, spec: AnalysisSpec, baseline_url: str, canary_url: str) -> list[Measurement]:
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return [Measurement(metric="tokenAgreement", phase="Successful", at=at, baseline=1.0, canary=1.0)]


@dataclass
class PrometheusBackends(FakeBackends):
    """Production metrics (ClusterBackends), passing probes, no router (the replicas router needs none)."""

    cluster_backends: ClusterBackends | None = None

    def metrics(self, target: Target) -> Metrics | None:
        assert self.cluster_backends is not None
        return self.cluster_backends.metrics(target)

    def probes(self, target: Target) -> Probes | None:
        return PassingProbes()


@dataclass
class Exporters:
    """One exporter per pod name, scraped by the session Prometheus with the labels a kubernetes-pods job adds."""

    prometheus: PrometheusServer
    namespace: str
    by_pod: dict[str, VllmExporter] = field(default_factory=dict)

    def serve(self, pods: list[str], profile: Profile) -> None:
        for pod in pods:
            self.by_pod[pod] = VllmExporter(profile, seed=len(self.by_pod) + 1).start()
        targets = {e.target: {"namespace": self.namespace, "pod": pod} for pod, e in self.by_pod.items()}
        self.prometheus.set_targets(self.namespace, targets)
        self.prometheus.wait_targets_up([self.by_pod[p].target for p in pods])

    def settle(self) -> None:
        """Fill one whole query window with samples of every exporter."""
        for _ in range(INTERVAL_SECONDS + 1):
            self.prometheus.wait_next_scrape(f'namespace="{self.namespace}"')

    def stop(self) -> None:
        self.prometheus.remove_targets(self.namespace)
        for exporter in self.by_pod.values():
            exporter.stop()


@dataclass
class RolloutWorld:
    world: World
    exporters: Exporters

    def pods(self, role: str) -> list[str]:
        # The chart's own operator Deployment runs pods too: select by the baseline's and the canary's labels.
        w = self.world
        labels = {"role": "canary"} if role == "canary" else {"app": "llm"}
        return sorted(p["metadata"]["name"] for p in w.kube.list("Pod", w.namespace, labels) if component(p) == role)

    def start(self, name: str, model: Path, canary: Profile) -> dict[str, Any]:
        """Baseline up and scraped, calibration and verification real; the canary's pods are held until their
        exporters are scraped, so the first analysis interval already has a full window of both roles."""
        w = self.world
        for m in [*baseline(model), dataset_configmap()]:
            w.apply(m)
        wait_for(lambda: len(self.pods("baseline")) == 2, 60, "baseline pods")
        self.exporters.serve(self.pods("baseline"), BASELINE)
        w.kubelet.hold("canary")
        analysis = {
            "prometheus": {"address": self.exporters.prometheus.url},
            "interval": f"{INTERVAL_SECONDS}s",
            "warmup": "0s",
            "successfulIntervals": 2,
            "failureLimit": 2,
            "inconclusiveLimit": 3,
            "minRequests": 20,
            "latency": [{"metric": "ttft", "quantile": 0.95}],
        }
        w.apply(kvcalibration(name, model, w.out, analysis=analysis, promotion={"mode": "auto"}))
        w.wait_phase(name, "Deploying", CALIBRATION_TIMEOUT)
        canary_pods: list[str] = wait_for(lambda: self.pods("canary"), 60, "canary pods")
        self.exporters.serve(canary_pods, canary)
        self.exporters.settle()
        before = w.kube.get("Deployment", w.namespace, "llm")
        assert before is not None
        w.kubelet.release("canary")
        return before

    def outcome(self, name: str) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            obj = self.world.kvcal(name)
            return obj if obj.get("status", {}).get("phase") in TERMINAL else None

        result: dict[str, Any] = wait_for(ended, 120, f"{name} to end its analysis")
        return result


@pytest.fixture
def rollout(
    control_plane: Cluster,
    crd_installed: str,
    namespace: str,
    prometheus: PrometheusServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> Iterator[RolloutWorld]:
    release = install_chart(control_plane, namespace, release_name(), {"rbac.scope": "namespace"}, tmp_path)
    kube = KubeClient(control_plane.api_client())
    kubelet = FakeKubelet(kube, namespace, tmp_path, extra_env={"HF_HUB_OFFLINE": "1"}).start()
    backends = PrometheusBackends(cluster_backends=ClusterBackends(kube))
    operator = OperatorThread(release.kubeconfig, namespace, backends)
    exporters = Exporters(prometheus, namespace)
    operator.start()
    try:
        world = World(control_plane, namespace, kube, kubelet, operator, backends, tmp_path / "out")
        yield RolloutWorld(world, exporters)
        forbidden = [r.getMessage() for r in caplog.records if "forbidden" in r.getMessage().lower()]
        assert not forbidden, f"the chart's RBAC refused the operator: {forbidden[:3]}"
    finally:
        operator.stop()
        kubelet.stop()
        exporters.stop()
        uninstall_chart(control_plane, release)


def by_metric(obj: dict[str, Any], metric: str) -> list[dict[str, Any]]:
    return [m for m in obj["status"]["analysis"]["measurements"] if m["metric"] == metric]


@pytest.mark.timeout(1200)
def test_equal_latency_promotes_from_prometheus(rollout: RolloutWorld, model_dir: Path) -> None:  # noqa: F811
    w, name = rollout.world, "equal"
    rollout.start(name, model_dir, canary=BASELINE)
    obj = rollout.outcome(name)
    assert obj["status"]["phase"] == "Succeeded", obj["status"]

    analysis = obj["status"]["analysis"]
    assert analysis["consecutiveSuccesses"] >= 2 and analysis["failures"] == 0 and analysis["inconclusive"] == 0
    ttft = by_metric(obj, "ttft-p95")
    assert len(ttft) >= 2 and all(m["phase"] == "Successful" for m in ttft), ttft
    for m in ttft:
        assert 0.04 < m["baseline"] < 0.08 and 0.04 < m["canary"] < 0.08, m  # BASELINE's p95 ~0.06 s on both sides
        assert f'pod=~"{name}-canary-[a-z0-9]+-[a-z0-9]+"' in m["query"] and f'namespace="{w.namespace}"' in m["query"]
    requests = by_metric(obj, "requests")[-1]
    assert requests["phase"] == "Successful" and requests["canary"] >= 20 and requests["baseline"] >= 20, requests
    assert by_metric(obj, "errorRate")[-1]["phase"] == "Successful"

    promoted = w.kube.get("Deployment", w.namespace, "llm")
    assert promoted is not None
    args = promoted["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--model") + 1].startswith("/kvcal/host/")
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    wait_for(lambda: w.children("Deployment", name) == [], 30, "canary removed")
    assert w.events(name)[-2:] == ["Promoting", "Promoted"]


@pytest.mark.timeout(1200)
def test_slower_canary_rolls_back_from_prometheus(rollout: RolloutWorld, model_dir: Path) -> None:  # noqa: F811
    w, name = rollout.world, "slower"
    before = rollout.start(name, model_dir, canary=SLOWER)
    obj = rollout.outcome(name)
    assert obj["status"]["phase"] == "RolledBack", obj["status"]

    analysis = obj["status"]["analysis"]
    assert analysis["failures"] == 2 and analysis["consecutiveSuccesses"] == 0, analysis
    failed = [m for m in by_metric(obj, "ttft-p95") if m["phase"] == "Failed"]
    assert len(failed) == 2, by_metric(obj, "ttft-p95")
    for m in failed:
        assert m["canary"] > 1.3 * m["baseline"] and m["canary"] > m["threshold"], m
        assert "time_to_first_token_seconds_bucket" in m["query"] and f"{name}-canary" in m["query"]
    assert analysis["ttftP95Delta"].startswith("+")

    wait_for(lambda: w.children("Deployment", name) == [], 30, "canary Deployment removed")
    after = w.kube.get("Deployment", w.namespace, "llm")
    assert after is not None and after["spec"]["template"] == before["spec"]["template"]  # baseline untouched
    assert after["spec"]["replicas"] == before["spec"]["replicas"]
    assert "Promoting" not in w.events(name)
