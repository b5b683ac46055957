"""pytest fixture `argocd`: a real Argo CD (v3.2, hack/build-argocd.sh) on loopback against the session's control plane.

Redis (Debian's redis-server), the repo server and the application controller run as local processes (no Argo CD
API server, no UI): the Application and AppProject CRDs and Argo CD's base
config come from the module the binary was built from (copied to $KVCAL_CACHE/share/argocd), argocd-cm gets kvcal's
health Lua from argocd/argocd-cm.yaml, and the AppProject `default` allows everything. ARGOCD_FAKE_IN_CLUSTER makes
the destination https://kubernetes.default.svc use the admin kubeconfig. Applications read a local git repository
(`GitRepo`, file://), and `refresh()` sets the argocd.argoproj.io/refresh annotation so a new commit is seen in
seconds (the repo server caches revisions longer than the 10 s resync).

Self-heal retries back off 2 s x 3^k, capped at SELF_HEAL_CAP_SECONDS here (300 s by default): a revert lands within
seconds, so a promotion that survives here survives the default too.
"""

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal.local import cache_dir, free_port
from tests.support.cluster import Cluster, wait_for
from tests.support.prereq import require

NAMESPACE = "argocd"
ROOT = Path(__file__).resolve().parents[2]
HEALTH_CM = ROOT / "argocd" / "argocd-cm.yaml"
RESYNC_SECONDS = 10
SELF_HEAL_CAP_SECONDS = 5
REFRESH_ANNOTATION = "argocd.argoproj.io/refresh"


def _share() -> Path:
    return cache_dir() / "share" / "argocd"


@dataclass
class GitRepo:
    """A team's manifests in a local git repository that Argo CD reads as file://PATH."""

    path: Path

    @property
    def url(self) -> str:
        return f"file://{self.path}"

    def _git(self, *args: str) -> str:
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "kvcal-e2e",
            "GIT_AUTHOR_EMAIL": "e2e@kvcal.dev",
            "GIT_COMMITTER_NAME": "kvcal-e2e",
            "GIT_COMMITTER_EMAIL": "e2e@kvcal.dev",
        }
        done = subprocess.run(["git", *args], cwd=self.path, env=env, check=True, capture_output=True, text=True)
        return done.stdout.strip()

    def init(self) -> "GitRepo":
        self.path.mkdir(parents=True, exist_ok=True)
        self._git("init", "-q", "-b", "main")
        return self

    def commit(self, files: dict[str, list[dict[str, Any]]], message: str) -> str:
        """Write each file (a list of manifests) and commit; returns the commit's hash."""
        for name, docs in files.items():
            target = self.path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        self._git("add", "-A")
        self._git("commit", "-q", "-m", message)
        return self._git("rev-parse", "HEAD")


@dataclass
class ArgoCD:
    cluster: Cluster
    workdir: Path

    def kubectl(self, *args: str, input: str | None = None) -> str:
        return self.cluster.kubectl(*args, input=input).stdout

    def create_application(self, app: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(app))

    def delete_application(self, name: str) -> None:
        self.cluster.kubectl("delete", "-n", NAMESPACE, "application", name, "--wait=false", check=False)

    def application(self, name: str) -> dict[str, Any]:
        app: dict[str, Any] = self.cluster.get_json("-n", NAMESPACE, "application", name)  # type: ignore[assignment]
        return app

    def refresh(self, name: str, kind: str = "normal") -> None:
        """Ask for a refresh now (Argo CD removes the annotation once done): new commits show in seconds."""
        self.kubectl("annotate", "--overwrite", "-n", NAMESPACE, f"application/{name}", f"{REFRESH_ANNOTATION}={kind}")

    def refreshed(self, name: str, kind: str = "normal") -> str:
        """Refresh and wait for it to finish; returns the new status.reconciledAt."""
        before = self.application(name).get("status", {}).get("reconciledAt")
        self.refresh(name, kind)

        def done() -> str | None:
            app = self.application(name)
            at = app.get("status", {}).get("reconciledAt")
            pending = REFRESH_ANNOTATION in (app["metadata"].get("annotations") or {})
            return at if at and at != before and not pending else None

        at: str = wait_for(done, 60, f"Argo CD to refresh {name}")
        return at

    def resource(self, name: str, kind: str, resource: str) -> dict[str, Any]:
        """The Application's status.resources[] entry of one resource ({} until Argo CD lists it)."""
        for entry in self.application(name).get("status", {}).get("resources") or []:
            if entry.get("kind") == kind and entry.get("name") == resource:
                found: dict[str, Any] = entry
                return found
        return {}

    def health(self, name: str, kind: str, resource: str) -> str | None:
        status: str | None = (self.resource(name, kind, resource).get("health") or {}).get("status")
        return status

    def sync_and_health(self, name: str) -> tuple[str | None, str | None]:
        status = self.application(name).get("status", {})
        return (status.get("sync") or {}).get("status"), (status.get("health") or {}).get("status")

    def logs(self) -> str:
        parts = []
        for log in sorted(self.workdir.glob("*.log")):
            parts.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
        return "\n".join(parts)


def _configure(cluster: Cluster) -> None:
    share = _share()
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    crds = [str(share / "crds" / f) for f in ("application-crd.yaml", "appproject-crd.yaml")]
    cluster.kubectl("apply", "--server-side", "--force-conflicts", *(a for crd in crds for a in ("-f", crd)))
    for crd in ("applications.argoproj.io", "appprojects.argoproj.io"):
        wait = ("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=5s")
        # A CRD just created has no status.conditions yet, which `kubectl wait` reports as an error.
        wait_for(lambda args=wait: cluster.kubectl(*args, check=False).returncode == 0, 60, f"{crd} established")
    for config in sorted((share / "config").glob("*.yaml")):
        cluster.kubectl("apply", "-n", NAMESPACE, "-f", str(config))
    secret = {"stringData": {"server.secretkey": os.urandom(16).hex()}}
    cluster.kubectl("patch", "-n", NAMESPACE, "secret", "argocd-secret", "--type=merge", "-p", json.dumps(secret))
    # kvcal's health check, exactly as the repository ships it (docs/operations.md).
    cluster.kubectl("patch", "-n", NAMESPACE, "configmap", "argocd-cm", "--type=merge", "--patch-file", str(HEALTH_CM))
    project = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AppProject",
        "metadata": {"name": "default", "namespace": NAMESPACE},
        "spec": {
            "sourceRepos": ["*"],
            "destinations": [{"server": "*", "namespace": "*"}],
            "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(project))


def _start(argv: list[str], env: dict[str, str], log: Path) -> "subprocess.Popen[bytes]":
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _stop(proc: "subprocess.Popen[bytes]") -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def argocd(control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArgoCD]:
    bin_dir = cache_dir() / "bin"
    binaries = [bin_dir / "argocd-application-controller", bin_dir / "argocd-repo-server"]
    require(all(os.access(b, os.X_OK) for b in binaries), f"Argo CD missing in {bin_dir} (run `make argocd`)")
    require((_share() / "crds" / "application-crd.yaml").is_file(), "Argo CD CRDs missing (run `make argocd`)")
    # The repo server renders Kustomize sources (and Helm charts) with the binaries on its PATH ($KVCAL_CACHE/bin).
    require(os.access(bin_dir / "kustomize", os.X_OK), f"kustomize missing in {bin_dir} (run `make argocd`)")
    require(os.access(bin_dir / "helm", os.X_OK), f"helm missing in {bin_dir} (run `make control-plane`)")
    redis = shutil.which("redis-server")
    require(redis, "redis-server missing (run `make argocd`: apt-get install redis-server)")
    assert redis is not None
    workdir = tmp_path_factory.mktemp("argocd")
    _configure(control_plane)
    redis_port, repo_port = free_port(), free_port()
    env = {
        **control_plane.env(),
        "ARGOCD_NAMESPACE": NAMESPACE,
        "ARGOCD_GPG_ENABLED": "false",  # else: fatal "stat /app/config/gpg/keys"
        "ARGOCD_FAKE_IN_CLUSTER": "true",  # https://kubernetes.default.svc = $KUBECONFIG
        "ARGOCD_APP_CONF_PATH": str(workdir / "app-conf"),
        "ARGOCD_GNUPGHOME": str(workdir / "app-conf" / "gpg" / "keys"),
        "ARGOCD_GPG_DATA_PATH": str(workdir / "gpg-data"),
        "TMPDIR": str(workdir / "tmp"),
        "HOME": str(workdir / "home"),
    }
    for folder in ("app-conf/gpg/keys", "gpg-data", "tmp", "home"):
        (workdir / folder).mkdir(parents=True, exist_ok=True)
    processes = [
        _start(
            [redis, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            env,
            workdir / "redis.log",
        )
    ]
    try:
        wait_for(lambda: _listening(redis_port), 30, "redis")
        redis_address = f"127.0.0.1:{redis_port}"
        repo_server = [str(binaries[1]), "--redis", redis_address, "--port", str(repo_port), "--address", "127.0.0.1"]
        repo_server += ["--metrics-address", "127.0.0.1", "--metrics-port", str(free_port()), "--disable-tls"]
        processes.append(_start(repo_server, env, workdir / "repo-server.log"))
        wait_for(lambda: _listening(repo_port), 120, "the Argo CD repo server")
        controller = [str(binaries[0]), "--kubeconfig", control_plane.kubeconfig, "--namespace", NAMESPACE]
        controller += ["--repo-server", f"127.0.0.1:{repo_port}", "--repo-server-plaintext", "--redis", redis_address]
        controller += ["--app-resync", str(RESYNC_SECONDS), "--app-resync-jitter", "0"]
        controller += ["--metrics-port", str(free_port()), "--persist-resource-health"]
        controller += ["--self-heal-backoff-cap-seconds", str(SELF_HEAL_CAP_SECONDS)]
        processes.append(_start(controller, env, workdir / "application-controller.log"))
        started = time.monotonic()
        harness = ArgoCD(control_plane, workdir)
        yield harness
        print(f"Argo CD ran {time.monotonic() - started:.0f}s")
    finally:
        for proc in reversed(processes):
            _stop(proc)
