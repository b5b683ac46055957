"""A real Gateway API data plane for the traffic tests: Traefik (hack/build-gateway.sh builds it from Go modules)
with its kubernetesGateway provider, watching one namespace of the test control plane.

- The standard-channel Gateway API CRDs of the Traefik build (GatewayClass, Gateway, HTTPRoute, ...) are applied
  server-side (they replace the schema-less HTTPRoute CRD some API-level tests install; both accept their routes).
- Traefik authenticates as a ServiceAccount bound to upstream's RBAC for the provider
  (kubernetes-gateway-rbac.yml), with a token, as it would in a pod.
- It routes to the EndpointSlices of the Services an HTTPRoute names, which the real EndpointSlice controller writes
  from pods that tests/support/kubelet.py binds to a Node (`NODE`) and runs on pod IPs of `POD_NETWORK`. The API
  server refuses loopback addresses in an EndpointSlice, so the harness's usual 127.0.N.M will not do: POD_NETWORK
  (198.18.0.0/24, the benchmarking range of RFC 2544, routed nowhere) is made local with
  `ip route add local 198.18.0.0/24 dev lo`, which needs root (CI runs as root; elsewhere the tests skip, saying so).
- One GatewayClass and one Gateway per test; the Gateway's HTTP listener is Traefik's `web` entry point (Traefik
  matches listeners to entry points by port). `url` is where clients send requests; `weights()` reads what Traefik
  itself runs (its API), so a test waits for a weight change to reach the data plane instead of sleeping.
"""

import base64
import ipaddress
import json
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from kvcal.devenv.controlplane import cache_dir, free_port
from tests.support.cluster import Cluster, wait_for
from tests.support.prereq import require

CONTROLLER_NAME = "traefik.io/gateway-controller"
NODE = "kvcal-node"
GATEWAY_API = ("gateway.networking.k8s.io", "v1")
START_SECONDS = 60.0
POD_NETWORK = ipaddress.IPv4Network("198.18.0.0/24")


def traefik_binary() -> Path:
    return cache_dir() / "bin" / "traefik"


def gateway_share() -> Path:
    return cache_dir() / "share" / "gateway-api"


def require_traefik() -> None:
    have = os.access(traefik_binary(), os.X_OK) and (gateway_share() / "crds").is_dir()
    require(have, f"Traefik or the Gateway API CRDs missing under {cache_dir()} (run `make gateway`)")


def _is_local(address: str) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            return False
        return True


def require_pod_network() -> ipaddress.IPv4Network:
    """POD_NETWORK made local (an address of it can be bound here), adding the route when it is not yet."""
    probe = str(POD_NETWORK[1])
    if not _is_local(probe):
        subprocess.run(["ip", "route", "add", "local", str(POD_NETWORK), "dev", "lo"], capture_output=True, check=False)
    require(
        _is_local(probe),
        f"pod network {POD_NETWORK} is not local and `ip route add local {POD_NETWORK} dev lo` failed (needs root)",
    )
    return POD_NETWORK


def install_gateway_api(cluster: Cluster) -> None:
    """The Gateway API CRDs of the Traefik build, applied server-side and Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(gateway_share() / "crds"))
    for crd in ("gatewayclasses", "gateways", "httproutes", "grpcroutes", "referencegrants"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}.gateway.networking.k8s.io")


def ensure_node(cluster: Cluster) -> None:
    """The Node the kubelet harness binds pods to (the EndpointSlice controller skips pods on unknown Nodes)."""
    if cluster.kubectl("get", "node", NODE, check=False).returncode != 0:
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"kubernetes.io/os": "linux"}}}
        cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(node))


class Traefik:
    def __init__(self, cluster: Cluster, namespace: str, workdir: Path) -> None:
        self.cluster, self.namespace, self.workdir = cluster, namespace, workdir
        suffix = uuid.uuid4().hex[:6]
        self.gateway_class = f"traefik-{suffix}"
        self.rbac_name = f"traefik-gateway-{suffix}"
        self.gateway = "gateway"
        self.port, self.api_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "traefik.log"
        self._proc: subprocess.Popen[bytes] | None = None

    # --- set-up ----------------------------------------------------------------------------------------------------

    def _rbac(self) -> None:
        docs = list(yaml.safe_load_all((gateway_share() / "kubernetes-gateway-rbac.yml").read_text()))
        role, binding = (
            next(d for d in docs if d and d["kind"] == kind) for kind in ("ClusterRole", "ClusterRoleBinding")
        )
        role["metadata"]["name"] = self.rbac_name
        binding["metadata"]["name"] = self.rbac_name
        binding["roleRef"]["name"] = self.rbac_name
        binding["subjects"] = [{"kind": "ServiceAccount", "name": "traefik", "namespace": self.namespace}]
        self.cluster.kubectl("create", "serviceaccount", "traefik", "-n", self.namespace)
        self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([role, binding]))

    def _args(self) -> list[str]:
        token = self.cluster.kubectl("create", "token", "traefik", "-n", self.namespace, "--duration=2h").stdout.strip()
        admin = json.loads(Path(self.cluster.kubeconfig).read_text())
        ca = self.workdir / "traefik-ca.crt"
        ca.write_bytes(base64.b64decode(admin["clusters"][0]["cluster"]["certificate-authority-data"]))
        provider = "--providers.kubernetesGateway"
        return [
            str(traefik_binary()),
            f"--entryPoints.web.address=127.0.0.1:{self.port}",
            f"--entryPoints.traefik.address=127.0.0.1:{self.api_port}",
            "--api.insecure=true",
            "--ping=true",
            "--providers.providersThrottleDuration=100ms",  # apply a route change at once (default 2 s)
            f"{provider}=true",
            f"{provider}.endpoint={self.cluster.server}",
            f"{provider}.token={token}",
            f"{provider}.certAuthFilePath={ca}",
            f"{provider}.namespaces={self.namespace}",
            "--global.checkNewVersion=false",
            "--global.sendAnonymousUsage=false",
            "--log.level=INFO",
        ]

    def start(self) -> "Traefik":
        require_traefik()
        require_pod_network()
        install_gateway_api(self.cluster)
        ensure_node(self.cluster)
        self._rbac()
        with self.log.open("wb") as out:
            self._proc = subprocess.Popen(self._args(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        gateway_class = {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": self.gateway_class},
            "spec": {"controllerName": CONTROLLER_NAME},
        }
        listener = {
            "name": "web",
            "protocol": "HTTP",
            "port": self.port,
            "allowedRoutes": {"namespaces": {"from": "Same"}},
        }
        gateway = {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": self.gateway, "namespace": self.namespace},
            "spec": {"gatewayClassName": self.gateway_class, "listeners": [listener]},
        }
        self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([gateway_class, gateway]))
        wait_for(self._programmed, START_SECONDS, f"Traefik to program Gateway {self.gateway} (log: {self.log})")
        return self

    def _programmed(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise RuntimeError(f"traefik exited {self._proc.returncode}:\n{self.log_tail()}")
        obj = self.cluster.get_json("gateway", self.gateway, "-n", self.namespace)
        conditions = (obj.get("status") or {}).get("conditions") or []  # type: ignore[union-attr]
        return any(c["type"] == "Programmed" and c["status"] == "True" for c in conditions)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        self.cluster.kubectl("delete", "gatewayclass", self.gateway_class, "--wait=false", check=False)
        self.cluster.kubectl("delete", "clusterrole,clusterrolebinding", self.rbac_name, check=False)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""

    # --- what Traefik runs -----------------------------------------------------------------------------------------

    def parent_ref(self) -> dict[str, Any]:
        return {"name": self.gateway, "sectionName": "web"}

    def weights(self) -> dict[str, int]:
        """Service name -> weight of every weighted (canary) service Traefik runs now, from its API; the names are
        Traefik's, `NAMESPACE-SERVICE-PORT` for a Kubernetes Service backend."""
        services = httpx.get(f"http://127.0.0.1:{self.api_port}/api/http/services", timeout=5).json()
        out: dict[str, int] = {}
        for service in services:
            for backend in (service.get("weighted") or {}).get("services") or []:
                out[backend["name"]] = int(backend.get("weight", 1))
        return out

    def servers(self) -> dict[str, list[str]]:
        """Service name -> the server URLs (pod IPs) of every load-balanced service Traefik runs now."""
        services = httpx.get(f"http://127.0.0.1:{self.api_port}/api/http/services", timeout=5).json()
        return {
            s["name"]: [server["url"] for server in (s.get("loadBalancer") or {}).get("servers") or []]
            for s in services
            if s.get("loadBalancer")
        }


@contextmanager
def traefik(cluster: Cluster, namespace: str, workdir: Path) -> Iterator[Traefik]:
    gateway = Traefik(cluster, namespace, workdir)
    try:
        yield gateway.start()
    finally:
        gateway.stop()
