"""The KVCalibration lifecycle on the real control plane, with the real calibrator and verifier.

The operator runs in-process (kopf in a thread, restartable) with a fake MetricsSource adapter: the analysis itself is
proven against real Prometheus in the analysis tests, and end to end on real vLLM servers in test_rollout_vllm; here
the point is the operator's lifecycle. tests/support/
kubelet.py plays kubelet: it runs our Jobs' containers as local processes and marks Deployment pods ready.
Every phase is entered with its children held, the operator is restarted there, and no child is ever duplicated.
"""

import re
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kvcal.adapters.kube import MERGE_PATCH
from kvcal.core.phases import LIFECYCLE
from tests.support.cluster import wait_for
from tests.support.world import CALIBRATION_TIMEOUT, World, baseline, condition, dataset_configmap, kvcalibration

pytestmark = pytest.mark.cluster


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
    # Woken by the Job's event, not by Calibrating's poll: that would come a poll interval after the last pass.
    poll = LIFECYCLE.poll_seconds("Calibrating")
    assert poll is not None and delay < poll / 2, f"the Job's completion reached the KVCalibration after {delay:.1f}s"
    assert condition(w.kvcal(name), "Calibrated")["reason"] == "BackoffLimitExceeded"
