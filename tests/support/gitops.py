"""GitOps helpers of the Argo CD e2e tests: the Application of docs/operations.md, Jobs finished with the summaries
their containers write (as the kubelet would), and kvcal's promotion patch committed through a kustomization."""

import json
from datetime import UTC, datetime
from typing import Any

from kvcal.adapters.kube import MERGE_PATCH, KubeClient
from kvcal.core.manifests import FIELD_MANAGER
from tests.support.argocd import NAMESPACE, GitRepo
from tests.support.cluster import wait_for
from tests.support.world import World

NAME = "smollm2"
KIND = "KVCalibration"
# What docs/operations.md tells Argo CD users: leave the fields kvcal owns (server-side apply, manager kvcal) out of
# the diff, and keep them when a sync applies the Deployment for another change.
KEEP_PROMOTION: dict[str, Any] = {
    "ignoreDifferences": [{"group": "apps", "kind": "Deployment", "managedFieldsManagers": [FIELD_MANAGER]}],
    "syncOptions": ["RespectIgnoreDifferences=true"],
}
CALIBRATION_SUMMARY = {"samples": 8, "tokens": 1024, "strategy": "tensor", "observer": "static-minmax",
                       "kScaleMax": 0.12, "vScaleMax": 0.05}  # fmt: skip
VERIFICATION_SUMMARY = {"ok": True, "layers": 30, "mismatches": 0, "problems": []}


def application(name: str, repo: GitRepo, namespace: str, keep_promotion: bool) -> dict[str, Any]:
    """The Application of docs/operations.md: automated sync with prune and selfHeal, optionally KEEP_PROMOTION."""
    spec: dict[str, Any] = {
        "project": "default",
        "source": {"repoURL": repo.url, "targetRevision": "main", "path": "team"},
        "destination": {"server": "https://kubernetes.default.svc", "namespace": namespace},
        "syncPolicy": {"automated": {"prune": True, "selfHeal": True}},
    }
    if keep_promotion:
        spec["ignoreDifferences"] = KEEP_PROMOTION["ignoreDifferences"]
        spec["syncPolicy"]["syncOptions"] = KEEP_PROMOTION["syncOptions"]
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}  # fmt: skip


def finish_job(w: World, step: str, summary: dict[str, Any]) -> None:
    """Terminate the held pod of the KVCalibration's `step` Job (calibration, verification) with `summary` as its
    termination message, as the kubelet would."""
    terminate_job_pod(w.kube, w.namespace, NAME, step, summary)


def terminate_job_pod(kube: KubeClient, namespace: str, name: str, step: str, summary: dict[str, Any]) -> None:
    def job() -> str | None:
        obj = kube.get(KIND, namespace, name) or {}
        found: str | None = obj.get("status", {}).get(step, {}).get("job")
        return found

    job_name = wait_for(job, 60, f"the {step} Job")
    pod = wait_for(lambda: next(iter(kube.list("Pod", namespace, {"job-name": job_name})), None), 60, "pod")
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    container = pod["spec"]["containers"][0]
    terminated = {"exitCode": 0, "reason": "Completed", "message": json.dumps(summary), "startedAt": now,
                  "finishedAt": now}  # fmt: skip
    status = {"phase": "Succeeded", "containerStatuses": [
        {"name": container["name"], "image": container["image"], "imageID": "", "ready": False,
         "restartCount": 0, "state": {"terminated": terminated}}]}  # fmt: skip
    kube.request("PATCH", "Pod", namespace, pod["metadata"]["name"], subresource="status",
                   body={"status": status}, content_type=MERGE_PATCH)  # fmt: skip


def promotion_patch(w: World) -> str:
    """`kvcal promotion-patch NAME` as a person runs it: its stdout, committed as it is."""
    import contextlib
    import io

    from kvcal.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["promotion-patch", NAME, "-n", w.namespace, "--kubeconfig", w.cluster.kubeconfig]) == 0
    assert out.getvalue().startswith("# kvcal promotion") and "args: --model" in out.getvalue()
    return out.getvalue()


def kustomization(team: dict[str, list[dict[str, Any]]], patch_file: str) -> list[dict[str, Any]]:
    """The team's folder as a kustomization (Argo CD renders it with the real kustomize) with kvcal's patch."""
    resources = sorted(name.removeprefix("team/") for name in team)
    return [{"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": resources,
             "patches": [{"path": patch_file}]}]  # fmt: skip


def promoted(args: list[str]) -> bool:
    return "--kv-cache-dtype" in args and args[args.index("--model") + 1].startswith("/kvcal/host/")
