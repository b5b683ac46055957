"""The Helm chart as `helm template` renders it (the real helm binary), for the unit tests that read the rendered
manifests; and the Policy the rendered operator Deployment would run with."""

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal.core.guard.policy import Policy
from kvcal.handlers.cli import policy_from_args
from tests.support.prereq import require

CHART = Path(__file__).resolve().parents[2] / "charts" / "kvcal"
CACHE = Path(os.environ.get("KVCAL_CACHE", Path.home() / ".cache" / "kvcal"))
# helm template assumes an old cluster (v1.20) without one; the chart needs >= 1.30 (CEL validation in the CRD).
KUBE_VERSION = "1.35.0"


def helm_binary() -> str:
    found = CACHE / "bin" / "helm"
    if found.is_file():
        return str(found)
    on_path = shutil.which("helm")
    require(on_path, "helm not built yet: run `make control-plane` (hack/build-control-plane.sh)")
    assert on_path is not None
    return on_path


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def set_args(values: dict[str, str]) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k}={v}")]


def render(values: dict[str, str] | None = None, namespace: str = "kvcal-system") -> list[dict[str, Any]]:
    out = helm(
        "template", "rel", str(CHART), "--kube-version", KUBE_VERSION, "--namespace", namespace, *set_args(values or {})
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [
        d
        for d in docs
        if d["kind"] == kind
        and d["metadata"]["name"].endswith(name_suffix)
        and not is_user_role(d)
        and (is_leader_election(d) == name_suffix.endswith(LEADER_ELECTION))
    ]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def is_user_role(doc: dict[str, Any]) -> bool:
    """The ClusterRoles aggregated into admin/edit/view: for people, not the operator."""
    return any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in doc["metadata"].get("labels", {}))


LEADER_ELECTION = "-leader-election"


def is_leader_election(doc: dict[str, Any]) -> bool:
    """The Role (and binding) for the leader-election Lease, in the release namespace whatever rbac.scope says."""
    return bool(doc["metadata"]["name"].endswith(LEADER_ELECTION))


def operator_policy(docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> Policy:
    """Parse the rendered Deployment's command line and env with the real `kvcal operator run` parser."""
    from kvcal.cli import build_parser

    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    for env in container["env"]:
        if "value" in env:
            monkeypatch.setenv(env["name"], env["value"])
    argv = [*container["command"][1:], *container["args"]]
    return policy_from_args(build_parser(argv[0]).parse_args(argv))
