"""`helm install` of charts/kvcal on the real control plane, then every API call the operator makes, replayed with a
token of the chart's own ServiceAccount: none may be Forbidden, and calls outside the role must be.

Reusable for running the operator under the chart's RBAC (the lifecycle under the token): `install_chart`,
`service_account_kubeconfig`, and the fixtures `cluster_release` / `namespaced_chart_release`.
"""

import json
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import Release, helm, install_chart, release_name, uninstall_chart
from tests.support.cluster import Cluster, wait_for
from tests.support.minimal import kvcalibration

pytestmark = pytest.mark.cluster

FORBIDDEN = "forbidden"  # kubectl says "(Forbidden)" or "is forbidden" depending on the command


def is_forbidden(proc: subprocess.CompletedProcess[str]) -> bool:
    return proc.returncode != 0 and FORBIDDEN in proc.stderr.lower()


class AsServiceAccount:
    """kubectl authenticated as the chart's ServiceAccount; records every call and its outcome."""

    def __init__(self, control_plane: Cluster, release: Release) -> None:
        self.control_plane = control_plane
        self.release = release
        self.calls: list[tuple[str, subprocess.CompletedProcess[str]]] = []

    def __call__(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = self.control_plane.kubectl(*args, check=False, input=stdin, kubeconfig=str(self.release.kubeconfig))
        self.calls.append((" ".join(args), proc))
        return proc

    def forbidden(self) -> list[str]:
        return [f"{cmd}: {p.stderr.strip()}" for cmd, p in self.calls if is_forbidden(p)]

    def failed(self) -> list[str]:
        return [f"{cmd}: {p.stderr.strip()}" for cmd, p in self.calls if p.returncode != 0]


def manifest(obj: dict[str, Any]) -> str:
    return json.dumps(obj)


def job(name: str) -> dict[str, Any]:
    container = {"name": "calibrate", "image": "ghcr.io/kvcal/kvcal-calibrator:0.1.0", "args": ["--config", "/c"]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [container]}}},
    }


def deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    container = {"name": "vllm", "image": "vllm/vllm-openai:v0.32.0", "args": ["--kv-cache-dtype", "fp8_e4m3"]}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


def core_event(namespace: str, regarding: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{regarding}.kvcal-rbac", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "kvcal.dev/v1alpha1",
            "kind": "KVCalibration",
            "name": regarding,
            "namespace": namespace,
        },
        "reason": "Calibrating",
        "message": "calibration Job created",
        "type": "Normal",
        "source": {"component": "kvcal"},
    }


def events_k8s_io_event(namespace: str, regarding: str) -> dict[str, Any]:
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"{regarding}.kvcal-rbac-v1", "namespace": namespace},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "regarding": {
            "apiVersion": "kvcal.dev/v1alpha1",
            "kind": "KVCalibration",
            "name": regarding,
            "namespace": namespace,
        },
        "reason": "Calibrating",
        "action": "CreateJob",
        "note": "calibration Job created",
        "type": "Normal",
        "reportingController": "kvcal.dev/operator",
        "reportingInstance": "kvcal-operator",
    }


@pytest.fixture
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kvcal-chart-") as d:
        yield Path(d)


@pytest.fixture
def cluster_release(control_plane: Cluster, crd_installed: Any, namespace: str, workdir: Path) -> Iterator[Release]:
    release = install_chart(control_plane, namespace, release_name(), {}, workdir)
    yield release
    uninstall_chart(control_plane, release)


@pytest.fixture
def namespaced_chart_release(
    control_plane: Cluster, crd_installed: Any, namespace: str, workdir: Path
) -> Iterator[Release]:
    """The chart installed with rbac.scope=namespace in `namespace`; `.kubeconfig` authenticates as its ServiceAccount.
    For running an operator under the chart's RBAC: config.new_client_from_config(config_file=str(r.kubeconfig))."""
    release = install_chart(control_plane, namespace, release_name(), {"rbac.scope": "namespace"}, workdir)
    yield release
    uninstall_chart(control_plane, release)


def exercise_operator_calls(sa: AsServiceAccount, namespace: str, all_namespaces: bool) -> None:
    """Every call kopf and kvcal.adapters.kube make, in the order of one lifecycle."""
    admin_created = "rbac-demo"
    ns = ["-n", namespace]
    scope = ["-A"] if all_namespaces else ns
    # kopf: discovery, then list+watch of the custom resource.
    sa("get", "customresourcedefinitions", "kvcalibrations.kvcal.dev", "-o", "name")
    sa("get", "customresourcedefinitions", "-o", "name")
    sa("get", "namespaces", "-o", "name")
    sa("get", "--raw", "/api/v1/namespaces?watch=1&timeoutSeconds=1")
    sa("get", "kvcalibrations", *scope, "-o", "name")
    base = "/apis/kvcal.dev/v1alpha1" + ("" if all_namespaces else f"/namespaces/{namespace}")
    sa("get", "--raw", f"{base}/kvcalibrations?watch=1&timeoutSeconds=1")
    # kopf: finalizer and progress annotations on the object; the operator's single status write.
    sa("get", "kvcalibration", admin_created, *ns, "-o", "json")
    sa(
        "patch",
        "kvcalibration",
        admin_created,
        *ns,
        "--type=merge",
        "-p",
        '{"metadata": {"finalizers": ["kvcal.dev/operator"], "annotations": {"kvcal.dev/last": "1"}}}',
    )
    sa(
        "patch",
        "kvcalibration",
        admin_created,
        *ns,
        "--type=merge",
        "--subresource=status",
        "-p",
        '{"status": {"phase": "Calibrating", "observedGeneration": 1}}',
    )
    # The reconciler's status write: a PUT of the status subresource carrying the resourceVersion it read.
    current = json.loads(sa("get", "kvcalibration", admin_created, *ns, "-o", "json").stdout or "{}")
    current["status"] = {"phase": "Verifying", "observedGeneration": 1}
    sa("replace", "--subresource=status", "-f", "-", *ns, stdin=manifest(current))
    sa("patch", "kvcalibration", admin_created, *ns, "--type=merge", "-p", '{"metadata": {"finalizers": null}}')
    # Events (core/v1, as kopf posts them; and events.k8s.io).
    sa("create", "-f", "-", *ns, stdin=manifest(core_event(namespace, admin_created)))
    sa("create", "-f", "-", *ns, stdin=manifest(events_k8s_io_event(namespace, admin_created)))
    # The calibration Job's config, the Job, its pods' termination messages.
    sa("create", "configmap", f"{admin_created}-config", *ns, "--from-literal=config.json={}")
    sa("get", "configmap", f"{admin_created}-config", *ns)
    sa("get", "configmaps", *scope, "-l", "app.kubernetes.io/managed-by=kvcal")
    sa("patch", "configmap", f"{admin_created}-config", *ns, "--type=merge", "-p", '{"data": {"a": "b"}}')
    sa("create", "-f", "-", *ns, stdin=manifest(job(f"{admin_created}-calibrate")))
    sa("get", "job", f"{admin_created}-calibrate", *ns, "-o", "json")
    sa("get", "jobs", *scope)
    sa("get", "--raw", f"/apis/batch/v1/namespaces/{namespace}/jobs?watch=1&timeoutSeconds=1")
    sa("patch", "job", f"{admin_created}-calibrate", *ns, "--type=merge", "-p", '{"metadata": {"labels": {"a": "b"}}}')
    # A pod's wait for a Node given back to its Job's deadline.
    sa(
        "patch",
        "job",
        f"{admin_created}-calibrate",
        *ns,
        "--type=merge",
        "-p",
        '{"spec": {"activeDeadlineSeconds": 99}}',
    )
    sa("get", "pods", *ns, "-l", f"job-name={admin_created}-calibrate", "-o", "json")
    sa("get", "pod", "rbac-probe-pod", *ns, "-o", "json")
    sa("get", "--raw", f"/api/v1/namespaces/{namespace}/pods?watch=1&timeoutSeconds=1")
    sa("delete", "job", f"{admin_created}-calibrate", *ns, "--cascade=background")
    sa("delete", "configmap", f"{admin_created}-config", *ns)
    # Canary beside the baseline: read the baseline and its Service, create/scale/delete the canary.
    sa("get", "service", "smollm2", *ns, "-o", "json")
    canary_svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "smollm2-kvcal-canary"},
        "spec": {"selector": {"app": "smollm2", "role": "canary"}, "ports": [{"port": 8000}]},
    }
    sa("create", "-f", "-", *ns, stdin=manifest(canary_svc))
    sa("get", "services", *ns, "-l", "app.kubernetes.io/managed-by=kvcal")
    sa("patch", "service", "smollm2-kvcal-canary", *ns, "--type=merge", "-p", '{"metadata": {"labels": {"a": "b"}}}')
    sa("delete", "service", "smollm2-kvcal-canary", *ns)
    sa("get", "deployment", "smollm2", *ns, "-o", "json")
    sa("create", "-f", "-", *ns, stdin=manifest(deployment("smollm2-kvcal-canary")))
    sa("get", "deployments", *scope)
    sa("patch", "deployment", "smollm2-kvcal-canary", *ns, "--type=merge", "-p", '{"spec": {"replicas": 2}}')
    sa("patch", "deployment", "smollm2", *ns, "--type=merge", "-p", '{"spec": {"replicas": 1}}')
    sa("delete", "deployment", "smollm2-kvcal-canary", *ns)
    # capacity fromBaseline: is the baseline autoscaled (list only)?
    sa("get", "--raw", f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers")


def make_admin_objects(control_plane: Cluster, namespace: str) -> None:
    """What users own: the KVCalibration, the baseline Deployment and Service, a pod to read."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rbac-probe-pod"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.37"}]},
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "smollm2"},
        "spec": {"selector": {"app": "smollm2"}, "ports": [{"port": 8000}]},
    }
    objs = {
        "kind": "List",
        "apiVersion": "v1",
        "items": [kvcalibration("rbac-demo"), deployment("smollm2"), service, pod],
    }
    control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(objs))


def assert_outside_calls_forbidden(sa: AsServiceAccount, namespace: str) -> None:
    outside = [
        ("get", "secrets", "-n", namespace),
        ("create", "serviceaccount", "intruder", "-n", namespace),
        ("delete", "kvcalibration", "anything", "-n", namespace),
        ("create", "clusterrolebinding", "escalate", "--clusterrole=cluster-admin", "--user=x"),
        ("delete", "customresourcedefinition", "kvcalibrations.kvcal.dev"),
        ("run", "intruder", "-n", namespace, "--image=busybox:1.37", "--restart=Never"),
        ("exec", "rbac-probe-pod", "-n", namespace, "--", "true"),
    ]
    for call in outside:
        proc = sa(*call)
        assert is_forbidden(proc), f"{call} was not Forbidden: {proc.stderr}"


def test_chart_installs_and_operator_calls_are_allowed(
    control_plane: Cluster, namespace: str, cluster_release: Release
) -> None:
    make_admin_objects(control_plane, namespace)
    sa = AsServiceAccount(control_plane, cluster_release)
    exercise_operator_calls(sa, namespace, all_namespaces=True)
    assert sa.forbidden() == []
    assert sa.failed() == []
    assert len(sa.calls) >= 25
    # ... and what the operator never does stays Forbidden (same release: one install for both checks).
    assert_outside_calls_forbidden(AsServiceAccount(control_plane, cluster_release), namespace)
    # Authorisation runs before routing: with no Gateway API CRD here, an allowed call is NotFound, a denied one 403.
    route = f"/apis/gateway.networking.k8s.io/v1/namespaces/{namespace}/httproutes/llama"
    allowed = sa("get", "--raw", route)
    assert not is_forbidden(allowed) and "NotFound" in allowed.stderr, allowed.stderr
    # The shadow stage reads the route's parent Gateway (its class name): get only, nothing else of Gateway API.
    gateway = sa("get", "--raw", f"/apis/gateway.networking.k8s.io/v1/namespaces/{namespace}/gateways/llama")
    assert not is_forbidden(gateway) and "NotFound" in gateway.stderr, gateway.stderr
    denied = sa("get", "--raw", f"/apis/gateway.networking.k8s.io/v1/namespaces/{namespace}/grpcroutes/llama")
    assert is_forbidden(denied), denied.stderr
    # InferencePools only with rbac.inferencePool (off by default; tests/e2e/test_inference_pool.py turns it on).
    pool = sa("get", "--raw", f"/apis/inference.networking.k8s.io/v1/namespaces/{namespace}/inferencepools/llm")
    assert is_forbidden(pool), pool.stderr
    assert_pod_meets_restricted_pod_security(control_plane, namespace, cluster_release)


def assert_pod_meets_restricted_pod_security(control_plane: Cluster, namespace: str, release: Release) -> None:
    """The API server's PodSecurity admission, enforcing `restricted`, admits the operator's pod template (server-side
    dry run) and refuses a plain pod (so the check is live)."""
    control_plane.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    rendered = helm(control_plane, "get", "manifest", release.name, "--namespace", namespace).stdout
    (dep,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment"]
    template = dep["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "operator-psa", **template["metadata"]},
        "spec": template["spec"],
    }
    admitted = control_plane.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=manifest(pod), check=False
    )
    assert admitted.returncode == 0 and "violate" not in admitted.stderr, admitted.stderr
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain-psa"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.37"}]},
    }
    refused = control_plane.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=manifest(plain), check=False
    )
    assert refused.returncode != 0 and "restricted" in refused.stderr, refused.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            body: bytes = response.read()
            return body.decode()
    except OSError:
        return None


def test_real_operator_runs_under_the_namespaced_role(
    control_plane: Cluster, namespace: str, workdir: Path, namespaced_chart_release: Release
) -> None:
    """rbac.scope=namespace: `kvcal operator run` (the Deployment's command) with the chart's token starts, reconciles
    a KVCalibration into Calibrating (creates the Job and its ConfigMap), exports metrics, and is never Forbidden;
    the same token cannot reach beyond the namespace. (The Role's rules are the ClusterRole's namespaced rules, a
    unit test checks; test_chart_installs_and_operator_calls_are_allowed replays every one of them.)"""
    release = namespaced_chart_release
    log_path = workdir / "operator.log"
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "kvcal",
        "operator",
        "run",
        "--standalone",
        f"--namespace={namespace}",
        f"--metrics-port={port}",
        "--kubeconfig",
        str(release.kubeconfig),
    ]
    with log_path.open("w") as log:
        operator = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=control_plane.env())
    try:
        wait_for(lambda: scrape(port), 60, "the operator's metrics endpoint")
        make_admin_objects(control_plane, namespace)

        def calibrating() -> dict[str, Any] | None:
            obj = control_plane.get_json("kvcalibration", "rbac-demo", "-n", namespace)
            status: dict[str, Any] = obj.get("status") or {}  # type: ignore[assignment]
            job = status.get("calibration", {}).get("job")
            if status.get("phase") != "Calibrating" or not job:
                return None
            return (
                status
                if control_plane.kubectl("get", "job", job, "-n", namespace, check=False).returncode == 0
                else None
            )

        status = wait_for(calibrating, 90, "the operator to create the calibration Job")
        assert status["observedGeneration"] == 1
        wait_for(lambda: 'kvcal_objects{phase="Calibrating"} 1.0' in (scrape(port) or ""), 30, "kvcal_objects")
        sa = AsServiceAccount(control_plane, release)
        for outside in (
            ("get", "kvcalibrations", "-A"),
            ("get", "jobs", "-n", "kube-system"),
            ("get", "secrets", "-n", namespace),
        ):
            assert is_forbidden(sa(*outside)), f"{outside} was not Forbidden under rbac.scope=namespace"
    finally:
        operator.terminate()
        try:
            operator.wait(timeout=30)
        except subprocess.TimeoutExpired:
            operator.kill()
            operator.wait()
    log_text = log_path.read_text()
    denied = [line for line in log_text.splitlines() if "forbidden" in line.lower() or " 403" in line]
    assert denied == [], "\n".join(denied)
