"""The Helm chart on the real control plane: install it and get a kubeconfig that authenticates as the chart's own
ServiceAccount, so tests run the operator (or replay its calls) under exactly the RBAC the chart grants."""

import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from unittest.mock import patch

import yaml

from kvcal.core.guard.policy import Policy
from tests.support.cluster import Cluster

CHART = Path(__file__).resolve().parents[2] / "charts" / "kvcal"


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    service_account: str
    kubeconfig: Path  # authenticates as the chart's ServiceAccount


def helm(control_plane: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(Path(control_plane.bin_dir) / "helm"), *args, "--kubeconfig", str(control_plane.kubeconfig)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=control_plane.env())


def service_account_kubeconfig(control_plane: Cluster, namespace: str, service_account: str, out: Path) -> Path:
    """A kubeconfig for the same API server that authenticates only with a fresh token of NAMESPACE/SERVICE_ACCOUNT."""
    return Path(control_plane.token_kubeconfig(namespace, service_account, out))


def install_chart(
    control_plane: Cluster, namespace: str, release: str, values: dict[str, str], workdir: Path
) -> Release:
    """helm install (no --wait: there is no kubelet, the operator pod never runs here) and an SA kubeconfig."""
    sets = [a for k, v in values.items() for a in ("--set", f"{k}={v}")]
    proc = helm(control_plane, "install", release, str(CHART), "--namespace", namespace, *sets)
    assert proc.returncode == 0, f"helm install failed:\n{proc.stdout}\n{proc.stderr}"
    manifest_out = helm(control_plane, "get", "manifest", release, "--namespace", namespace).stdout
    (sa,) = [d["metadata"]["name"] for d in yaml.safe_load_all(manifest_out) if d and d["kind"] == "ServiceAccount"]
    kubeconfig = service_account_kubeconfig(control_plane, namespace, sa, workdir / f"{release}.kubeconfig")
    return Release(release, namespace, sa, kubeconfig)


def uninstall_chart(control_plane: Cluster, release: Release) -> None:
    helm(control_plane, "uninstall", release.name, "--namespace", release.namespace)


def release_name() -> str:
    """Unique per test: the ClusterRole and ClusterRoleBinding are named after the release and are cluster-wide."""
    return f"r{uuid.uuid4().hex[:8]}"


def operator_policy(control_plane: Cluster, release: Release) -> Policy:
    """The security policy the release's operator runs with: its Deployment's command line and env, as installed,
    parsed by the real `kvcal operator run` parser (the chart's policy.* values travel as flags and env)."""
    from kvcal.cli import build_parser
    from kvcal.handlers.cli import policy_from_args

    manifest = helm(control_plane, "get", "manifest", release.name, "--namespace", release.namespace).stdout
    (deployment,) = [d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
    argv = [*container["command"][1:], *container["args"]]
    with patch.dict(os.environ, env):  # the parser reads its defaults from the container's env
        return policy_from_args(build_parser(argv[0]).parse_args(argv))
