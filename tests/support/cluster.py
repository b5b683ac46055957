"""pytest fixtures: cluster (see tests/conftest.py).

`control_plane` (session): a real etcd + kube-apiserver + kube-controller-manager, started once per session.
`crd_installed` (session): the KVCalibration CRD from crds/, applied and Established.
`namespace` (function): a fresh namespace (its `default` ServiceAccount exists), deleted afterwards.

Missing binaries fail the session loudly; set KVCAL_ALLOW_SKIP=1 to skip cluster tests instead (local use only).
"""

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from kubernetes import client, config

from kvcal.devenv.controlplane import ControlPlane, default_bin_dir, missing_binaries
from tests.support.prereq import require

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "crds"
CRD_NAME = "kvcalibrations.kvcal.dev"
T = TypeVar("T")


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{' '.join(map(str, self.cmd))} exited {self.returncode}:\n{self.stderr}"


def wait_for(predicate: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """Polls until predicate returns something truthy and returns it; fails the test naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)  # poll interval of a condition wait


@dataclass
class Cluster:
    plane: ControlPlane

    @property
    def kubeconfig(self) -> str:
        return str(self.plane.kubeconfig)

    @property
    def server(self) -> str:
        return self.plane.server

    @property
    def bin_dir(self) -> Path:
        return self.plane.bin_dir

    def env(self, kubeconfig: str | None = None) -> dict[str, str]:
        """Environment for a process that talks to this cluster (kubectl, helm, the operator)."""
        return {
            **os.environ,
            "KUBECONFIG": kubeconfig or self.kubeconfig,
            "KUBECACHEDIR": str(self.plane.dir / "kube-cache"),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        kubeconfig: str | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / "kubectl"), *args]
        proc = subprocess.run(
            cmd, input=input, capture_output=True, text=True, env=self.env(kubeconfig), timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, cmd, proc.stdout, proc.stderr)
        return proc

    def get_json(self, *args: str) -> dict[str, object]:
        data: dict[str, object] = json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        return data

    def api_client(self) -> client.ApiClient:
        api: client.ApiClient = config.new_client_from_config(config_file=self.kubeconfig)  # type: ignore[no-untyped-call]
        return api

    def token_kubeconfig(self, namespace: str, service_account: str, path: Path) -> str:
        """A kubeconfig that authenticates only with a fresh token of the ServiceAccount (no client certificate)."""
        token = self.kubectl("create", "token", service_account, "-n", namespace, "--duration=1h").stdout.strip()
        admin = json.loads(self.plane.kubeconfig.read_text())
        user = f"system:serviceaccount:{namespace}:{service_account}"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": admin["clusters"],
                    "users": [{"name": user, "user": {"token": token}}],
                    "contexts": [{"name": "sa", "context": {"cluster": "kvcal", "user": user, "namespace": namespace}}],
                    "current-context": "sa",
                }
            )
        )
        return str(path)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[Cluster]:
    bin_dir = default_bin_dir()
    missing = missing_binaries(bin_dir)
    if missing:
        reason = f"control-plane binaries missing in {bin_dir}: {', '.join(missing)} (run `make control-plane`)"
        if os.environ.get("KVCAL_ALLOW_SKIP") != "1":
            pytest.fail(reason + "; set KVCAL_ALLOW_SKIP=1 to skip cluster tests instead")
        require(False, reason)  # skipped, except under CI
    # The CRD goes in before the controller-manager starts, so its garbage collector knows KVCalibrations at once
    # (it rediscovers resource types only every 30 s); `crd_installed` still applies crds/ with kubectl.
    plane = ControlPlane(bin_dir, crds=sorted(CRD_DIR.glob("*.yaml"))).start()
    try:
        yield Cluster(plane)
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def crd_installed(control_plane: Cluster) -> str:
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR))
    control_plane.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    # Established means served; discovery (what kubectl resolves `kvcal` with) follows a moment later.
    wait_for(
        lambda: control_plane.kubectl("get", "kvcalibrations", "-A", check=False).returncode == 0,
        30,
        "KVCalibration in API discovery",
    )
    return CRD_NAME


def fresh_namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace named after the test, ready for pods; deleted after it."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{stem or 'test'}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    # Pods are admitted only once the namespace's `default` ServiceAccount exists.
    cluster.plane.wait_for_default_service_account(name, timeout=30)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def namespace(control_plane: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from fresh_namespace(control_plane, request)
