"""Issue #11 without Argo CD: the promotion is a server-side apply of kvcal's fields only, and a person who puts the
old config back (`kubectl apply` of the original manifest) is reported, then `kubectl rollout undo` restores it."""

import json
from pathlib import Path

import pytest
import yaml

from kvcal.core.manifests import FIELD_MANAGER
from tests.support.cluster import wait_for
from tests.support.gitops import (
    CALIBRATION_SUMMARY,
    VERIFICATION_SUMMARY,
    finish_job,
    kustomization,
    promoted,
    promotion_patch,
)
from tests.support.world import World, condition, start_held

pytestmark = pytest.mark.cluster
NAME = "smollm2"


def promoted_reason(w: World) -> str | None:
    obj = w.kvcal(NAME)
    found = [c for c in obj.get("status", {}).get("conditions", []) if c["type"] == "Promoted"]
    return found[0]["reason"] if found else None


def test_promotion_owns_only_its_fields_and_a_manual_revert_is_reported(world: World, tmp_path: Path) -> None:
    w = world
    model = tmp_path / "model"
    deployment = start_held(w, model, NAME, promotion={"mode": "auto"})
    finish_job(w, "calibration", CALIBRATION_SUMMARY)
    w.wait_phase(NAME, "Verifying", 60)
    finish_job(w, "verification", VERIFICATION_SUMMARY)
    w.wait_phase(NAME, "Succeeded", 120)

    live = w.kube.get("Deployment", w.namespace, "llm")
    assert live is not None and promoted(live["spec"]["template"]["spec"]["containers"][0]["args"])
    managers = {m["manager"]: m for m in live["metadata"]["managedFields"]}
    owned = json.dumps(managers[FIELD_MANAGER]["fieldsV1"])
    assert managers[FIELD_MANAGER]["operation"] == "Apply" and '"f:args"' in owned
    assert '"f:image"' not in owned and '"f:ports"' not in owned and '"f:replicas"' not in owned
    assert '"f:image"' in json.dumps(managers["kubectl-client-side-apply"]["fieldsV1"])  # still the person's

    w.cluster.kubectl("apply", "-n", w.namespace, "-f", "-", input=yaml.safe_dump(deployment))  # BF16 back
    wait_for(lambda: promoted_reason(w) == "Reverted", 30, "kvcal to report the revert")
    obj = w.kvcal(NAME)
    assert obj["status"]["phase"] == "Succeeded" and condition(obj, "Ready")["status"] == "False"
    assert "kubectl-client-side-apply" in condition(obj, "Promoted")["message"]
    wait_for(lambda: "PromotionReverted" in w.events(NAME), 30, "the PromotionReverted event")

    w.cluster.kubectl("rollout", "undo", "-n", w.namespace, "deployment/llm")  # the promoted template again
    wait_for(lambda: promoted_reason(w) == "Restored", 30, "kvcal to see the promotion restored")
    assert condition(w.kvcal(NAME), "Ready")["status"] == "True"
    assert w.events(NAME)[-1] == "PromotionRestored"


def test_promotion_patch_applied_by_its_owner_completes_the_promotion(world: World, tmp_path: Path) -> None:
    """What a Git-owned baseline does (here `kubectl apply` of the kustomized manifest stands for the sync): kvcal
    waits in AwaitingPromotion, never writes the baseline, and finishes once the baseline carries the promotion."""
    w = world
    model = tmp_path / "model"
    deployment = start_held(w, model, NAME)  # promotion.mode: manual
    finish_job(w, "calibration", CALIBRATION_SUMMARY)
    w.wait_phase(NAME, "Verifying", 60)
    finish_job(w, "verification", VERIFICATION_SUMMARY)
    obj = w.wait_phase(NAME, "AwaitingPromotion", 120)
    assert f"kvcal promotion-patch {NAME}" in obj["status"]["message"]

    # The team's folder: the Deployment and the printed patch in a kustomization, rendered by kubectl's kustomize.
    folder = tmp_path / "team"
    folder.mkdir()
    (folder / "serving.yaml").write_text(yaml.safe_dump(deployment))
    (folder / "kvcal-promotion.yaml").write_text(promotion_patch(w))
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump(kustomization({"serving.yaml": []}, "kvcal-promotion.yaml")[0])
    )
    w.apply(yaml.safe_load(w.cluster.kubectl("kustomize", str(folder)).stdout))
    obj = w.wait_phase(NAME, "Succeeded", 120)
    assert condition(obj, "Promoted")["status"] == "True"
    assert [h["reason"] for h in obj["status"]["history"]][-2:] == ["PromotedThroughGit", "Promoted"]
    live = w.kube.get("Deployment", w.namespace, "llm")
    assert live is not None and promoted(live["spec"]["template"]["spec"]["containers"][0]["args"])
    assert FIELD_MANAGER not in {m["manager"] for m in live["metadata"]["managedFields"]}  # kvcal wrote nothing
    assert w.children("Deployment", NAME) == []  # the canary is gone
