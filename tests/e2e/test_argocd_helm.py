"""kvcal installed the GitOps way (issue #11): Argo CD installs charts/kvcal from a git repository (Helm source), the
operator pod runs in the real operator image (tests.support.imagekubelet: podman, the chart's ServiceAccount token),
and that operator runs a team's KVCalibration that a second Application syncs from the same repository.

What this adds to test_argocd.py (in-process operator): argocd/application.yaml's operator Application, as the docs
give it (Helm source, server-side apply, the CRD from the chart's crds/), is a working install. Argo CD judges the
operator Deployment Healthy only once the container in the image answers its readiness probe; the containerised
operator takes the team's KVCalibration through Calibrating (an operator upgrade committed to Git mid-run replaces
the pod: the old one hands the Lease back on SIGTERM, the new one leads at once and carries on with the same Job),
Verifying and the canary (Argo CD health Progressing), and rolls it back on request (Degraded, canary gone, baseline
untouched); deleting the Application removes everything the chart made, cluster-wide objects included, but never the
CRD (annotated Delete=false: deleting it would delete every KVCalibration). The analysis itself needs Prometheus and
served models: test_argocd and test_rollout_vllm.
"""

import copy
import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal.adapters.kube import KubeClient
from kvcal.local import free_port
from tests.support.argocd import ArgoCD, GitRepo
from tests.support.chart import CHART
from tests.support.cluster import Cluster, wait_for
from tests.support.gitops import CALIBRATION_SUMMARY, KIND, NAME, VERIFICATION_SUMMARY, application, terminate_job_pod
from tests.support.imagekubelet import ImageKubelet
from tests.support.kubelet import FakeKubelet
from tests.support.oci import Container, Podman
from tests.support.world import baseline, dataset_configmap, kvcalibration

pytestmark = [pytest.mark.cluster, pytest.mark.images]
RESOURCES_FINALIZER = "resources-finalizer.argocd.argoproj.io"
EXAMPLE = Path(__file__).resolve().parents[2] / "argocd" / "application.yaml"
CRD = "kvcalibrations.kvcal.dev"


def chart_application(name: str, repo: GitRepo, namespace: str, values: dict[str, Any]) -> dict[str, Any]:
    """argocd/application.yaml's operator Application as the docs give it, pointed at this test's repository,
    release and namespace, with the test's values merged over the example's."""
    examples = [doc for doc in yaml.safe_load_all(EXAMPLE.read_text()) if doc]
    app = copy.deepcopy(next(doc for doc in examples if doc["spec"]["source"].get("helm")))
    app["metadata"]["name"] = name
    assert app["metadata"]["finalizers"] == [RESOURCES_FINALIZER]  # deleting the Application deletes the install
    source = app["spec"]["source"]
    source.update({"repoURL": repo.url, "targetRevision": "main"})
    source["helm"]["releaseName"] = name
    source["helm"]["valuesObject"] = {**source["helm"]["valuesObject"], **values}
    app["spec"]["destination"]["namespace"] = namespace
    return app


@dataclass
class Install:
    cluster: Cluster
    kube: KubeClient
    argocd: ArgoCD
    repo: GitRepo
    release: str  # the operator's Application, also its Helm release name
    system: str  # the operator's namespace
    team: str  # the team's namespace, which the operator watches
    kubelet: ImageKubelet

    def kvcal(self) -> dict[str, Any]:
        return self.kube.get(KIND, self.team, NAME) or {}

    def phase(self) -> str | None:
        phase: str | None = self.kvcal().get("status", {}).get("phase")
        return phase

    def wait_phase(self, *phases: str, timeout: float = 120) -> str:
        def reached() -> str | None:
            phase = self.phase()
            if phase in ("Failed", "InvalidSpec"):
                pytest.fail(f"{NAME} ended {phase}: {self.kvcal()['status'].get('message')}\n{self.kubelet.logs()}")
            return phase if phase in phases else None

        found: str = wait_for(reached, timeout, f"{NAME} in phase {' or '.join(phases)}")
        return found

    def wait_app(self, app: str, expected: tuple[str, str], timeout: float = 180) -> None:
        def reached() -> bool:
            self.kubelet.check()
            return self.argocd.sync_and_health(app) == expected

        wait_for(reached, timeout, f"Application {app} {expected}")

    def health(self, app: str) -> str | None:
        return self.argocd.health(app, KIND, NAME)


def leader(container: Container) -> str:
    """The pod name the operator in `container` leads as (the chart's --identity=$(KVCAL_POD_NAME))."""
    found = wait_for(lambda: re.search(r"leading as (\S+)", container.logs()), 60, "the operator to lead")
    return found[1]


def cluster_role_exists(install: "Install") -> bool:
    found = install.cluster.kubectl("get", "clusterrole", f"{install.release}-discovery", check=False)
    return found.returncode == 0


@pytest.fixture
def install(
    control_plane: Cluster, crd_installed: str, namespace: str, argocd: ArgoCD, podman: Podman, tmp_path: Path
) -> Iterator[Install]:
    podman.build("operator")
    system = f"kvcal-system-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", system)
    control_plane.plane.wait_for_default_service_account(system, timeout=30)
    kube = KubeClient(control_plane.api_client())
    release = f"kvcal-{uuid.uuid4().hex[:6]}"
    selector = {"app.kubernetes.io/instance": release, "app.kubernetes.io/component": "operator"}
    kubelet = ImageKubelet(control_plane, kube, podman, system, selector, tmp_path / "pods").start()
    repo = GitRepo(tmp_path / "repo").init()
    shutil.copytree(CHART, repo.path / "charts" / "kvcal")
    try:
        yield Install(control_plane, kube, argocd, repo, release, system, namespace, kubelet)
        print(argocd.logs())  # pytest shows it when the test failed
        print(kubelet.logs())
    finally:
        argocd.delete_application(f"team-{release}")
        argocd.delete_application(release)
        wait_for(lambda: not kubelet.running, 120, "the operator pod deleted with its Application")
        kubelet.stop()
        control_plane.kubectl("delete", "namespace", system, "--wait=false", check=False)


def test_the_chart_from_git_runs_the_operator_that_runs_the_teams_rollout(install: Install, tmp_path: Path) -> None:
    i = install
    model = tmp_path / "model"
    model.mkdir()
    team_files = {
        "team/serving.yaml": baseline(model, replicas=1),
        "team/prompts.yaml": [dataset_configmap()],
        "team/kvcalibration.yaml": [kvcalibration(NAME, model, tmp_path / "out")],
    }
    i.repo.commit(team_files, "the kvcal chart and a team's model server with its FP8 KV calibration")
    # Host network: the operator's ports must be free on this machine. The team's specs mount host folders.
    metrics_port = free_port()
    values = {
        "rbac": {"scope": "namespace"},
        "watchNamespace": i.team,
        "health": {"port": free_port()},
        "policy": {"hostPath": {"enabled": True, "allowedPrefixes": ["/"]}},
        # No Prometheus Operator (its CRDs) in this cluster.
        "metrics": {"port": metrics_port, "serviceMonitor": {"enabled": False}},
        "prometheusRule": {"enabled": False},
    }
    i.argocd.create_application(chart_application(i.release, i.repo, i.system, values))
    i.wait_app(i.release, ("Synced", "Healthy"))  # Healthy: the Deployment's pod answered /healthz in the image
    (container,) = i.kubelet.running.values()
    deployment = i.kube.get("Deployment", i.system, i.release)
    assert deployment is not None and deployment["status"]["availableReplicas"] == 1
    pod_spec = deployment["spec"]["template"]["spec"]
    assert pod_spec["containers"][0]["image"] == "ghcr.io/kvcal/kvcal-operator:0.1.0"
    assert pod_spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"]
    assert cluster_role_exists(i), "Argo CD created the chart's cluster-wide discovery role"

    team_kubelet = FakeKubelet(i.kube, i.team, tmp_path / "team-pods").start()
    team_kubelet.hold("calibration", "verification")
    team_app = f"team-{i.release}"
    try:
        i.argocd.create_application(application(team_app, i.repo, i.team, keep_promotion=True))
        i.wait_phase("Calibrating")
        wait_for(lambda: i.health(team_app) == "Progressing", 60, "Argo CD health Progressing")
        job = i.kube.get("Job", i.team, i.kvcal()["status"]["calibration"]["job"])
        assert job is not None
        first_pod = leader(container)

        # An operator upgrade through Git mid-run: the chart's new pod template replaces the pod (Recreate, so the
        # old operator releases the Lease first); the new operator carries on with the same calibration Job.
        values_file = i.repo.path / "charts" / "kvcal" / "values.yaml"
        upgraded = values_file.read_text().replace("podAnnotations: {}", 'podAnnotations: {kvcal.dev/rev: "2"}')
        values_file.write_text(upgraded)
        i.repo.commit({}, "operator: a new pod template")
        i.argocd.refresh(i.release)
        container = wait_for(lambda: i.kubelet.replaced(container), 180, "the upgraded operator pod Ready")
        i.wait_app(i.release, ("Synced", "Healthy"))
        assert i.kvcal()["status"]["calibration"]["job"] == job["metadata"]["name"] and i.phase() == "Calibrating"
        # The old operator handed the Lease back on SIGTERM: the new one leads at once, without a takeover.
        stopped = i.kubelet.stopped_logs
        assert any(f"released lease {i.system}/{i.release}" in log for log in stopped.values()), stopped
        assert leader(container) != first_pod and "from nobody (released)" in container.logs()

        terminate_job_pod(i.kube, i.team, NAME, "calibration", CALIBRATION_SUMMARY)
        i.wait_phase("Verifying")
        terminate_job_pod(i.kube, i.team, NAME, "verification", VERIFICATION_SUMMARY)
        i.wait_phase("Deploying", "Analyzing")
        canary = f"{NAME}-canary"
        wait_for(lambda: i.kube.get("Deployment", i.team, canary), 60, "the canary Deployment")
        assert i.health(team_app) == "Progressing"
        before = i.kube.get("Deployment", i.team, "llm")
        assert before is not None

        i.cluster.kubectl("annotate", "-n", i.team, f"kvcalibration/{NAME}", "kvcal.dev/abort=argocd-helm-e2e")
        i.wait_phase("RolledBack")
        wait_for(lambda: i.health(team_app) == "Degraded", 60, "Argo CD health Degraded")
        wait_for(lambda: i.kube.get("Deployment", i.team, canary) is None, 60, "the canary removed")
        after = i.kube.get("Deployment", i.team, "llm")
        assert after is not None and after["spec"]["template"] == before["spec"]["template"]
        assert i.argocd.sync_and_health(i.release) == ("Synced", "Healthy")
        logs = container.logs()
        assert "forbidden" not in logs.lower(), f"the chart's RBAC refused the operator:\n{logs[-4000:]}"
    finally:
        team_kubelet.stop()

    # Uninstall the GitOps way: the Application's finalizer deletes everything the chart made.
    i.argocd.delete_application(team_app)
    i.argocd.delete_application(i.release)
    wait_for(lambda: i.kube.get("Deployment", i.system, i.release) is None, 120, "the operator Deployment deleted")
    wait_for(lambda: not cluster_role_exists(i), 120, "the chart's ClusterRole deleted")
    crd = i.cluster.get_json("crd", CRD)
    assert crd["metadata"].get("deletionTimestamp") is None, "Argo CD must never delete the CRD (Delete=false)"
