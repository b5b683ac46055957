"""Issue #10 item 1 on the real control plane: a KVCalibration is no way around RBAC.

A user bound only to the chart's aggregated -edit ClusterRole (may manage KVCalibrations; may not create Pods, Jobs
or Deployments) applies specs; the operator runs in-process under the chart's own ServiceAccount token with the
policy the chart's values give it (tests.support.chart.operator_policy). No kubelet: the point is what the operator
creates, not what runs.
"""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal.adapters.kube import KubeClient
from tests.e2e.test_lifecycle import FakeBackends, OperatorThread
from tests.support.chart import Release, helm, install_chart, operator_policy, release_name, uninstall_chart
from tests.support.cluster import Cluster, wait_for

pytestmark = pytest.mark.cluster
USER = "alice"


@dataclass
class Setup:
    cluster: Cluster
    namespace: str
    release: Release
    user_kubeconfig: Path
    kube: KubeClient  # the admin's view, to see everything the operator created

    def user_kubectl(self, *args: str, input: str | None = None) -> Any:
        return self.cluster.kubectl(
            *args, "-n", self.namespace, kubeconfig=str(self.user_kubeconfig), input=input, check=False
        )

    def apply_as_user(self, name: str, **spec: Any) -> Any:
        doc = {"apiVersion": "kvcal.dev/v1alpha1", "kind": "KVCalibration", "metadata": {"name": name}, "spec": spec}
        return self.user_kubectl("create", "-f", "-", input=json.dumps(doc))

    def status(self, name: str) -> dict[str, Any]:
        obj = self.kube.get("KVCalibration", self.namespace, name)
        return (obj or {}).get("status") or {}

    def wait_phase(self, name: str, phase: str) -> dict[str, Any]:
        found: dict[str, Any] = wait_for(
            lambda: self.status(name) if self.status(name).get("phase") == phase else None, 60, f"{name} {phase}"
        )
        return found

    def children(self, kind: str) -> list[str]:
        items = self.cluster.get_json(kind, "-n", self.namespace)["items"]
        names = [i["metadata"]["name"] for i in items]  # type: ignore[attr-defined]
        # Not the chart's own objects (the operator Deployment) nor the ConfigMap every namespace gets.
        return sorted(n for n in names if n != "kube-root-ca.crt" and not n.startswith(self.release.name))

    def events(self, name: str) -> list[tuple[str, str, str]]:
        selector = f"involvedObject.name={name}"
        events = self.cluster.get_json("events", "-n", self.namespace, "--field-selector", selector)
        return [(e["type"], e["reason"], e["message"]) for e in events["items"]]  # type: ignore[attr-defined]


@contextmanager
def operator_under_chart(
    control_plane: Cluster, namespace: str, tmp_path: Path, values: dict[str, str]
) -> Iterator[Setup]:
    release = install_chart(control_plane, namespace, release_name(), {"rbac.scope": "namespace", **values}, tmp_path)
    manifest = helm(control_plane, "get", "manifest", release.name, "--namespace", namespace).stdout
    (edit_role,) = [
        d["metadata"]["name"]
        for d in yaml.safe_load_all(manifest)
        if d and d["kind"] == "ClusterRole" and "rbac.authorization.k8s.io/aggregate-to-edit" in d["metadata"]["labels"]
    ]
    control_plane.kubectl("create", "serviceaccount", USER, "-n", namespace)
    control_plane.kubectl(
        "create", "rolebinding", f"{USER}-kvcal", f"--clusterrole={edit_role}", f"--serviceaccount={namespace}:{USER}",
        "-n", namespace,
    )  # fmt: skip
    user = control_plane.token_kubeconfig(namespace, USER, tmp_path / f"{USER}.kubeconfig")
    operator = OperatorThread(release.kubeconfig, namespace, FakeBackends(), operator_policy(control_plane, release))
    operator.start()
    try:
        yield Setup(control_plane, namespace, release, Path(user), KubeClient(control_plane.api_client()))
    finally:
        operator.stop()
        uninstall_chart(control_plane, release)


def spec(model: str, dataset: str, output: str, image: str | None = None) -> dict[str, Any]:
    calibration: dict[str, Any] = {"dataset": {"source": dataset}, "output": output}
    if image:
        calibration["job"] = {"image": image}
    return {
        "model": {"source": model},
        "calibration": calibration,
        "serving": {"baseline": {"deployment": "llm", "service": "llm"}},
    }


# What the reproduction applied: host folders (the output read-write) and an image of the user's choice.
ATTACK = spec("hostpath:///etc", "hostpath:///root/.ssh/id_rsa", "hostpath:///var/lib/x", "docker.io/attacker/x:1")


def test_edit_role_user_gets_nothing_created_by_the_default_policy(
    control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path
) -> None:
    with operator_under_chart(control_plane, namespace, tmp_path, {}) as s:
        for verb_resource in ("create pods", "create jobs", "create deployments"):
            assert s.user_kubectl("auth", "can-i", *verb_resource.split()).stdout.strip() == "no", verb_resource
        assert s.user_kubectl("auth", "can-i", "create", "kvcalibrations").stdout.strip() == "yes"

        created = s.apply_as_user("attack", **ATTACK)
        assert created.returncode == 0, created.stderr
        status = s.wait_phase("attack", "InvalidSpec")
        assert s.children("jobs") == [] and s.children("configmaps") == [] and s.children("deployments") == []
        message = status["message"]
        for field in ("spec.model.source", "spec.calibration.dataset.source", "spec.calibration.output"):
            assert f"{field}: hostpath:// is disabled by the operator's policy" in message
        assert "chart value policy.hostPath.enabled=true (and policy.hostPath.allowedPrefixes)" in message
        assert "spec.calibration.job.image: docker.io/attacker/x:1" in message
        assert "policy.calibratorImage.allowedPrefixes" in message
        assert status["history"][-1]["reason"] == "PolicyDenied"
        calibrated = next(c for c in status["conditions"] if c["type"] == "Calibrated")
        assert (calibrated["status"], calibrated["reason"]) == ("False", "PolicyDenied")
        events = wait_for(lambda: s.events("attack"), 30, "the PolicyDenied event")
        assert [(t, r) for t, r, _ in events] == [("Warning", "PolicyDenied")]

        # '..' never reaches the operator: the API server refuses it at admission.
        climbing = s.apply_as_user("climb", **spec("hostpath:///../../etc", "configmap://p/x.jsonl", "pvc://m/out"))
        assert climbing.returncode != 0 and "spec.model.source must not contain '..'" in climbing.stderr


def test_admin_allowed_prefix_and_image_work_and_nothing_beyond(
    control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path
) -> None:
    allowed = tmp_path / "allowed"
    values = {
        "policy.hostPath.enabled": "true",
        "policy.hostPath.allowedPrefixes[0]": f"{allowed}/",
        "policy.calibratorImage.allowedPrefixes[0]": "registry.example.com/ml/",
    }
    with operator_under_chart(control_plane, namespace, tmp_path, values) as s:
        inside = spec(
            f"hostpath://{allowed}/models/llama",
            "configmap://prompts/prompts.jsonl",
            f"hostpath://{allowed}/out/llama-fp8kv",
            "registry.example.com/ml/calibrator:2",
        )
        assert s.apply_as_user("inside", **inside).returncode == 0
        job_name = s.wait_phase("inside", "Calibrating")["calibration"]["job"]
        job = s.kube.get("Job", namespace, job_name)
        assert job is not None
        pod = job["spec"]["template"]["spec"]
        assert pod["containers"][0]["image"] == "registry.example.com/ml/calibrator:2"
        hosts = {v["hostPath"]["path"]: v["name"] for v in pod["volumes"] if "hostPath" in v}
        assert sorted(hosts) == [f"{allowed}/models/llama", f"{allowed}/out/llama-fp8kv"]
        mounts = {m["name"]: m.get("readOnly", False) for m in pod["containers"][0]["volumeMounts"]}
        assert mounts[hosts[f"{allowed}/models/llama"]] is True and mounts[hosts[f"{allowed}/out/llama-fp8kv"]] is False

        # One segment beside the allowed folder is outside it.
        beside = spec(f"hostpath://{allowed}-x/models", "configmap://prompts/prompts.jsonl", f"hostpath://{allowed}/o")
        assert s.apply_as_user("beside", **beside).returncode == 0
        status = s.wait_phase("beside", "InvalidSpec")
        assert f"spec.model.source: host folder {allowed}-x/models is outside" in status["message"]
        assert "chart value policy.hostPath.allowedPrefixes" in status["message"]
        assert s.children("jobs") == [job_name]  # only the allowed one's Job
