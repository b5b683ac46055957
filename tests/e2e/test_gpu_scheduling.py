"""GPU-tight Nodes under a real kube-scheduler: the canary asks for a GPU that no Node has free.

The control plane runs kube-scheduler (tests/support/scheduling.py); the Nodes advertise `nvidia.com/gpu` as an
extended resource and the baseline's vLLM container asks for one, as on a GPU fleet. The harness plays kubelet only
for the pods the scheduler bound, so what does not fit stays Pending with the scheduler's own reason. The operator
runs under the chart's RBAC; calibration and verification are skipped by writing status (as in test_capacity).
"""

import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal.core.manifests import canary_name
from tests.support.cluster import Cluster, wait_for
from tests.support.gitops import CALIBRATION_SUMMARY, terminate_job_pod
from tests.support.scheduling import GPU, NodeAdder, gpu_use, on_gpu_nodes
from tests.support.world import (
    HOST_PATHS_ALLOWED,
    World,
    baseline,
    condition,
    dataset_configmap,
    kvcalibration,
    operated_world,
)

pytestmark = pytest.mark.cluster


@pytest.fixture
def world(scheduled_plane: Cluster, scheduled_namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Any:
    yield from operated_world(
        scheduled_plane, scheduled_namespace, tmp_path, caplog, values=HOST_PATHS_ALLOWED, scheduled=True
    )


def serving_on(w: World, gpu_nodes: NodeAdder, tmp_path: Path, gpus: int, replicas: int = 1) -> dict[str, Any]:
    """A Node with `gpus` GPUs and the baseline on it, ready; the calibration Job held. Returns the baseline."""
    gpu_nodes(gpus)
    model = tmp_path / "model"
    model.mkdir()
    served = baseline_on_gpus(w, model, replicas)
    w.kubelet.hold("calibration")
    return served


def baseline_on_gpus(w: World, model: Path, replicas: int = 1) -> dict[str, Any]:
    deployment, service = baseline(model, replicas)
    on_gpu_nodes(deployment, w.namespace)  # as the API server holds it once ready
    for manifest in (deployment, service, dataset_configmap()):
        w.apply(manifest)

    def ready() -> dict[str, Any] | None:
        obj = w.kube.get("Deployment", w.namespace, "llm") or {}
        return obj if (obj.get("status") or {}).get("readyReplicas") == replicas else None

    served: dict[str, Any] = wait_for(ready, 60, "the baseline's pods scheduled and ready")
    return served


def to_deploying(w: World, name: str) -> None:
    """Past calibration and verification (held, then skipped by writing status); the calibration Job is deleted, as
    if it had finished, so its pod holds no GPU (it asks for one, like a real calibration)."""
    obj = w.wait_phase(name, "Calibrating", 60)
    status = {"phase": "Deploying", "verification": {"job": f"{obj['status']['calibration']['job']}-v", "layers": 1,
                                                     "mismatches": 0}}  # fmt: skip
    w.cluster.kubectl("patch", "-n", w.namespace, f"kvcalibration/{name}", "--subresource=status", "--type=merge",
                      "-p", yaml.safe_dump({"status": status}))  # fmt: skip
    w.wait_phase(name, "Deploying", 30)  # before the delete: Calibrating would re-create a vanished Job
    job = obj["status"]["calibration"]["job"]
    w.cluster.kubectl("delete", "job", "-n", w.namespace, job, "--wait=false")
    # Gone before the test goes on: a GPU freed meanwhile would go to its pod, not to the pod the test watches.
    wait_for(lambda: not w.kube.list("Pod", w.namespace, {"job-name": job}), 60, "the calibration Job's pod deleted")


def unschedulable_reported(w: World, name: str) -> dict[str, Any] | None:
    obj = w.kvcal(name)
    ready = next((c for c in obj.get("status", {}).get("conditions") or [] if c["type"] == "CanaryReady"), None)
    return obj if ready is not None and ready["reason"] == "Unschedulable" else None


def unschedulable_events(w: World, name: str, reason: str = "CanaryUnschedulable") -> list[str]:
    """The messages of the operator's `reason` events about `name`, oldest first."""
    events = w.cluster.get_json("events", "-n", w.namespace, "--field-selector", f"involvedObject.name={name}")
    items = [e for e in events["items"] if e["reason"] == reason]  # type: ignore[attr-defined]
    items.sort(key=lambda e: (e.get("eventTime") or "", e.get("firstTimestamp") or ""))
    return [str(e["message"]) for e in items]


def canary_pod_created_at(w: World) -> datetime:
    (pod,) = w.kube.list("Pod", w.namespace, {"role": "canary"})
    return datetime.fromisoformat(pod["metadata"]["creationTimestamp"])


def test_a_canary_no_node_has_a_gpu_for_is_reported_then_rolled_back(
    world: World, gpu_nodes: NodeAdder, tmp_path: Path
) -> None:
    w, name = world, "gpu-full"
    before = serving_on(w, gpu_nodes, tmp_path, 1)
    spec = {"canary": {"scheduling": {"timeout": "5s", "onTimeout": "rollback"}}}
    w.apply(kvcalibration(name, tmp_path / "model", w.out, serving=spec))
    to_deploying(w, name)

    obj = wait_for(lambda: unschedulable_reported(w, name), 30, "CanaryReady False, reason Unschedulable")
    seen = datetime.now(UTC)
    message = condition(obj, "CanaryReady")["message"]
    assert f"1 canary pod of {canary_name(name)} unschedulable since " in message
    assert f"(no Node has a free {GPU})" in message
    assert f"Insufficient {GPU}" in message  # the scheduler's own words
    assert "rolling back at " in message and "spec.serving.canary.scheduling" in message
    # Reported within one pass of the scheduler's verdict, not at the Deployment's 10-minute progress deadline.
    assert (seen - canary_pod_created_at(w)).total_seconds() < 20

    obj = w.wait_phase(name, "RolledBack", 60)
    rolling_back = next(h for h in obj["status"]["history"] if h["phase"] == "RollingBack")
    assert rolling_back["reason"] == "CanaryUnschedulable"
    assert rolling_back["message"].endswith("rolling back after 5s (spec.serving.canary.scheduling)")
    # One report when first seen, then the rollback's own history event; not one per pass.
    reports = unschedulable_events(w, name)
    assert (
        len(reports) == 2
        and "; rolling back at " in reports[0]
        and reports[1].endswith("after 5s (spec.serving.canary.scheduling)")
    )
    wait_for(lambda: w.children("Deployment", name) == [], 30, "the canary removed")
    after = w.kube.get("Deployment", w.namespace, "llm")
    assert after is not None and after["spec"]["template"] == before["spec"]["template"]
    assert sum(gpu_use(w.cluster, w.namespace).values()) == 1  # the baseline's GPU, nothing left behind


def test_a_canary_told_to_wait_waits_for_a_gpu_then_goes_on(world: World, gpu_nodes: NodeAdder, tmp_path: Path) -> None:
    w, name = world, "gpu-wait"
    serving_on(w, gpu_nodes, tmp_path, 1)
    spec = {"canary": {"scheduling": {"timeout": "0s", "onTimeout": "wait"}}}
    w.apply(kvcalibration(name, tmp_path / "model", w.out, serving=spec))
    to_deploying(w, name)

    obj = wait_for(lambda: unschedulable_reported(w, name), 30, "CanaryReady False, reason Unschedulable")
    assert obj["status"]["phase"] == "Deploying"  # a timeout of 0s, and still waiting: the spec said wait
    assert condition(obj, "CanaryReady")["message"].endswith(
        "waiting for capacity (onTimeout wait) (spec.serving.canary.scheduling)"
    )
    assert len(unschedulable_events(w, name)) == 1

    added = gpu_nodes(1)  # the cluster autoscaler's part: a Node with a free GPU
    obj = w.wait_phase(name, "Analyzing", 60)
    assert condition(obj, "CanaryReady")["status"] == "True"
    assert [h["reason"] for h in obj["status"]["history"]].count("CanaryUnschedulable") == 0
    assert gpu_use(w.cluster, w.namespace)[added] == 1  # the canary runs on the new Node
    assert len(unschedulable_events(w, name)) == 1  # said once, not on every pass


class GpuWatch:
    """Samples the GPUs that bound pods of the namespace hold, as a cluster's accounting would see them."""

    def __init__(self, w: World) -> None:
        self.w, self.most = w, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):  # a sampling period, not a wait for a condition
            self.most = max(self.most, sum(gpu_use(self.w.cluster, self.w.namespace).values()))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        return self.most


def placed(w: World, replicas: int) -> bool:
    """The baseline runs `replicas` pods, every one bound and Ready, and no pod of the namespace is left Pending."""
    pods = [p for p in w.kube.list("Pod", w.namespace, {}) if not p["metadata"].get("deletionTimestamp")]
    serving = [p for p in pods if (p["metadata"].get("labels") or {}).get("app") == "llm"]
    pending = [p for p in pods if (p.get("status") or {}).get("phase") == "Pending"]
    ready = [p for p in serving if p["spec"].get("nodeName") and (p.get("status") or {}).get("phase") == "Running"]
    return not pending and len(serving) == len(ready) == replicas


FROM_BASELINE = {"canary": {"capacity": "fromBaseline"}}


def test_from_baseline_promotes_on_a_cluster_with_no_gpu_to_spare(
    world: World, gpu_nodes: NodeAdder, tmp_path: Path
) -> None:
    w, name = world, "from-baseline"
    # Exactly the baseline's GPUs: a surge canary could never be placed (the first test).
    serving_on(w, gpu_nodes, tmp_path, 2, replicas=2)
    watch = GpuWatch(w)
    w.apply(kvcalibration(name, tmp_path / "model", w.out, serving=FROM_BASELINE, promotion={"mode": "auto"}))
    to_deploying(w, name)

    obj = w.wait_phase(name, "Analyzing", 60)
    assert obj["status"]["canary"]["baselineReplicas"] == 2
    deployment = w.kube.get("Deployment", w.namespace, "llm")
    assert deployment is not None and deployment["spec"]["replicas"] == 1  # one pod's GPU went to the canary

    obj = w.wait_phase(name, "Succeeded", 120)
    wait_for(lambda: placed(w, 2), 60, "the promoted baseline back on both GPUs, nothing Pending")
    assert watch.stop() == 2  # never a GPU more than the baseline had
    promoted = w.kube.get("Deployment", w.namespace, "llm")
    assert promoted is not None and promoted["spec"]["replicas"] == 2
    assert "--kv-cache-dtype" in promoted["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "baselineReplicas" not in obj["status"]["canary"]
    assert "CanaryUnschedulable" not in w.events(name)


def test_from_baseline_rolls_back_to_the_baselines_own_pods(world: World, gpu_nodes: NodeAdder, tmp_path: Path) -> None:
    w, name = world, "from-baseline-back"
    before = serving_on(w, gpu_nodes, tmp_path, 2, replicas=2)
    watch = GpuWatch(w)
    # Promotion manual: it waits for a person, who aborts.
    w.apply(kvcalibration(name, tmp_path / "model", w.out, serving=FROM_BASELINE))
    to_deploying(w, name)
    w.wait_phase(name, "AwaitingPromotion", 120)
    w.cluster.kubectl("annotate", "-n", w.namespace, f"kvcalibration/{name}", "kvcal.dev/abort=gpu-e2e")

    obj = w.wait_phase(name, "RolledBack", 60)
    wait_for(lambda: placed(w, 2), 60, "the baseline back on both GPUs, nothing Pending")
    assert watch.stop() == 2
    after = w.kube.get("Deployment", w.namespace, "llm")
    assert after is not None and after["spec"]["replicas"] == 2
    assert after["spec"]["template"] == before["spec"]["template"]
    assert w.children("Deployment", name) == []
    assert "baselineReplicas" not in obj["status"]["canary"]


def test_a_calibration_job_waiting_for_a_gpu_keeps_its_run_time(
    world: World, gpu_nodes: NodeAdder, tmp_path: Path
) -> None:
    w, name = world, "job-waits"
    # The one GPU serves; the calibration Job asks for one too (its default resources).
    serving_on(w, gpu_nodes, tmp_path, 1)
    run_seconds = 20
    job_spec = {"job": {"backoffLimit": 0, "activeDeadlineSeconds": run_seconds}}
    w.apply(kvcalibration(name, tmp_path / "model", w.out, calibration=job_spec))

    def reported() -> dict[str, Any] | None:
        obj = w.kvcal(name)
        calibrated = next((c for c in obj.get("status", {}).get("conditions") or [] if c["type"] == "Calibrated"), None)
        return obj if calibrated is not None and calibrated["reason"] == "Unschedulable" else None

    obj = wait_for(reported, 30, "Calibrated Unknown, reason Unschedulable")
    message = condition(obj, "Calibrated")["message"]
    assert f"(no Node has a free {GPU})" in message and f"its {run_seconds} s of run time start once" in message
    job_name = obj["status"]["calibration"]["job"]

    def pod() -> dict[str, Any] | None:
        pods = w.kube.list("Pod", w.namespace, {"job-name": job_name})
        return pods[0] if pods else None

    def waited_past_its_deadline() -> bool:
        found = pod()
        created = datetime.fromisoformat(found["metadata"]["creationTimestamp"]) if found else None
        return created is not None and (datetime.now(UTC) - created).total_seconds() > run_seconds + 5

    wait_for(waited_past_its_deadline, 60, "the Job's pod Pending longer than the Job's run time")
    job = w.kube.get("Job", w.namespace, job_name)
    assert job is not None and job["spec"]["activeDeadlineSeconds"] > run_seconds + 25  # the wait given back
    assert not [c for c in job.get("status", {}).get("conditions") or [] if c["type"] == "Failed"]

    gpu_nodes(1)  # a GPU frees up
    wait_for(lambda: (pod() or {}).get("spec", {}).get("nodeName"), 60, "the Job's pod placed")
    terminate_job_pod(w.kube, w.namespace, name, "calibration", CALIBRATION_SUMMARY)
    obj = w.wait_phase(name, "Verifying", 60)  # it ran: the controller's deadline from the Job's start is long past
    assert condition(obj, "Calibrated")["status"] == "True"
    assert len(unschedulable_events(w, name, "JobUnschedulable")) == 1


def test_a_surge_promotion_on_full_nodes_takes_the_canarys_gpu(
    world: World, gpu_nodes: NodeAdder, tmp_path: Path
) -> None:
    # 2 GPUs: the baseline's pod and the canary's. The promoted baseline surges (its default strategy, kvcal adds
    # maxUnavailable 0): its new pod needs a third GPU, which only the canary can give.
    w, name = world, "surge-full"
    serving_on(w, gpu_nodes, tmp_path, 2, replicas=1)
    watch = GpuWatch(w)
    w.apply(kvcalibration(name, tmp_path / "model", w.out, promotion={"mode": "auto"}))
    to_deploying(w, name)

    obj = w.wait_phase(name, "Succeeded", 120)
    assert obj["status"]["history"][-1]["reason"] == "Promoted"
    assert w.events(name).count("CanaryMakesRoom") == 1  # the canary left before the rollout could finish
    wait_for(lambda: placed(w, 1), 60, "the promoted baseline on its GPU, nothing Pending")
    assert watch.stop() == 2
    promoted = w.kube.get("Deployment", w.namespace, "llm")
    assert promoted is not None and "--kv-cache-dtype" in promoted["spec"]["template"]["spec"]["containers"][0]["args"]
    assert w.children("Deployment", name) == []
