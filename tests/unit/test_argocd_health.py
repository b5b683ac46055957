"""The Argo CD health check (argocd/health.lua), executed by a real Lua runtime on status samples of every phase."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal.models.status import Phase
from tests.support.prereq import require_module

lupa = require_module("lupa", "lupa (a dev extra) runs the Lua health check")

ARGOCD = Path(__file__).resolve().parents[2] / "argocd"
HEALTH_LUA = (ARGOCD / "health.lua").read_text()
CM_KEY = "resource.customizations.health.kvcal.dev_KVCalibration"

# What Argo CD must show for each phase; a phase added to kvcal.models.status.Phase without a row here fails.
EXPECTED: dict[Phase, str] = {
    Phase.PENDING: "Progressing",
    Phase.CALIBRATING: "Progressing",
    Phase.VERIFYING: "Progressing",
    Phase.DEPLOYING: "Progressing",
    Phase.ANALYZING: "Progressing",
    Phase.PROMOTING: "Progressing",
    Phase.ROLLING_BACK: "Progressing",
    Phase.AWAITING_PROMOTION: "Suspended",
    Phase.SUCCEEDED: "Healthy",
    Phase.ROLLED_BACK: "Degraded",
    Phase.FAILED: "Degraded",
    Phase.INVALID_SPEC: "Degraded",
}


def run_health(obj: dict[str, Any]) -> dict[str, str]:
    """Run the script the way Argo CD does: `obj` is a global table, the script returns a table."""
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(HEALTH_LUA)
    return {str(k): str(v) for k, v in result.items()}


def kvcal(status: dict[str, Any] | None, generation: int = 3) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "kvcal.dev/v1alpha1",
        "kind": "KVCalibration",
        "metadata": {"name": "llama", "namespace": "serving", "generation": generation},
        "spec": {"model": {"source": "pvc://models/llama"}},
    }
    if status is not None:
        obj["status"] = status
    return obj


def test_every_phase_has_an_expected_health() -> None:
    assert set(EXPECTED) == set(Phase), f"phases without an Argo CD mapping: {set(Phase) - set(EXPECTED)}"


@pytest.mark.parametrize("phase", list(Phase), ids=str)
def test_phase_maps_to_health(phase: Phase) -> None:
    hs = run_health(kvcal({"phase": phase.value, "observedGeneration": 3, "message": "step 1 of 2"}))
    assert hs["status"] == EXPECTED[phase]
    assert hs["message"].startswith(phase.value)
    assert "step 1 of 2" in hs["message"]


def test_observed_generation_lag_is_progressing_even_when_succeeded() -> None:
    hs = run_health(kvcal({"phase": "Succeeded", "observedGeneration": 2}, generation=3))
    assert hs["status"] == "Progressing"
    assert "generation 3" in hs["message"]


def test_missing_observed_generation_is_progressing() -> None:
    assert run_health(kvcal({"phase": "Failed"}))["status"] == "Progressing"


def test_no_status_yet_is_progressing() -> None:
    hs = run_health(kvcal(None))
    assert hs["status"] == "Progressing"
    assert "operator" in hs["message"]


def test_unknown_phase_is_unknown_not_healthy() -> None:
    hs = run_health(kvcal({"phase": "Exploded", "observedGeneration": 3}))
    assert hs["status"] == "Unknown"
    assert "Exploded" in hs["message"]


def test_canary_weight_in_message() -> None:
    status = {"phase": "Analyzing", "observedGeneration": 3, "canary": {"weight": 10, "deployment": "llama-kvcal"}}
    assert "canary weight 10%" in run_health(kvcal(status))["message"]


def test_real_status_model_output_is_understood() -> None:
    """The status the operator writes (the shared pydantic model, camelCase) is what the Lua reads."""
    from kvcal.models.status import CanaryStatus, KVCalibrationStatus

    status = KVCalibrationStatus(phase=Phase.AWAITING_PROMOTION, observed_generation=3, canary=CanaryStatus(weight=50))
    hs = run_health(kvcal(status.to_wire()))
    assert hs["status"] == "Suspended"
    assert "canary weight 50%" in hs["message"]


def test_argocd_cm_snippet_embeds_the_same_lua() -> None:
    cm = yaml.safe_load((ARGOCD / "argocd-cm.yaml").read_text())
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == "argocd-cm"
    assert cm["data"][CM_KEY] == HEALTH_LUA, "argocd/argocd-cm.yaml is stale: re-embed argocd/health.lua"


def test_application_example_points_at_the_chart() -> None:
    apps = [d for d in yaml.safe_load_all((ARGOCD / "application.yaml").read_text()) if d]
    operator = next(a for a in apps if a["metadata"]["name"] == "kvcal-operator")
    assert operator["kind"] == "Application"
    chart = Path(__file__).resolve().parents[2] / operator["spec"]["source"]["path"]
    assert (chart / "values.yaml").is_file()


def test_failing_reconciles_and_unverified_serving_are_degraded() -> None:
    """Issue #10: problems show where users look, Argo CD included."""
    from kvcal.core.status.conditions import set_condition
    from kvcal.models.status import KVCalibrationStatus
    from tests.support.decide import NOW

    def succeeded(type_: str, state: str, message: str) -> dict[str, Any]:
        conditions = set_condition([], type_, state, "R", message, NOW, 3)  # type: ignore[arg-type]
        status = KVCalibrationStatus(phase=Phase.SUCCEEDED, observed_generation=3, conditions=conditions)
        return kvcal(status.to_wire())

    failing = run_health(succeeded("ReconcileError", "True", "Kubernetes API error 422"))
    assert failing["status"] == "Degraded" and "422" in failing["message"]
    unverified = run_health(succeeded("ServingVerified", "False", "v0.33.0 does not serve the calibrated scales"))
    assert unverified["status"] == "Degraded" and "v0.33.0" in unverified["message"]
    changed = run_health(succeeded("SpecCurrent", "False", "run `kvcal recalibrate llama`"))
    assert changed["status"] == "Healthy" and "kvcal recalibrate" in changed["message"]
    recovered = run_health(succeeded("ReconcileError", "False", "the last pass succeeded"))
    assert recovered["status"] == "Healthy"


def test_a_reverted_promotion_is_degraded() -> None:
    """Issue #11: Succeeded with Promoted=False (a sync or a person put BF16 back) is Degraded, not Healthy."""
    from kvcal.core.status.conditions import set_condition
    from kvcal.models.status import KVCalibrationStatus
    from tests.support.decide import NOW

    conditions = set_condition([], "Promoted", "False", "Reverted", "changed by argocd-controller", NOW, 3)
    status = KVCalibrationStatus(phase=Phase.SUCCEEDED, observed_generation=3, conditions=conditions)
    hs = run_health(kvcal(status.to_wire()))
    assert hs["status"] == "Degraded" and "argocd-controller" in hs["message"]
    rolled_back = KVCalibrationStatus(phase=Phase.ROLLED_BACK, observed_generation=3, conditions=conditions)
    assert run_health(kvcal(rolled_back.to_wire()))["status"] == "Degraded"
