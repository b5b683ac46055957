"""Issue #10 item 6: decide never raises (every expected problem becomes a status that says what to do), and a pass
that fails anyway leaves a ReconcileError condition, a Warning event and a metric, without credentials."""

import itertools
from dataclasses import replace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kvcal.core.decide import decide
from kvcal.core.guard.redact import redact
from kvcal.core.observations import DeploymentState, Observations
from kvcal.core.phases import LIFECYCLE
from kvcal.core.spechash import spec_hash
from kvcal.core.status.conditions import get_condition
from kvcal.metrics import OperatorMetrics
from kvcal.models.status import (
    KVCalibrationStatus,
    Phase,
)
from kvcal.ports import Kind, Manifest
from kvcal.services.failures import describe_failure
from kvcal.services.reconciler import Reconciler
from tests.support.decide import NOW, POLICY, baseline, baseline_manifest, job, observations, spec, started
from tests.support.fakekube import FakeKube, kvcal

P = Phase
H = spec_hash(spec())


def zero_replicas() -> DeploymentState:
    manifest = baseline_manifest(0)
    return DeploymentState(manifest=manifest, replicas=0, observed_generation=1)


def no_containers() -> DeploymentState:
    state = baseline()
    state.manifest["spec"]["template"]["spec"]["containers"] = []
    return state


ODD_BASELINES: dict[str, Any] = {
    "absent": None,
    "zero replicas": zero_replicas(),
    "no containers": no_containers(),
    "not rolled out": baseline(ready_replicas=0, updated_replicas=0, available_replicas=0),
    "stuck": baseline(progress_deadline_exceeded=True),
}
ODD_OTHERS: dict[str, dict[str, Any]] = {
    "nothing else": {},
    "no Service": {"baseline_service": None},
    "Service without ports or selector": {"baseline_service": {"metadata": {"name": "llm"}, "spec": {}}},
    "Jobs with garbage messages": {
        "calibration_job": job("c", "Succeeded", "[1, 2"),
        "verification_job": job("v", "Succeeded", "null"),
        "serving_verification_job": job("s", "Failed", "{"),
    },
    "a canary at 0": {"canary": replace(zero_replicas(), manifest={**baseline_manifest(0)})},
}


def test_baseline_at_zero_replicas_during_deploying_says_what_to_do() -> None:
    d = decide(spec(), started(P.DEPLOYING), observations(baseline=zero_replicas()), NOW)
    assert d.status.phase == P.DEPLOYING and not d.actions
    found = get_condition(d.status.conditions, "CanaryReady")
    assert found is not None and (found.status, found.reason) == ("False", "BaselineScaledToZero")
    assert "kubectl scale deploy/llm -n llm --replicas=N" in found.message and "kvcal abort smollm2" in found.message
    assert d.status.message == found.message
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "BaselineScaledToZero")]
    again = decide(spec(), d.status, observations(baseline=zero_replicas()), NOW)
    assert not again.events and again.status == d.status  # said once, no status churn


@pytest.mark.parametrize("phase", list(Phase), ids=str)
def test_decide_never_raises_on_odd_observations(phase: Phase) -> None:
    """Every phase x every odd baseline x every odd other observation: a Decision, never an exception."""
    for (baseline_name, odd_baseline), (others_name, others) in itertools.product(
        ODD_BASELINES.items(), ODD_OTHERS.items()
    ):
        obs: Observations = observations(baseline=odd_baseline, **others)
        for spec_variant in (
            spec(),
            spec(serving={"baseline": {"deployment": "llm", "service": "llm", "container": "missing"}}),
        ):
            try:
                d = decide(spec_variant, started(phase), obs, NOW)
            except Exception as e:  # pragma: no cover - the assertion message is the point
                pytest.fail(f"{phase} with baseline {baseline_name}, {others_name}: {type(e).__name__}: {e}")
            assert d.status.phase in LIFECYCLE
            if odd_baseline is not None and odd_baseline.replicas == 0 and phase == P.DEPLOYING:
                assert "0 replicas" in (d.status.message or "")


@pytest.mark.parametrize("phase", list(Phase), ids=str)
def test_an_invalid_spec_never_raises_and_never_restarts_a_finished_run(phase: Phase) -> None:
    obs = observations(spec_error="spec.calibration.output: https://user:pw@host/x is not a storage URI")
    d = decide(None, started(phase), obs, NOW)
    assert "pw@" not in (d.status.message or "") + str(d.status.conditions)
    if phase in (P.SUCCEEDED, P.ROLLED_BACK, P.FAILED):
        found = get_condition(d.status.conditions, "SpecCurrent")
        assert d.status.phase == phase and found is not None and found.reason == "InvalidSpec"


def test_observes_covers_every_phase() -> None:
    assert set(LIFECYCLE.phases) == set(Phase)


# --- a failed pass ----------------------------------------------------------------------------------------------


class FailingKube(FakeKube):
    """The API answers 500 for Jobs (e.g. an admission webhook down), with a credential-bearing URL in the body."""

    def __init__(self, objects: list[Manifest]) -> None:
        super().__init__(objects)
        self.failing = True

    def get(self, kind: Kind, namespace: str, name: str) -> Manifest | None:
        if kind == "Job" and self.failing:
            error = ApiException(status=500, reason="Internal Server Error")
            error.body = '{"message": "webhook https://admin:s3cret@hooks.example failed, token=abc123"}'
            raise error
        return super().get(kind, namespace, name)


def test_failed_pass_becomes_condition_event_and_metric_then_recovers() -> None:
    kube = FailingKube([kvcal()])
    metrics = OperatorMetrics()
    reconciler = Reconciler(kube, clock=lambda: NOW, metrics=metrics, policy=POLICY)
    for _ in range(2):
        with pytest.raises(ApiException):
            reconciler.reconcile("llm", "smollm2")
    status = KVCalibrationStatus.model_validate(kube.objects[("KVCalibration", "smollm2")]["status"])
    found = get_condition(status.conditions, "ReconcileError")
    assert found is not None and (found.status, found.reason) == ("True", "ApiException")
    assert "500" in found.message and "webhook" in found.message
    assert "s3cret" not in found.message and "abc123" not in found.message
    assert kube.calls.count("event ReconcileError") == 1  # the same failure again: counted, not re-announced
    counted = metrics.registry.get_sample_value("kvcal_reconcile_errors_total", {"reason": "ApiException"})
    assert counted == 2.0

    kube.failing = False
    reconciler.reconcile("llm", "smollm2")
    status = KVCalibrationStatus.model_validate(kube.objects[("KVCalibration", "smollm2")]["status"])
    recovered = get_condition(status.conditions, "ReconcileError")
    assert recovered is not None and (recovered.status, recovered.reason) == ("False", "Recovered")
    assert status.phase == P.CALIBRATING


def test_redaction() -> None:
    text = "GET https://user:pa55@host/x: Authorization: Bearer abc.def token=xyz password: 'hunter2' s3://k:s@b/p"
    clean = redact(text)
    for secret in ("pa55", "abc.def", "xyz", "hunter2", "k:s"):
        assert secret not in clean
    assert "https://***@host/x" in clean and "s3://***@b/p" in clean
    assert describe_failure(ValueError("first line\nsecond")) == ("ValueError", "ValueError: first line")
