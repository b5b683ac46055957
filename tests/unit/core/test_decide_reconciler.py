"""Reconciler.reconcile against an in-memory Kube fake: one status write per pass, a 409 re-reads, events and
annotation clean-up come after the write, unchanged status is never written."""

from dataclasses import dataclass
from datetime import datetime

from kvcal.core.manifests import calibration_job_name
from kvcal.core.spechash import spec_hash
from kvcal.metrics import OperatorMetrics
from kvcal.models.spec import AnalysisSpec
from kvcal.models.status import Measurement
from kvcal.ports import Manifest, MetricsSource, Probes, Router, Target
from kvcal.services.observe import PassAdapters
from kvcal.services.reconciler import Reconciler
from tests.support.decide import NOW, POLICY, SPEC, baseline_manifest, baseline_service, spec
from tests.support.fakekube import FakeKube, kvcal


def reconciler(kube: FakeKube) -> Reconciler:
    return Reconciler(kube, clock=lambda: NOW, metrics=OperatorMetrics(), policy=POLICY)


JOB = calibration_job_name("smollm2", spec_hash(spec()))


def test_first_pass_creates_then_writes_status_once_then_emits() -> None:
    kube = FakeKube([kvcal()])
    assert reconciler(kube).reconcile("llm", "smollm2") == 0.0
    writes = [c for c in kube.calls if c.startswith(("create", "replace_status", "event"))]
    assert writes == [f"create ConfigMap/{JOB}", f"create Job/{JOB}", "replace_status", "event CalibrationStarted"]
    assert kube.objects[("KVCalibration", "smollm2")]["status"]["phase"] == "Calibrating"


def test_unchanged_status_is_not_written() -> None:
    kube = FakeKube([kvcal()])
    r = reconciler(kube)
    r.reconcile("llm", "smollm2")
    kube.calls.clear()
    assert r.reconcile("llm", "smollm2") == 60.0
    assert "replace_status" not in kube.calls and not any(c.startswith("event") for c in kube.calls)
    # Calibrating reads its Job, and the baseline (a vanished Job is never re-created into the served output)
    assert kube.calls == ["get KVCalibration/smollm2", f"get Job/{JOB}", "get Deployment/llm"]


def test_conflict_rereads_and_retries() -> None:
    kube = FakeKube([kvcal()])
    kube.conflicts = 1
    reconciler(kube).reconcile("llm", "smollm2")
    assert kube.calls.count("replace_status") == 2
    assert kube.calls.count(f"create Job/{JOB}") == 1  # the second pass adopts the Job the first one made
    assert [c for c in kube.calls if c.startswith("event")] == ["event CalibrationStarted"]


def test_gate_annotation_cleared_after_the_status_write() -> None:
    kube = FakeKube([kvcal(annotations={"kvcal.dev/abort": "2026-01-02T03:04:05Z"})])
    r = reconciler(kube)
    r.reconcile("llm", "smollm2")
    tail = kube.calls[kube.calls.index("replace_status") :]
    assert tail[-1] == "remove_annotations kvcal.dev/abort"


def test_invalid_spec_reports_the_field() -> None:
    bad = kvcal()
    bad["spec"] = {**SPEC, "calibration": {**SPEC["calibration"], "samples": "many"}}
    kube = FakeKube([bad])
    reconciler(kube).reconcile("llm", "smollm2")
    status = kube.objects[("KVCalibration", "smollm2")]["status"]
    assert status["phase"] == "InvalidSpec" and "spec.calibration.samples" in status["message"]


def test_deleted_object_is_left_alone() -> None:
    kube = FakeKube([kvcal(deletionTimestamp=datetime(2026, 1, 1).isoformat())])
    assert reconciler(kube).reconcile("llm", "smollm2") is None
    assert kube.calls == ["get KVCalibration/smollm2"]


class RecordingProbes:
    def __init__(self) -> None:
        self.urls: list[tuple[str, str]] = []

    def run(self, spec: AnalysisSpec, baseline_url: str, canary_url: str) -> list[Measurement]:
        self.urls.append((baseline_url, canary_url))
        return []


@dataclass
class ProbesOnly:
    probes_fake: RecordingProbes

    def metrics_source(self, target: Target) -> MetricsSource | None:
        return None

    def probes(self, target: Target) -> Probes | None:
        return self.probes_fake

    def router(self, target: Target) -> Router | None:
        return None


def running_pod(name: str, ip: str, **labels: str) -> Manifest:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "llm", "labels": {"app": "llm", **labels}},
        "spec": {"containers": [{"name": "vllm", "ports": [{"containerPort": 8000}]}]},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def probe_target() -> Target:
    return Target("llm", "smollm2", spec(), "smollm2-canary", "smollm2-canary")


def test_probes_reach_one_pod_of_each_role_not_the_shared_service() -> None:
    canary = running_pod("smollm2-canary-a-1", "10.0.0.9", role="canary", **{"kvcal.dev/calibration": "smollm2"})
    kube = FakeKube([baseline_manifest(), baseline_service(), running_pod("llm-a-1", "10.0.0.2"), canary])
    probes = RecordingProbes()
    Reconciler(kube, clock=lambda: NOW).measure(PassAdapters(probe_target(), ProbesOnly(probes)), NOW)
    assert probes.urls == [("http://10.0.0.2:8000", "http://10.0.0.9:8000")]


def test_probes_without_a_ready_canary_pod_are_an_error_not_a_pass() -> None:
    kube = FakeKube([baseline_manifest(), baseline_service(), running_pod("llm-a-1", "10.0.0.2")])
    probes = RecordingProbes()
    (error,) = Reconciler(kube, clock=lambda: NOW).measure(PassAdapters(probe_target(), ProbesOnly(probes)), NOW)
    assert probes.urls == [] and error.phase == "Error" and "no ready canary pod" in (error.message or "")
