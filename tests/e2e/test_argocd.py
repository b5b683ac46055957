"""GitOps on a real Argo CD (issue #11): a team's baseline and KVCalibration synced from a git repository by an
Application with automated sync, prune and selfHeal; Argo CD judges the KVCalibration with argocd/health.lua.

The operator runs in-process under the chart's RBAC (the `world` of tests/e2e/conftest.py: FakeKubelet,
FakeMetrics). The calibration and verification Jobs are completed by this test with the summaries their containers
write (their pods are held, then given a terminated status, as the kubelet would): the calibrator and the verifier
are proven on the real model in test_lifecycle and test_rollout_vllm; here the point is what Argo CD sees and does.
"""

import json
import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvcal.core.manifests import FIELD_MANAGER
from tests.support.argocd import ArgoCD, GitRepo
from tests.support.cluster import wait_for
from tests.support.gitops import (
    CALIBRATION_SUMMARY,
    KIND,
    NAME,
    VERIFICATION_SUMMARY,
    application,
    finish_job,
    kustomization,
    promoted,
    promotion_patch,
)
from tests.support.world import World, baseline, condition, dataset_configmap, kvcalibration

pytestmark = pytest.mark.cluster


@dataclass
class GitOps:
    world: World
    argocd: ArgoCD
    repo: GitRepo
    app: str
    model: Path

    def team(self, **spec: Any) -> dict[str, list[dict[str, Any]]]:
        """The team's manifests: baseline Deployment + Service, the prompts, and the KVCalibration."""
        return {
            "team/serving.yaml": baseline(self.model, replicas=1),
            "team/prompts.yaml": [dataset_configmap()],
            "team/kvcalibration.yaml": [kvcalibration(NAME, self.model, self.world.out, **spec)],
        }

    def health(self) -> str | None:
        return self.argocd.health(self.app, KIND, NAME)

    def wait_health(self, expected: str, timeout: float = 60) -> None:
        wait_for(lambda: self.health() == expected, timeout, f"Argo CD health {expected} of {NAME} ({self.health()})")

    def finish_job(self, step: str, summary: dict[str, Any]) -> None:
        finish_job(self.world, step, summary)

    def wait_synced(self) -> None:
        """Until Argo CD has created the KVCalibration from Git."""
        w = self.world
        wait_for(lambda: w.kube.get(KIND, w.namespace, NAME), 120, "Argo CD to sync the KVCalibration from Git")

    def run_to_awaiting_promotion(self) -> None:
        """Calibrating (Progressing) -> ... -> AwaitingPromotion; the Jobs are completed with their summaries."""
        w = self.world
        self.wait_synced()
        w.wait_phase(NAME, "Calibrating", 60)
        self.wait_health("Progressing")
        self.finish_job("calibration", CALIBRATION_SUMMARY)
        w.wait_phase(NAME, "Verifying", 60)
        self.finish_job("verification", VERIFICATION_SUMMARY)
        w.wait_phase(NAME, "AwaitingPromotion", 120)

    def baseline_args(self) -> list[str]:
        deployment = self.world.kube.get("Deployment", self.world.namespace, "llm")
        assert deployment is not None
        args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        return args


@pytest.fixture
def gitops(world: World, argocd: ArgoCD, tmp_path: Path) -> Iterator[GitOps]:
    model = tmp_path / "model"
    model.mkdir()
    world.kubelet.hold("calibration", "verification")
    repo = GitRepo(tmp_path / "repo").init()
    app = f"team-{world.namespace}"[:53]
    yield GitOps(world, argocd, repo, app, model)
    print(argocd.logs())  # pytest shows it when the test failed
    argocd.delete_application(app)


def test_health_through_the_lifecycle_and_a_promotion_that_self_heal_keeps(gitops: GitOps) -> None:
    """Progressing, Suspended while awaiting the manual promotion, Healthy on Succeeded; with KEEP_PROMOTION the
    promotion survives refresh cycles (a hard one included) and a Git change to another field of the baseline."""
    g, w = gitops, gitops.world
    g.repo.commit(g.team(), "a team's model server and its FP8 KV calibration")
    g.argocd.create_application(application(g.app, g.repo, w.namespace, keep_promotion=True))
    g.run_to_awaiting_promotion()
    g.wait_health("Suspended")
    wait_for(lambda: g.argocd.sync_and_health(g.app) == ("Synced", "Suspended"), 60, "the Application Suspended")

    w.cluster.kubectl("annotate", "-n", w.namespace, f"kvcalibration/{NAME}", "kvcal.dev/promote=argocd-e2e")
    obj = w.wait_phase(NAME, "Succeeded", 120)
    g.wait_health("Healthy")
    assert promoted(g.baseline_args()), g.baseline_args()
    deployment = w.kube.get("Deployment", w.namespace, "llm")
    assert deployment is not None
    applied = [m for m in deployment["metadata"]["managedFields"] if m["manager"] == FIELD_MANAGER]
    assert [m["operation"] for m in applied] == ["Apply"]
    assert "f:image" not in json.dumps(applied[0]["fieldsV1"])  # the image, ports, ... stay Argo CD's

    for cycle, kind in enumerate(("normal", "normal", "hard")):
        g.argocd.refreshed(g.app, kind)
        assert g.argocd.sync_and_health(g.app) == ("Synced", "Healthy"), f"refresh {cycle + 1}"
        assert promoted(g.baseline_args()), f"refresh {cycle + 1} reverted the promotion: {g.baseline_args()}"

    team = g.team()
    relabelled = team["team/serving.yaml"][0]["metadata"]
    relabelled["labels"] = {**relabelled["labels"], "team": "inference"}  # not the selector's (immutable) dict
    revision = g.repo.commit(team, "label the model server")
    g.argocd.refresh(g.app)

    def labelled() -> bool:
        live = w.kube.get("Deployment", w.namespace, "llm") or {}
        app = g.argocd.application(g.app)
        synced = app.get("status", {}).get("sync", {}).get("revision") == revision
        return synced and live.get("metadata", {}).get("labels", {}).get("team") == "inference"

    wait_for(labelled, 60, "the Git change to the baseline's labels to be synced")
    assert promoted(g.baseline_args()), g.baseline_args()
    wait_for(lambda: g.argocd.sync_and_health(g.app) == ("Synced", "Healthy"), 60, "Synced and Healthy")
    obj = w.kvcal(NAME)
    assert obj["status"]["phase"] == "Succeeded" and condition(obj, "Promoted")["status"] == "True"
    assert "PromotionReverted" not in w.events(NAME)


def test_without_the_settings_self_heal_reverts_and_kvcal_reports_it(gitops: GitOps) -> None:
    """selfHeal alone puts the baseline back; kvcal says so (condition, event, metric) and Argo CD shows Degraded."""
    g, w = gitops, gitops.world
    g.repo.commit(g.team(promotion={"mode": "auto"}), "calibrate and promote on a passing analysis")
    g.argocd.create_application(application(g.app, g.repo, w.namespace, keep_promotion=False))
    g.wait_synced()
    w.wait_phase(NAME, "Calibrating", 60)
    g.finish_job("calibration", CALIBRATION_SUMMARY)
    w.wait_phase(NAME, "Verifying", 60)
    g.finish_job("verification", VERIFICATION_SUMMARY)

    def reverted() -> dict[str, Any] | None:
        obj = w.kvcal(NAME)
        promoted_condition = [c for c in obj.get("status", {}).get("conditions", []) if c["type"] == "Promoted"]
        return obj if promoted_condition and promoted_condition[0]["reason"] == "Reverted" else None

    obj = wait_for(reverted, 180, "kvcal to report the reverted promotion")
    assert obj["status"]["phase"] == "Succeeded"
    message = condition(obj, "Promoted")["message"]
    assert "argocd-controller" in message and "managedFieldsManagers" in message, message
    assert condition(obj, "Ready")["status"] == "False"
    assert not promoted(g.baseline_args())
    g.wait_health("Degraded")
    assert "Promotion reverted" in (g.argocd.resource(g.app, KIND, NAME).get("health") or {}).get("message", "")
    wait_for(lambda: "PromotionReverted" in w.events(NAME), 30, "the PromotionReverted event")

    def scrape() -> str | None:
        url = f"http://127.0.0.1:{w.operator.metrics_port}/metrics"
        text: str = urllib.request.urlopen(url, timeout=5).read().decode()
        return text if re.search(r"kvcal_promotion_reverted\{[^}]*name=\"smollm2\"[^}]*\} 1\.0", text) else None

    wait_for(scrape, 30, "kvcal_promotion_reverted 1")
    wait_for(lambda: g.argocd.sync_and_health(g.app) == ("Synced", "Degraded"), 60, "the Application Degraded")


def test_a_rollback_is_degraded(gitops: GitOps) -> None:
    g, w = gitops, gitops.world
    g.repo.commit(g.team(), "calibrate")
    g.argocd.create_application(application(g.app, g.repo, w.namespace, keep_promotion=True))
    g.wait_synced()
    w.wait_phase(NAME, "Calibrating", 60)
    g.wait_health("Progressing")
    w.cluster.kubectl("annotate", "-n", w.namespace, f"kvcalibration/{NAME}", "kvcal.dev/abort=argocd-e2e")
    w.wait_phase(NAME, "RolledBack", 60)
    g.wait_health("Degraded")
    assert g.argocd.sync_and_health(g.app)[0] == "Synced"


def test_changed_in_git_recalibrates_and_removed_from_git_is_pruned(gitops: GitOps) -> None:
    """A new dataset committed while calibrating starts over with a new Job; the KVCalibration deleted from Git is
    pruned by Argo CD, and kvcal's finalizer takes the canary out before it goes: the baseline serves alone again."""
    g, w = gitops, gitops.world
    g.repo.commit(g.team(), "calibrate")
    g.argocd.create_application(application(g.app, g.repo, w.namespace, keep_promotion=True))
    g.wait_synced()
    w.wait_phase(NAME, "Calibrating", 60)
    first_job = wait_for(lambda: w.kvcal(NAME)["status"].get("calibration", {}).get("job"), 30, "the first Job")
    team = g.team(calibration={"dataset": {"source": "configmap://prompts/prompts-v2.jsonl"}})
    prompts = team["team/prompts.yaml"][0]
    prompts["data"]["prompts-v2.jsonl"] = prompts["data"]["prompts.jsonl"]
    g.repo.commit(team, "a new calibration dataset")
    g.argocd.refresh(g.app)

    def recalibrating() -> str | None:
        job: str | None = w.kvcal(NAME).get("status", {}).get("calibration", {}).get("job")
        return job if job and job != first_job and w.phase(NAME) == "Calibrating" else None

    second_job = wait_for(recalibrating, 60, "a new calibration Job for the new dataset")
    assert second_job != first_job
    g.finish_job("calibration", CALIBRATION_SUMMARY)
    w.wait_phase(NAME, "Verifying", 60)
    g.finish_job("verification", VERIFICATION_SUMMARY)
    w.wait_phase(NAME, "AwaitingPromotion", 120)
    assert w.children("Deployment", NAME) == [f"{NAME}-canary"]
    before = w.kube.get("Deployment", w.namespace, "llm")
    assert before is not None

    del team["team/kvcalibration.yaml"]
    (g.repo.path / "team" / "kvcalibration.yaml").unlink()
    g.repo.commit(team, "no more FP8 KV for this model")
    g.argocd.refresh(g.app)
    wait_for(lambda: w.kube.get(KIND, w.namespace, NAME) is None, 90, "Argo CD to prune the KVCalibration")
    assert w.children("Deployment", NAME) == [] and w.children("Service", NAME) == []
    after = w.kube.get("Deployment", w.namespace, "llm")
    assert after is not None and after["spec"]["template"] == before["spec"]["template"]  # the baseline alone
    wait_for(lambda: g.argocd.sync_and_health(g.app) == ("Synced", "Healthy"), 60, "Synced and Healthy")


def test_promotion_through_git_completes_when_the_commit_lands(gitops: GitOps) -> None:
    """No ignoreDifferences: the team commits `kvcal promotion-patch` while Argo CD shows Suspended; kvcal finishes
    the promotion once Argo CD has synced it, without writing the baseline, and self-heal has nothing to revert."""
    g, w = gitops, gitops.world
    g.repo.commit(g.team(), "calibrate")
    g.argocd.create_application(application(g.app, g.repo, w.namespace, keep_promotion=False))
    g.run_to_awaiting_promotion()
    g.wait_health("Suspended")
    # The printed patch, committed verbatim beside the team's manifests; Argo CD's repo server runs kustomize.
    (g.repo.path / "team" / "kvcal-promotion.yaml").write_text(promotion_patch(w))
    team = g.team()
    revision = g.repo.commit(
        {"team/kustomization.yaml": kustomization(team, "kvcal-promotion.yaml")},
        "serve the calibrated checkpoint with FP8 KV",
    )
    g.argocd.refresh(g.app)
    obj = w.wait_phase(NAME, "Succeeded", 120)
    assert "PromotedThroughGit" in [h["reason"] for h in obj["status"]["history"]]
    g.wait_health("Healthy")
    app_status = g.argocd.application(g.app)["status"]
    assert app_status["sync"]["revision"] == revision and app_status["sourceType"] == "Kustomize"
    live = w.kube.get("Deployment", w.namespace, "llm")
    assert live is not None and FIELD_MANAGER not in {m["manager"] for m in live["metadata"]["managedFields"]}
    g.argocd.refreshed(g.app, "hard")
    assert promoted(g.baseline_args()) and condition(w.kvcal(NAME), "Promoted")["status"] == "True"
    wait_for(lambda: g.argocd.sync_and_health(g.app) == ("Synced", "Healthy"), 60, "Synced and Healthy")
