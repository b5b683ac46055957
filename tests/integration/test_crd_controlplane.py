"""The test control plane is a real cluster where it matters to kvcal: RBAC denies what is not granted, tokens of
ServiceAccounts authenticate, and the controller-manager runs Deployments, Jobs and owner-reference garbage collection
(including children owned by a KVCalibration)."""

import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, wait_for

pytestmark = pytest.mark.cluster


def test_rbac_denies_a_service_account_until_a_role_grants_it(
    control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path
) -> None:
    control_plane.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    as_reader = control_plane.token_kubeconfig(namespace, "reader", tmp_path / "reader.kubeconfig")

    denied = control_plane.kubectl("get", "kvcalibrations", "-n", namespace, kubeconfig=as_reader, check=False)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr and f"system:serviceaccount:{namespace}:reader" in denied.stderr, denied.stderr

    control_plane.kubectl(
        "create", "role", "kvcal-reader", "--verb=get,list", "--resource=kvcalibrations", "-n", namespace
    )
    control_plane.kubectl(
        "create",
        "rolebinding",
        "kvcal-reader",
        "--role=kvcal-reader",
        f"--serviceaccount={namespace}:reader",
        "-n",
        namespace,
    )
    wait_for(
        lambda: (
            control_plane.kubectl("get", "kvcal", "-n", namespace, kubeconfig=as_reader, check=False).returncode == 0
        ),
        10,
        "the RoleBinding to take effect",
    )
    # Still denied outside what the Role grants.
    other = control_plane.kubectl("get", "configmaps", "-n", namespace, kubeconfig=as_reader, check=False)
    assert other.returncode != 0 and "Forbidden" in other.stderr


def test_anonymous_requests_are_forbidden(control_plane: Cluster) -> None:
    ca = base64.b64decode(
        json.loads(Path(control_plane.kubeconfig).read_text())["clusters"][0]["cluster"]["certificate-authority-data"]
    )
    context = ssl.create_default_context(cadata=ca.decode())  # trusts the server, presents no client identity
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{control_plane.server}/api/v1/namespaces", context=context, timeout=10)
    assert denied.value.code == 403
    assert "system:anonymous" in denied.value.read().decode()


def test_deployment_gets_a_replicaset(control_plane: Cluster, namespace: str) -> None:
    control_plane.kubectl(
        "create", "deployment", "web", "--image=registry.invalid/web:1", "--replicas=2", "-n", namespace
    )

    def replicaset() -> dict[str, object] | None:
        items = control_plane.get_json("replicasets", "-n", namespace, "-l", "app=web")["items"]
        assert isinstance(items, list)
        return items[0] if items else None

    rs = wait_for(replicaset, 30, "the deployment controller to create a ReplicaSet")
    owner = rs["metadata"]["ownerReferences"][0]  # type: ignore[index]
    assert (owner["kind"], owner["name"]) == ("Deployment", "web")
    # The ReplicaSet controller creates the pods (they stay Pending: there is no scheduler or kubelet).
    wait_for(
        lambda: len(control_plane.get_json("pods", "-n", namespace, "-l", "app=web")["items"]) == 2,  # type: ignore[arg-type]
        30,
        "the replicaset controller to create 2 pods",
    )


def test_job_gets_a_pod(control_plane: Cluster, namespace: str) -> None:
    control_plane.kubectl("create", "job", "calibrate", "--image=registry.invalid/calibrator:1", "-n", namespace)
    wait_for(
        lambda: control_plane.get_json("pods", "-n", namespace, "-l", "job-name=calibrate")["items"],
        30,
        "the job controller to create a pod",
    )


def test_garbage_collector_deletes_children_of_a_deleted_kvcalibration(
    control_plane: Cluster, crd_installed: str, namespace: str
) -> None:
    """The operator relies on this: Jobs and canaries it creates are owned by the KVCalibration."""
    example = Path(__file__).resolve().parents[2] / "examples" / "minimal-per-tensor.yaml"
    control_plane.kubectl("apply", "-n", namespace, "-f", str(example))
    owner = control_plane.get_json("kvcal", "llama-3-1-8b", "-n", namespace)["metadata"]
    assert isinstance(owner, dict)
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "child",
            "ownerReferences": [
                {
                    "apiVersion": "kvcal.dev/v1alpha1",
                    "kind": "KVCalibration",
                    "name": owner["name"],
                    "uid": owner["uid"],
                }
            ],
        },
        "data": {"k": "v"},
    }
    control_plane.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(child))
    control_plane.kubectl("delete", "kvcal", "llama-3-1-8b", "-n", namespace)
    control_plane.kubectl("wait", "--for=delete", "configmap/child", "-n", namespace, "--timeout=60s")


def test_service_gets_a_cluster_ip(control_plane: Cluster, namespace: str) -> None:
    control_plane.kubectl("create", "service", "clusterip", "llama", "--tcp=8000:8000", "-n", namespace)
    svc = control_plane.get_json("service", "llama", "-n", namespace)
    assert svc["spec"]["clusterIP"].startswith("10.0.0.")  # type: ignore[index]


@pytest.mark.slow
def test_cli_up_prints_kubeconfig_last_and_cleans_up_on_sigterm(control_plane: Cluster) -> None:
    """`make cluster` runs this: the last line printed is KUBECONFIG=..., SIGTERM stops it and removes its state."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvcal.devenv.controlplane", "up", "--no-controller-manager", "--timeout=90"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KVCAL_CACHE": str(control_plane.bin_dir.parent)},
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        kubeconfig = next(
            (line.strip()[len("KUBECONFIG=") :] for line in proc.stdout if line.startswith("KUBECONFIG=")), ""
        )
        assert kubeconfig, f"no KUBECONFIG line; stderr:\n{proc.stderr.read()}"
        ready = control_plane.kubectl("get", "--raw", "/readyz", kubeconfig=kubeconfig)
        assert ready.stdout.strip() == "ok"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stdout.read() == "", "KUBECONFIG=... must be the last line printed"
        assert not Path(kubeconfig).exists(), "the state directory must be removed on exit"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
