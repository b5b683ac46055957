"""Issue #11: a promotion that a sync or a person reverts is reported (core.rollout.reverts), not Succeeded forever."""

import copy
from dataclasses import replace
from typing import Any

from kvcal.core.decide import decide
from kvcal.core.manifests import calibration_job_name
from kvcal.core.manifests.canary import PROMOTED_ANNOTATION
from kvcal.core.observations import DeploymentState
from kvcal.core.rollout.reverts import args_managers, is_reverted
from kvcal.core.spechash import spec_hash
from kvcal.core.status.conditions import get_condition
from kvcal.models.status import CalibrationStatus, KVCalibrationStatus, Phase
from tests.support.decide import NOW, OWNER, baseline, baseline_manifest, observations, spec

H = spec_hash(spec())
ARGS_PATH = {"f:spec": {"f:template": {"f:spec": {"f:containers": {'k:{"name":"vllm"}': {"f:args": {}}}}}}}


def succeeded() -> KVCalibrationStatus:
    calibration = CalibrationStatus(
        job=calibration_job_name(OWNER.name, H), spec_hash=H, artifact="pvc://models/smollm2-fp8kv"
    )
    return KVCalibrationStatus(phase=Phase.SUCCEEDED, calibration=calibration)


def reverted_baseline(manager: str = "argocd-controller") -> DeploymentState:
    """What Argo CD's self-heal leaves: its own template back (args owned by it again), kvcal's marker kept."""
    promoted = baseline(promoted=True)
    manifest = baseline_manifest()
    manifest["metadata"]["annotations"] = copy.deepcopy(promoted.manifest["metadata"]["annotations"])
    manifest["metadata"]["managedFields"] = [
        {"manager": "kvcal", "operation": "Apply", "fieldsV1": {"f:metadata": {}}},
        {"manager": manager, "operation": "Update", "fieldsV1": ARGS_PATH},
    ]
    return replace(promoted, manifest=manifest)


def promoted_condition(status: KVCalibrationStatus) -> tuple[str, str, str]:
    found = get_condition(status.conditions, "Promoted")
    assert found is not None
    return found.status, found.reason, found.message


def test_a_promotion_in_place_stays_quiet() -> None:
    d = decide(spec(), succeeded(), observations(baseline=baseline(promoted=True)), NOW)
    assert not d.events and not is_reverted(d.status)
    assert get_condition(d.status.conditions, "Ready").status == "True"  # type: ignore[union-attr]


def test_a_reverted_promotion_is_reported_once_and_a_restored_one_clears() -> None:
    d = decide(spec(), succeeded(), observations(baseline=reverted_baseline()), NOW)
    assert d.status.phase == Phase.SUCCEEDED
    state, reason, message = promoted_condition(d.status)
    assert (state, reason) == ("False", "Reverted") and is_reverted(d.status)
    assert "argocd-controller (Update)" in message and "/kvcal/pvc/models/smollm2-fp8kv" in message
    assert "managedFieldsManagers [kvcal]" in message and f"kvcal recalibrate {OWNER.name}" in message
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "PromotionReverted")]
    assert get_condition(d.status.conditions, "Ready").status == "False"  # type: ignore[union-attr]
    assert d.status.message == message
    assert d.requeue_after is not None and not d.actions  # kvcal does not fight the sync

    again = decide(spec(), d.status, observations(baseline=reverted_baseline()), NOW)
    assert not again.events and is_reverted(again.status)  # said once

    restored = decide(spec(), again.status, observations(baseline=baseline(promoted=True)), NOW)
    assert promoted_condition(restored.status)[:2] == ("True", "Restored") and not is_reverted(restored.status)
    assert [(e.type, e.reason) for e in restored.events] == [("Normal", "PromotionRestored")]
    assert get_condition(restored.status.conditions, "Ready").status == "True"  # type: ignore[union-attr]


def test_kv_cache_back_to_auto_is_a_revert() -> None:
    edited = baseline(promoted=True)
    container = edited.manifest["spec"]["template"]["spec"]["containers"][0]
    container["args"] = [*container["args"], "--kv-cache-dtype", "auto"]  # the last occurrence wins in vLLM
    d = decide(spec(), succeeded(), observations(baseline=edited), NOW)
    assert is_reverted(d.status)


def test_another_calibrations_promotion_is_not_a_revert() -> None:
    other = reverted_baseline()
    other.manifest["metadata"]["annotations"][PROMOTED_ANNOTATION] = "llm/other@12345678"
    d = decide(spec(), succeeded(), observations(baseline=other), NOW)
    assert not is_reverted(d.status) and not d.events


def test_args_managers_name_who_owns_the_args_now() -> None:
    manifest: dict[str, Any] = reverted_baseline("kubectl-rollout").manifest
    assert args_managers(manifest, "vllm") == ["kubectl-rollout (Update)"]
    assert args_managers(manifest, "sidecar") == []


def test_the_reverted_metric_is_one_while_reverted_and_gone_after() -> None:
    from kvcal.metrics import OperatorMetrics

    metrics = OperatorMetrics()
    labels = {"namespace": "llm", "name": "smollm2"}
    metrics.set_reverted("llm", "smollm2", True)
    assert metrics.registry.get_sample_value("kvcal_promotion_reverted", labels) == 1.0
    metrics.set_reverted("llm", "smollm2", False)
    assert metrics.registry.get_sample_value("kvcal_promotion_reverted", labels) is None
    metrics.set_reverted("llm", "smollm2", True)
    metrics.set_phase("llm", "smollm2", None)  # deleted
    assert metrics.registry.get_sample_value("kvcal_promotion_reverted", labels) is None
