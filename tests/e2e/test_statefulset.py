"""A StatefulSet baseline (spec.serving.baseline.kind: StatefulSet) on the real control plane: the
kube-controller-manager's StatefulSet controller creates and rolls the pods, tests/support/kubelet.py marks them
ready, the operator runs under the chart's RBAC. Calibration and verification are held Jobs finished with their
summaries (as in test_promotion_revert); the analysis is the lifecycle tests' fake metrics."""

import json
from pathlib import Path
from typing import Any

import pytest

from kvcal.core.manifests import FIELD_MANAGER
from tests.support.cluster import wait_for
from tests.support.gitops import CALIBRATION_SUMMARY, VERIFICATION_SUMMARY, finish_job, promoted
from tests.support.world import World, baseline, condition, dataset_configmap, kvcalibration

pytestmark = pytest.mark.cluster
NAME = "smollm2"  # test_argocd.finish_job's KVCalibration
CANARY = f"{NAME}-canary"


def statefulset(model: Path, replicas: int) -> dict[str, Any]:
    """tests.support.world's baseline Deployment as a StatefulSet governed by the Service `llm`."""
    deployment = baseline(model, replicas)[0]
    return {**deployment, "kind": "StatefulSet", "spec": {**deployment["spec"], "serviceName": "llm"}}


def pods(w: World, prefix: str) -> dict[str, dict[str, Any]]:
    """The live pods `PREFIX-N` of a StatefulSet, by name."""
    found = w.kube.list("Pod", w.namespace, {})
    return {
        p["metadata"]["name"]: p
        for p in found
        if p["metadata"]["name"].rpartition("-")[0] == prefix and not p["metadata"].get("deletionTimestamp")
    }


def ready(w: World, name: str) -> dict[str, Any] | None:
    """The StatefulSet once all the pods it asks for are ready."""
    sts = w.kube.get("StatefulSet", w.namespace, name)
    return sts if sts and sts.get("status", {}).get("readyReplicas") == sts["spec"]["replicas"] else None


def start(w: World, tmp_path: Path, **spec: Any) -> dict[str, Any]:
    """A 2-pod StatefulSet baseline, ready; its KVCalibration calibrated and verified by held Jobs; returns the
    baseline as applied once the canary StatefulSet is ready."""
    model = tmp_path / "model"
    model.mkdir()
    w.kubelet.hold("calibration", "verification")
    manifest, service = statefulset(model, 2), baseline(model)[1]
    for m in (manifest, service, dataset_configmap()):
        w.apply(m)
    wait_for(lambda: ready(w, "llm"), 60, "the baseline StatefulSet's pods ready")
    serving = {"baseline": {"deployment": "llm", "service": "llm", "kind": "StatefulSet"}, "traffic": {"steps": [50]}}
    w.apply(kvcalibration(NAME, model, w.out, serving=serving, **spec))
    w.wait_phase(NAME, "Calibrating", 60)
    finish_job(w, "calibration", CALIBRATION_SUMMARY)
    w.wait_phase(NAME, "Verifying", 60)
    finish_job(w, "verification", VERIFICATION_SUMMARY)
    return manifest


def test_a_statefulset_baseline_is_promoted_by_server_side_apply(world: World, tmp_path: Path) -> None:
    w = world
    w.backends.metrics_fake.held.set()  # the analysis waits until the canary has been looked at
    start(w, tmp_path, promotion={"mode": "auto"})
    canary = wait_for(lambda: ready(w, CANARY), 60, "the canary StatefulSet's pods ready")
    assert canary["kind"] == "StatefulSet" and canary["spec"]["serviceName"] == "llm"
    args = canary["spec"]["template"]["spec"]["containers"][0]["args"]
    assert promoted(args) and canary["metadata"]["ownerReferences"][0]["name"] == NAME
    # The replicas router's 50% step beside 2 baseline pods: 2 canary pods, named by ordinal like the baseline's.
    assert set(pods(w, CANARY)) == {f"{CANARY}-0", f"{CANARY}-1"}
    assert w.children("Deployment", NAME) == []  # nothing of the Deployment kind
    before = {name: p["metadata"]["uid"] for name, p in pods(w, "llm").items()}
    assert set(before) == {"llm-0", "llm-1"}

    w.wait_phase(NAME, "Analyzing", 60)
    w.backends.metrics_fake.held.clear()
    obj = w.wait_phase(NAME, "Succeeded", 180)
    assert all(c["status"] == "True" for c in obj["status"]["conditions"]), obj["status"]["conditions"]
    assert [h["phase"] for h in obj["status"]["history"]][-3:] == ["Analyzing", "Promoting", "Succeeded"]

    live = w.kube.get("StatefulSet", w.namespace, "llm")
    assert live is not None and promoted(live["spec"]["template"]["spec"]["containers"][0]["args"])
    assert live["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    managers = {m["manager"]: m for m in live["metadata"]["managedFields"]}
    owned = json.dumps(managers[FIELD_MANAGER]["fieldsV1"])
    assert managers[FIELD_MANAGER]["operation"] == "Apply" and '"f:args"' in owned and '"f:updateStrategy"' in owned
    assert '"f:image"' not in owned and '"f:replicas"' not in owned and '"f:serviceName"' not in owned
    # The StatefulSet controller rolled every pod (new uids, the update revision) before kvcal said Succeeded.
    status = live["status"]
    assert status["currentRevision"] == status["updateRevision"] and status["updatedReplicas"] == 2
    after = pods(w, "llm")
    assert set(after) == set(before) and not {p["metadata"]["uid"] for p in after.values()} & set(before.values())
    assert {p["metadata"]["labels"]["controller-revision-hash"] for p in after.values()} == {status["updateRevision"]}
    wait_for(lambda: w.kube.get("StatefulSet", w.namespace, CANARY) is None, 30, "the canary StatefulSet deleted")
    wait_for(lambda: not pods(w, CANARY), 60, "the canary's pods gone")


def test_a_rollback_deletes_the_canary_statefulset_and_leaves_the_baseline(world: World, tmp_path: Path) -> None:
    w = world
    w.backends.metrics_fake.held.set()
    applied = start(w, tmp_path)
    wait_for(lambda: ready(w, CANARY), 60, "the canary StatefulSet's pods ready")
    w.wait_phase(NAME, "Analyzing", 60)
    baseline_before = w.kube.get("StatefulSet", w.namespace, "llm")
    assert baseline_before is not None

    w.cluster.kubectl("annotate", "-n", w.namespace, f"kvcalibration/{NAME}", "kvcal.dev/abort=e2e")
    obj = w.wait_phase(NAME, "RolledBack", 60)
    assert condition(obj, "Promoted")["reason"] == "RolledBack"
    assert w.kube.get("StatefulSet", w.namespace, CANARY) is None and w.children("Service", NAME) == []
    wait_for(lambda: not pods(w, CANARY), 60, "the canary's pods gone")
    after = w.kube.get("StatefulSet", w.namespace, "llm")
    assert after is not None and after["spec"]["template"] == baseline_before["spec"]["template"]
    assert (
        after["spec"]["template"]["spec"]["containers"][0]["args"]
        == (applied["spec"]["template"]["spec"]["containers"][0]["args"])
    )
    assert FIELD_MANAGER not in {m["manager"] for m in after["metadata"]["managedFields"]}  # never written

    # Deleting the KVCalibration lists its children of every kind under the chart's RBAC (the fixture fails on a 403).
    w.cluster.kubectl("delete", "-n", w.namespace, f"kvcalibration/{NAME}", "--wait=true", "--timeout=60s")
    assert w.children("Job", NAME) == [] and w.kube.get("StatefulSet", w.namespace, "llm") is not None
