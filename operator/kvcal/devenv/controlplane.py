"""A real, throw-away Kubernetes control plane on loopback: etcd + kube-apiserver + kube-controller-manager, and
kube-scheduler where asked (`scheduler=True`).

Built from the binaries `make control-plane` puts in $KVCAL_CACHE/bin (default ~/.cache/kvcal/bin). RBAC is on; the
admin kubeconfig authenticates with a client certificate (group system:masters); ServiceAccount tokens work
(`kubectl create token`). There is no kubelet: pods stay Pending unless a test plays kubelet. Without the scheduler
the test binds pods too; with it, Nodes the test creates (`add_node`, advertising e.g. `nvidia.com/gpu` as an extended
resource) are where the scheduler places pods, and what does not fit stays Pending with the scheduler's reason.

    python -m kvcal.devenv.controlplane up     # prints KUBECONFIG=... last, runs until Ctrl-C / SIGTERM
"""

import argparse
import base64
import ctypes
import functools
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

import yaml

from kvcal.devenv.pki import CertificateAuthority, KeyPair, service_account_keys
from kvcal.local import LocalProcesses, cache_dir, free_port, stop_process_group

REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"  # the first address of SERVICE_CIDR: the `kubernetes` Service; in the serving cert's SANs
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
# What the operator and its tests need: owner-reference garbage collection, Jobs, Deployments (through ReplicaSets),
# StatefulSets, namespace deletion, per-namespace `default` ServiceAccounts and kube-root-ca.crt, TTL of finished Jobs,
# and EndpointSlices (a Service's ready pods, what a gateway routes to: tests/support/gateway.py).
CONTROLLERS = (
    "garbage-collector-controller",
    "job-controller",
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "ttl-after-finished-controller",
    "endpointslice-controller",
)


class ControlPlaneError(RuntimeError):
    pass


def default_bin_dir() -> Path:
    return cache_dir() / "bin"


def missing_binaries(bin_dir: Path, names: tuple[str, ...] = REQUIRED_BINARIES) -> list[str]:
    return [name for name in names if not os.access(bin_dir / name, os.X_OK)]


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the launching process dies, so a killed test run leaves no stray servers."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def _http_request(request: urllib.request.Request | str, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    """(HTTP status, body); status 0 when nothing answers yet."""
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return 0, ""


def write_kubeconfig(path: Path, server: str, ca: Path, client: KeyPair, user: str) -> None:
    """A kubeconfig with the certificates embedded, so it stays valid when copied elsewhere."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kvcal", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}],
        "users": [
            {"name": user, "user": {"client-certificate-data": b64(client.cert), "client-key-data": b64(client.key)}}
        ],
        "contexts": [{"name": "kvcal", "context": {"cluster": "kvcal", "user": user, "namespace": "default"}}],
        "current-context": "kvcal",
    }
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)


class ControlPlane(LocalProcesses):
    """`start()` (or `with ControlPlane() as cp:`); `stop()` kills the processes and removes the state."""

    def __init__(
        self,
        bin_dir: Path | None = None,
        root: Path | None = None,
        *,
        controller_manager: bool = True,
        scheduler: bool = False,
        crds: Sequence[Path] = (),
    ) -> None:
        self.bin_dir = bin_dir or default_bin_dir()
        self._own_root = root is None
        self.dir = root or Path(tempfile.mkdtemp(prefix="kvcal-cp-"))
        self.controller_manager = controller_manager
        self.scheduler = scheduler
        self.crds = tuple(crds)
        self.kubeconfig = self.dir / "admin.kubeconfig"
        self.port = 0
        self.server = ""
        self.startup_seconds = 0.0
        self.waits: dict[str, float] = {}  # seconds spent waiting for each readiness condition (start-up profile)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._admin: KeyPair | None = None
        self._ca: Path | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> Self:
        needed = ("etcd", "kube-apiserver") + (("kube-controller-manager",) if self.controller_manager else ())
        needed += ("kube-scheduler",) if self.scheduler else ()
        missing = missing_binaries(self.bin_dir, needed)
        if missing:
            raise ControlPlaneError(
                f"missing {', '.join(missing)} in {self.bin_dir}: run `make control-plane` (or set KVCAL_CACHE)"
            )
        began = time.monotonic()
        try:
            self._start(began + timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _start(self, deadline: float) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        # A reused --dir starts clean: etcd's old member would name peer ports that are gone.
        shutil.rmtree(self.dir / "etcd", ignore_errors=True)
        pki = self.dir / "pki"
        pki.mkdir(exist_ok=True)
        ca = CertificateAuthority(pki)
        serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            server_ips=("127.0.0.1", SERVICE_IP),
            server_dns=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
        )
        self._admin = ca.issue("admin", "kvcal-admin", organization="system:masters")
        self._ca = ca.cert
        kcm = ca.issue("controller-manager", "system:kube-controller-manager")
        scheduler = ca.issue("scheduler", "system:kube-scheduler") if self.scheduler else None
        sa = service_account_keys(pki)

        etcd_port, peer_port, self.port = free_port(), free_port(), free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        write_kubeconfig(self.kubeconfig, self.server, ca.cert, self._admin, "kvcal-admin")

        self._spawn("etcd", self._etcd_args(etcd_port, peer_port))
        # The API server's etcd clients back off when etcd is not up yet: a healthy etcd first starts it faster.
        etcd_health = f"http://127.0.0.1:{etcd_port}/health"
        self._wait("etcd /health", lambda: _http_request(etcd_health)[0] == 200, deadline)
        self._spawn("kube-apiserver", self._apiserver_args(etcd_port, ca.cert, serving, sa))
        if self.controller_manager and not self.crds:
            self._spawn_controller_manager(ca.cert, kcm, sa)  # overlaps the API server's start-up
        self._wait("kube-apiserver /readyz", lambda: self._get("/readyz") == 200, deadline)
        if self.crds:
            # Before the controller-manager: its garbage collector discovers resource types at start and then only
            # every 30 s, so children of custom resources installed later are collected up to 30 s late.
            for crd in self.crds:
                self.install_crd(crd, deadline - time.monotonic())
            if self.controller_manager:
                self._spawn_controller_manager(ca.cert, kcm, sa)
        if scheduler is not None:
            self._spawn_scheduler(ca.cert, scheduler)
        if self.controller_manager:
            # The ServiceAccount controller creating `default` proves the controller-manager is up and authorized.
            self.wait_for_default_service_account("default", deadline - time.monotonic())

    def stop(self) -> None:
        for name in reversed(list(self._procs)):
            stop_process_group(self._procs[name], timeout=10)
        self._procs.clear()
        if self._own_root:
            shutil.rmtree(self.dir, ignore_errors=True)

    def check_alive(self) -> None:
        """Raises naming the process that exited, with the end of its log."""
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise ControlPlaneError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        log = self.dir / f"{name}.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"

    def wait_for_default_service_account(self, namespace: str, timeout: float = 30.0) -> None:
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/default"
        self._wait(f"ServiceAccount {namespace}/default", lambda: self._get(path) == 200, time.monotonic() + timeout)

    def install_crd(self, path: Path, timeout: float = 30.0) -> None:
        """Creates the CustomResourceDefinition(s) in a YAML file and waits until they are Established."""
        for crd in (doc for doc in yaml.safe_load_all(path.read_text()) if doc):
            status, body = self._request("POST", CRD_PATH, crd)
            if status not in (201, 409):
                raise ControlPlaneError(f"creating {crd['metadata']['name']} from {path} failed ({status}): {body}")
            name, deadline = crd["metadata"]["name"], time.monotonic() + timeout
            self._wait(f"CRD {name} Established", functools.partial(self._crd_established, name), deadline)
            # ... and in discovery, which is what the garbage collector and kubectl read.
            plural = crd["spec"]["names"]["plural"]
            for version in (v["name"] for v in crd["spec"]["versions"] if v.get("served", True)):
                api = f"/apis/{crd['spec']['group']}/{version}"
                self._wait(f"{plural} in {api}", functools.partial(self._discovered, api, plural), deadline)

    def _discovered(self, api: str, plural: str) -> bool:
        status, body = self._request("GET", api)
        return status == 200 and any(r["name"] == plural for r in json.loads(body).get("resources") or [])

    def _crd_established(self, name: str) -> bool:
        status, body = self._request("GET", f"{CRD_PATH}/{name}")
        conditions = (json.loads(body).get("status") or {}).get("conditions") or [] if status == 200 else []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    # -- processes -------------------------------------------------------------------------------------------------
    def _etcd_args(self, port: int, peer_port: int) -> list[str]:
        client, peer = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer_port}"
        return [
            "--name=kvcal",
            f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=kvcal={peer}",
            "--unsafe-no-fsync",  # throw-away data: durability costs seconds per test run for nothing
            "--log-level=warn",
        ]

    def _apiserver_args(self, etcd_port: int, ca: Path, serving: KeyPair, sa: KeyPair) -> list[str]:
        # After controller-runtime envtest's defaults, with RBAC (+ Node) authorization and real SA token signing.
        return [
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={self.dir / 'pki'}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={ca}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={sa.cert}",
            f"--service-account-signing-key-file={sa.key}",
            "--profiling=false",
            "--v=1",
        ]

    def _controller_manager_args(self, kubeconfig: Path, ca: Path, sa: KeyPair) -> list[str]:
        return [
            f"--kubeconfig={kubeconfig}",
            f"--controllers={','.join(CONTROLLERS)}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",  # each controller acts as its own SA, as in a real cluster
            f"--service-account-private-key-file={sa.key}",
            f"--root-ca-file={ca}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--cert-dir={self.dir / 'pki' / 'kcm'}",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
            "--profiling=false",
            "--v=1",
        ]

    def _spawn_controller_manager(self, ca: Path, client: KeyPair, sa: KeyPair) -> None:
        kubeconfig = self.dir / "controller-manager.kubeconfig"
        write_kubeconfig(kubeconfig, self.server, ca, client, "system:kube-controller-manager")
        self._spawn("kube-controller-manager", self._controller_manager_args(kubeconfig, ca, sa))

    def _spawn_scheduler(self, ca: Path, client: KeyPair) -> None:
        # The bootstrap RBAC binds system:kube-scheduler (and system:volume-scheduler) to this user.
        kubeconfig = self.dir / "scheduler.kubeconfig"
        write_kubeconfig(kubeconfig, self.server, ca, client, "system:kube-scheduler")
        args = [
            f"--kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--cert-dir={self.dir / 'pki' / 'scheduler'}",
            "--profiling=false",
            "--v=1",
        ]
        self._spawn("kube-scheduler", args)

    def add_node(self, name: str, capacity: dict[str, str], labels: dict[str, str] | None = None) -> None:
        """A Ready Node with this capacity (and as much allocatable), e.g. {"nvidia.com/gpu": "1"}; cpu, memory and
        pods get room for any test's pods unless named. Nothing runs on it: the test plays its kubelet."""
        resources = {"cpu": "64", "memory": "256Gi", "pods": "110", **capacity}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux", "kubernetes.io/hostname": name,
                                                  **(labels or {})}},
        }  # fmt: skip
        status, body = self._request("POST", "/api/v1/nodes", node)
        if status not in (201, 409):
            raise ControlPlaneError(f"creating Node {name} failed ({status}): {body}")
        # The API server taints a new Node not-ready (TaintNodesByCondition); the node lifecycle controller, which
        # would lift it once the Node reports Ready, does not run here (no kubelet sends heartbeats).
        status, body = self._request(
            "PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}}, "application/merge-patch+json"
        )
        if status != 200:
            raise ControlPlaneError(f"untainting Node {name} failed ({status}): {body}")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now,
                 "lastTransitionTime": now}  # fmt: skip
        patch = {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}}
        status, body = self._request("PATCH", f"/api/v1/nodes/{name}/status", patch, "application/merge-patch+json")
        if status != 200:
            raise ControlPlaneError(f"setting Node {name}'s status failed ({status}): {body}")

    def _spawn(self, name: str, args: list[str]) -> None:
        with (self.dir / f"{name}.log").open("ab") as log:
            self._procs[name] = subprocess.Popen(
                [str(self.bin_dir / name), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                start_new_session=True,  # own process group: teardown kills it whole
                preexec_fn=_die_with_parent,  # set in the child between fork and exec
            )

    # -- health ----------------------------------------------------------------------------------------------------
    def _get(self, path: str) -> int:
        """HTTP status of GET path as the admin user; 0 when the server is not answering yet."""
        return self._request("GET", path)[0]

    def _request(
        self, method: str, path: str, body: object = None, content_type: str = "application/json"
    ) -> tuple[int, str]:
        """(status, body) of a request as the admin user; status 0 when the server is not answering yet."""
        assert self._admin is not None and self._ca is not None
        context = ssl.create_default_context(cafile=str(self._ca))
        context.load_cert_chain(str(self._admin.cert), str(self._admin.key))
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.server + path, data=data, method=method, headers={"Content-Type": content_type}
        )
        return _http_request(request, context)

    def _wait(self, what: str, ready: Callable[[], bool], deadline: float) -> None:
        began = time.monotonic()
        while not ready():
            self.check_alive()
            if time.monotonic() > deadline:
                names = ", ".join(self._procs)
                raise ControlPlaneError(f"timed out waiting for {what}; logs of {names} in {self.dir}")
            time.sleep(0.1)  # poll interval of a condition wait, not a fixed delay
        self.waits[what] = time.monotonic() - began


# -- CLI ----------------------------------------------------------------------------------------------------------
def _up(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    plane = ControlPlane(
        args.bin_dir,
        args.dir,
        controller_manager=not args.no_controller_manager,
        scheduler=args.scheduler,
        crds=args.crd,
    )
    try:
        plane.start(timeout=args.timeout)
        print(f"control plane ready in {plane.startup_seconds:.1f}s: {plane.server} (state and logs: {plane.dir})")
        print("Ctrl-C stops it and removes its state.")
        print(f"KUBECONFIG={plane.kubeconfig}", flush=True)
        while not stop.wait(1.0):
            plane.check_alive()
        return 0
    except ControlPlaneError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        plane.stop()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kvcal.devenv.controlplane",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start etcd + kube-apiserver + kube-controller-manager; print KUBECONFIG=...")
    up.add_argument("--bin-dir", type=Path, default=None, help="binaries (default $KVCAL_CACHE/bin)")
    up.add_argument("--dir", type=Path, default=None, help="state directory (default a fresh temp dir)")
    up.add_argument("--no-controller-manager", action="store_true", help="API server and etcd only")
    up.add_argument("--scheduler", action="store_true", help="also kube-scheduler (pods bound to the Nodes you add)")
    up.add_argument("--crd", type=Path, action="append", default=[], help="CRD YAML to install first (repeatable)")
    up.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness")
    up.set_defaults(func=_up)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
