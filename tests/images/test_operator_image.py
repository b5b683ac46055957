"""The operator image, built from images/operator/Dockerfile, run as the chart's Deployment runs it: its command, args
and env from `helm get manifest`, user 65532, read-only root filesystem, the chart's ServiceAccount token mounted where
Kubernetes mounts it, against the dev control plane (host network: the API server listens on loopback). It must take
a KVCalibration to Calibrating, i.e. create the calibration Job, under the chart's RBAC."""

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal.devenv.images import IMAGES
from kvcal.local import free_port
from tests.support.chart import Release, helm, install_chart, release_name, uninstall_chart
from tests.support.cluster import Cluster, wait_for
from tests.support.imagekubelet import container_env, expand, service_account_volume
from tests.support.minimal import kvcalibration
from tests.support.oci import Container, Podman

pytestmark = [pytest.mark.cluster, pytest.mark.images]
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def chart_container(control_plane: Cluster, release: Release) -> dict[str, Any]:
    manifest = helm(control_plane, "get", "manifest", release.name, "--namespace", release.namespace).stdout
    (deployment,) = [d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "Deployment"]
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def healthz(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def wait_running(container: Container, predicate: Any, timeout: float, what: str) -> Any:
    """wait_for, failing at once (with the container's log) when the container stops."""

    def check() -> Any:
        state = container.podman("inspect", "--format", "{{.State.Status}}", container.name).stdout.strip()
        if state != "running":
            pytest.fail(f"the operator container is {state}:\n{container.logs()[-4000:]}")
        return predicate()

    try:
        return wait_for(check, timeout, what, interval=0.5)
    except pytest.fail.Exception as failure:
        pytest.fail(f"{failure}\noperator log:\n{container.logs()[-4000:]}")


def test_operator_image_takes_a_kvcalibration_to_calibrating(
    podman: Podman, control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path
) -> None:
    podman.build("operator")
    metrics_port, health_port = free_port(), free_port()  # host network: no clash with the host's 8080/9090
    values = {"rbac.scope": "namespace", "metrics.port": str(metrics_port), "health.port": str(health_port)}
    release = install_chart(control_plane, namespace, release_name(), values, tmp_path)
    sa = tmp_path / "sa"
    operator: Container | None = None
    try:
        container = chart_container(control_plane, release)
        assert container["image"] == IMAGES["operator"].tag, "the chart runs another tag than the build makes"
        # The pod the chart's Deployment would make: its env (fieldRefs) and $(VAR) args resolved as kubelet does.
        pod = {"metadata": {"namespace": namespace, "name": f"{release.name}-operator-0"}}
        env = container_env(container, pod, control_plane.server)
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] and security["runAsUser"] == 65532
        operator = podman.run(
            container["image"],
            [expand(arg, env) for arg in container["args"]],
            entrypoint=container["command"],
            env=env,
            mounts=[(service_account_volume(control_plane, namespace, release.service_account, sa), SA_DIR, "ro")],
            read_only=security["readOnlyRootFilesystem"],
            network_host=True,
        )
        wait_running(operator, lambda: healthz(health_port), 60, "the operator's /healthz (the chart's probes)")
        control_plane.kubectl("create", "configmap", "calib", "-n", namespace, "--from-literal=prompts.jsonl={}")
        control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(kvcalibration("smollm2")))

        def calibrating() -> dict[str, Any] | None:
            obj = control_plane.get_json("kvcalibration", "smollm2", "-n", namespace)
            status: dict[str, Any] = obj.get("status") or {}  # type: ignore[assignment]
            return status if status.get("phase") == "Calibrating" else None

        status = wait_running(operator, calibrating, 90, "KVCalibration smollm2 in phase Calibrating")
        job = control_plane.get_json("job", status["calibration"]["job"], "-n", namespace)
        pod = job["spec"]["template"]["spec"]  # type: ignore[index]
        assert pod["containers"][0]["image"] == IMAGES["calibrator"].tag  # the chart's jobImages.calibrator
        logs = operator.logs()
        assert "forbidden" not in logs.lower(), f"the chart's RBAC refused the operator:\n{logs[-4000:]}"
    finally:
        if operator is not None:
            operator.remove()
        uninstall_chart(control_plane, release)
