"""Unit tests of `kvcal status` rendering and the gateway-api weight rewrite (pure functions)."""

from typing import Any

import pytest

from kvcal.adapters.router import weighted_rules
from kvcal.core.decide import decide
from kvcal.core.phases import LIFECYCLE
from kvcal.core.spechash import spec_hash
from kvcal.ctl import ANNOTATIONS, render_status
from kvcal.models.status import CalibrationStatus, KVCalibrationStatus, Phase
from tests.support.decide import NOW, observations
from tests.support.decide import spec as make_spec

OBJ: dict[str, Any] = {
    "metadata": {"name": "llama", "namespace": "prod", "generation": 3},
    "spec": {"serving": {"traffic": {"router": "replicas", "steps": [10, 50]}}, "analysis": {"failureLimit": 2}},
    "status": {
        "phase": "Analyzing",
        "observedGeneration": 3,
        "conditions": [
            {"type": "Calibrated", "status": "True", "reason": "JobSucceeded", "lastTransitionTime": "t"},
            {"type": "CanaryReady", "status": "True", "reason": "Ready", "lastTransitionTime": "t"},
        ],
        "canary": {"deployment": "llama-kvcal-canary", "weight": 10, "stepIndex": 0, "readyReplicas": 1},
        "analysis": {
            "consecutiveSuccesses": 1,
            "failures": 1,
            "ttftP95Delta": "+12.0%",
            "measurements": [
                {"metric": "ttft-p95", "phase": "Successful", "at": "a", "baseline": 0.2, "canary": 0.21},
                {"metric": "ttft-p95", "phase": "Failed", "at": "b", "baseline": 0.2, "canary": 0.224,
                 "threshold": 0.22, "message": "canary 224.0ms vs baseline 200.0ms (+12.0%) > limit 220.0ms"},
                {"metric": "errorRate", "phase": "Successful", "at": "b", "baseline": 0.0, "canary": 0.002},
                {"metric": "accuracy", "phase": "Successful", "at": "c", "baseline": 1.0, "canary": 1.0},
            ],
        },
    },
}  # fmt: skip


def test_status_tree_shows_phase_steps_weights_and_the_last_interval() -> None:
    text = render_status(OBJ)
    lines = text.splitlines()
    assert lines[0] == "KVCalibration prod/llama (generation 3, observed 3)"
    assert "├─ Phase: Analyzing" in text
    assert "router: replicas, steps: 10%, 50%, step 1/2, weight now 10%" in text
    assert "failed: 1 (tolerates 2)" in text and "TTFT p95 delta: +12.0%" in text
    last = text[text.index("Last measurements") :]
    assert "ttft-p95        Failed       baseline   200.0ms  canary   224.0ms  limit 220.0ms" in last
    assert "errorRate" in last and "0.20%" in last and "accuracy" in last
    assert last.count("ttft-p95") == 1  # only the newest interval
    assert lines[-1].startswith("   └─ ") or lines[-1].startswith("└─ ")


def test_status_tree_of_a_fresh_object() -> None:
    text = render_status({"metadata": {"name": "x", "namespace": "d"}, "spec": {}})
    assert "Phase: Pending" in text and "Last measurements" not in text


RULES: list[dict[str, Any]] = [
    {"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}], "backendRefs": [{"name": "llama", "port": 8000}]},
    {"backendRefs": [{"name": "other", "port": 80}]},
]


def test_weighted_rules_adds_and_removes_the_canary_backend() -> None:
    ten = weighted_rules(RULES, "llama", "llama-kvcal-canary", 10)
    assert ten[0]["backendRefs"] == [
        {"name": "llama", "port": 8000, "weight": 90},
        {"name": "llama-kvcal-canary", "port": 8000, "weight": 10},
    ]
    assert ten[1] == RULES[1] and RULES[0]["backendRefs"] == [{"name": "llama", "port": 8000}]  # input untouched
    fifty = weighted_rules(ten, "llama", "llama-kvcal-canary", 50)
    assert [r["weight"] for r in fifty[0]["backendRefs"]] == [50, 50]
    assert weighted_rules(fifty, "llama", "llama-kvcal-canary", 0) == RULES


@pytest.mark.parametrize(
    ("service", "weight", "error"), [("nope", 10, "no rule with a backendRef"), ("llama", 101, "percentage in")]
)
def test_weighted_rules_rejects_bad_input(service: str, weight: int, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        weighted_rules(RULES, service, "c", weight)


@pytest.mark.parametrize("phase", list(Phase))
@pytest.mark.parametrize(("action", "ignored"), [("abort", "AbortIgnored"), ("retry", "RetryIgnored")])
def test_ctl_says_the_operator_acts_exactly_where_decide_does(phase: Phase, action: str, ignored: str) -> None:
    """`kvcal abort|retry` warns when the phase will not act on it; decide() is what acts."""
    spec = make_spec()
    start = KVCalibrationStatus(phase=phase, calibration=CalibrationStatus(job="j", spec_hash=spec_hash(spec)))
    decision = decide(spec, start, observations(gates={ANNOTATIONS[action]: "now"}), NOW)
    warned = ignored in [event.reason for event in decision.events]
    # An abort seen in RollingBack is its own effect seen again after a restart: cleared without a warning.
    rolling_back_again = action == "abort" and phase == Phase.ROLLING_BACK
    assert warned == (phase not in LIFECYCLE.acts_on(action) and not rolling_back_again)
