"""decide(): every phase transition (table-driven), the illegal ones, gates, spec changes, conditions, requeue."""

import itertools
import json
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from kvcal.core.decide import decide, measurement_due, next_measurement_at
from kvcal.core.manifests import calibration_job_name
from kvcal.core.observations import (
    ABORT_ANNOTATION,
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    Apply,
    ApplyOwnedFields,
    Create,
    Decision,
    Delete,
    Observations,
    SetWeight,
)
from kvcal.core.phases import LIFECYCLE, IllegalTransition
from kvcal.core.spechash import spec_hash
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import (
    AnalysisStatus,
    CalibrationStatus,
    KVCalibrationStatus,
    Phase,
    VerificationStatus,
)
from kvcal.services.observe import parse_spec
from tests.support.decide import (
    ANALYZING,
    CALIB,
    CANARY,
    NOW,
    OWNER,
    SUMMARY,
    VERIFY,
    H,
    P,
    baseline,
    canary,
    job,
    m,
    observations,
    spec,
    status,
)
from tests.support.decide import SPEC as SPEC_DICT
from tests.support.decide import SPEC_MODEL as SPEC

VERIFIED = json.dumps({"ok": True, "layers": 30, "mismatches": 0, "problems": []})
MISMATCH = json.dumps({"ok": False, "layers": 30, "mismatches": 2, "problems": ["layer 3 k_scale 1.0 != 0.41"]})
UNDECIDED = m("Undecided").model_copy(update={"exhausted": True, "message": "undecided: 10 looks ..."})


@dataclass
class Case:
    name: str
    start: KVCalibrationStatus
    obs: dict[str, Any]
    phase: Phase
    actions: list[str]  # "Kind/Action name" summaries, in order
    events: list[str] = field(default_factory=list)
    spec: KVCalibrationSpec = SPEC


def summarize(d: Decision) -> list[str]:
    out = [f"Clear {key}" for key in d.cleared_annotations]
    for a in d.actions:
        match a:
            case Create(manifest=mf) | Apply(manifest=mf) | ApplyOwnedFields(manifest=mf):
                out.append(f"{type(a).__name__} {mf['kind']}/{mf['metadata']['name']}")
            case Delete(kind=k, name=n):
                out.append(f"{type(a).__name__} {k}/{n}")
            case SetWeight(weight=w):
                out.append(f"SetWeight {w}")
    return out


CASES = [
    Case(
        "pending creates the job",
        status(P.PENDING),
        {},
        P.CALIBRATING,
        [f"Create ConfigMap/{CALIB}", f"Create Job/{CALIB}"],
        ["CalibrationStarted"],
    ),
    Case(
        "pending adopts a job created before a restart",
        status(P.PENDING),
        {"calibration_job": job(CALIB)},
        P.CALIBRATING,
        [],
        ["CalibrationStarted"],
    ),
    Case(
        "pending waits for a job being deleted",
        status(P.PENDING),
        {"calibration_job": job(CALIB, deleting=True)},
        P.PENDING,
        [],
    ),
    Case("calibrating waits", status(P.CALIBRATING), {"calibration_job": job(CALIB)}, P.CALIBRATING, []),
    Case(
        "calibrating re-creates a vanished job",
        status(P.CALIBRATING),
        {},
        P.CALIBRATING,
        [f"Create ConfigMap/{CALIB}", f"Create Job/{CALIB}"],
    ),
    Case(
        "calibration job fails",
        status(P.CALIBRATING),
        {"calibration_job": job(CALIB, "Failed", "dataset: no such file /kvcal/x.jsonl", "BackoffLimitExceeded")},
        P.FAILED,
        [],
        ["CalibrationFailed"],
    ),
    Case(
        "calibration job hits its deadline",
        status(P.CALIBRATING),
        {"calibration_job": job(CALIB, "Failed", "Job was active longer than specified deadline", "DeadlineExceeded")},
        P.FAILED,
        [],
        ["CalibrationFailed"],
    ),
    Case(
        "calibration succeeds: verifying",
        status(P.CALIBRATING),
        {"calibration_job": job(CALIB, "Succeeded", SUMMARY)},
        P.VERIFYING,
        [],
        ["Calibrated"],
    ),
    Case("verifying creates its job", status(P.VERIFYING), {}, P.VERIFYING, [f"Create Job/{VERIFY}"]),
    Case(
        "calibration summary unreadable",
        status(P.CALIBRATING),
        {"calibration_job": job(CALIB, "Succeeded", "Traceback ...")},
        P.FAILED,
        [],
        ["CalibrationFailed"],
    ),
    Case("verifying waits for the baseline", status(P.VERIFYING), {"baseline": None}, P.VERIFYING, []),
    Case("verifying waits for its job", status(P.VERIFYING), {"verification_job": job(VERIFY)}, P.VERIFYING, []),
    Case(
        "verification passes: deploying",
        status(P.VERIFYING),
        {"verification_job": job(VERIFY, "Succeeded", VERIFIED)},
        P.DEPLOYING,
        [],
        ["ScalesVerified"],
    ),
    Case(
        "deploying creates the canary",
        status(P.DEPLOYING),
        {},
        P.DEPLOYING,
        [f"Apply Deployment/{CANARY}", f"Apply Service/{CANARY}"],
    ),
    Case(
        "verification mismatch: failed, no canary",
        status(P.VERIFYING),
        {"verification_job": job(VERIFY, "Succeeded", MISMATCH)},
        P.FAILED,
        [],
        ["ScalesMismatch"],
    ),
    Case(
        "verification job fails",
        status(P.VERIFYING),
        {"verification_job": job(VERIFY, "Failed", MISMATCH, "BackoffLimitExceeded")},
        P.FAILED,
        [],
        ["ScalesMismatch"],
    ),
    Case("deploying waits for ready pods", status(P.DEPLOYING), {"canary": canary(ready=1)}, P.DEPLOYING, []),
    Case(
        "deploying scales a canary of the wrong size",
        status(P.DEPLOYING),
        {"canary": canary(replicas=1, ready=1)},
        P.DEPLOYING,
        [f"Apply Deployment/{CANARY}", f"Apply Service/{CANARY}"],
    ),
    Case(
        "canary ready: analysis starts",
        status(P.DEPLOYING),
        {"canary": canary()},
        P.ANALYZING,
        ["SetWeight 50"],
        ["CanaryReady"],
    ),
    Case(
        "canary never ready: roll back",
        status(P.DEPLOYING),
        {"canary": canary(ready=0, progress_deadline_exceeded=True)},
        P.ROLLING_BACK,
        ["SetWeight 0", f"Delete Deployment/{CANARY}", f"Delete Service/{CANARY}"],
        ["CanaryNotReady"],
    ),
    Case(
        "analysis running re-asserts the weight",
        ANALYZING,
        {"canary": canary(), "measurements": (m("Successful"),)},
        P.ANALYZING,
        ["SetWeight 50"],
    ),
    Case(
        "analysis fails: roll back",
        ANALYZING.model_copy(update={"analysis": AnalysisStatus(started_at="2026-01-02T03:00:00Z", failures=1)}),
        {"canary": canary(), "measurements": (m("Failed"),)},
        P.ROLLING_BACK,
        ["SetWeight 0", f"Delete Deployment/{CANARY}", f"Delete Service/{CANARY}"],
        ["AnalysisFailed"],
    ),
    Case(
        "analysis undecided after its last look: pause for a person",
        ANALYZING,
        {"canary": canary(), "measurements": (UNDECIDED,)},
        P.AWAITING_PROMOTION,
        [],
        ["AnalysisUndecided"],
    ),
    Case(
        "analysis undecided, onUndecided rollback: roll back, never as slower",
        ANALYZING,
        {"canary": canary(), "measurements": (UNDECIDED,)},
        P.ROLLING_BACK,
        ["SetWeight 0", f"Delete Deployment/{CANARY}", f"Delete Service/{CANARY}"],
        ["AnalysisUndecided"],
        spec(analysis={"onUndecided": "rollback"}),
    ),
    Case(
        "analysis passes: promote",
        ANALYZING.model_copy(
            update={"analysis": AnalysisStatus(started_at="2026-01-02T03:00:00Z", consecutive_successes=1)}
        ),
        {"canary": canary(), "measurements": (m("Successful"),)},
        P.PROMOTING,
        ["SetWeight 50", "ApplyOwnedFields Deployment/llm"],
        ["Promoting"],
    ),
    Case(
        "analysis passes, manual mode: wait for a person",
        ANALYZING.model_copy(
            update={"analysis": AnalysisStatus(started_at="2026-01-02T03:00:00Z", consecutive_successes=1)}
        ),
        {"canary": canary(), "measurements": (m("Successful"),)},
        P.AWAITING_PROMOTION,
        ["SetWeight 50"],
        ["AwaitingPromotion"],
        spec(promotion={"mode": "manual"}),
    ),
    Case(
        "first step passes: next step",
        ANALYZING.model_copy(
            update={"analysis": AnalysisStatus(started_at="2026-01-02T03:00:00Z", consecutive_successes=1)}
        ),
        {"canary": canary(replicas=1, ready=1), "measurements": (m("Successful"),), "baseline": baseline(4)},
        P.DEPLOYING,
        ["SetWeight 50"],
        ["StepPassed"],
        spec(serving={"baseline": {"deployment": "llm", "service": "llm"}, "traffic": {"steps": [20, 50]}}),
    ),
    Case("canary deleted during analysis", ANALYZING, {}, P.DEPLOYING, [], ["CanaryMissing"]),
    Case("awaiting promotion", status(P.AWAITING_PROMOTION), {"canary": canary()}, P.AWAITING_PROMOTION, []),
    Case(
        "promotion committed to Git (kvcal promotion-patch): kvcal does not write the baseline",
        status(P.AWAITING_PROMOTION),
        {"canary": canary(), "baseline": baseline(updated_replicas=1, promoted=True)},
        P.PROMOTING,
        [],
        ["PromotedThroughGit"],
    ),
    Case(
        "kvcal promote",
        status(P.AWAITING_PROMOTION),
        {"canary": canary(), "gates": {PROMOTE_ANNOTATION: "1"}},
        P.PROMOTING,
        [f"Clear {PROMOTE_ANNOTATION}", "ApplyOwnedFields Deployment/llm"],
        ["Promoting"],
    ),
    Case(
        "promoting waits for the rollout",
        status(P.PROMOTING),
        {"canary": canary(), "baseline": baseline(updated_replicas=1, promoted=True)},
        P.PROMOTING,
        [],
    ),
    Case(
        "promoting done: remove the canary",
        status(P.PROMOTING),
        {"canary": canary(), "baseline": baseline(promoted=True)},
        P.SUCCEEDED,
        ["SetWeight 0", f"Delete Deployment/{CANARY}", f"Delete Service/{CANARY}"],
        ["Promoted"],
    ),
    Case("baseline gone while promoting", status(P.PROMOTING), {"baseline": None}, P.FAILED, [], ["PromotionFailed"]),
    Case(
        "baseline stuck while promoting",
        status(P.PROMOTING),
        {"baseline": baseline(updated_replicas=1, progress_deadline_exceeded=True, promoted=True)},
        P.FAILED,
        [],
        ["PromotionFailed"],
    ),
    Case(
        "rolling back waits for the canary to go",
        status(P.ROLLING_BACK),
        {"canary": canary()},
        P.ROLLING_BACK,
        ["SetWeight 0", f"Delete Deployment/{CANARY}", f"Delete Service/{CANARY}"],
    ),
    Case(
        "rolled back",
        status(P.ROLLING_BACK),
        {},
        P.ROLLED_BACK,
        ["SetWeight 0", f"Delete Deployment/{CANARY}", f"Delete Service/{CANARY}"],
        ["RolledBack"],
    ),
    Case(
        "kvcal abort while analyzing",
        ANALYZING,
        {"canary": canary(), "gates": {ABORT_ANNOTATION: "1"}},
        P.ROLLING_BACK,
        [f"Clear {ABORT_ANNOTATION}", "SetWeight 0"],  # off the canary at once; RollingBack reads it back
        ["Aborted"],
    ),
    Case(
        "kvcal abort while calibrating",
        status(P.CALIBRATING),
        {"calibration_job": job(CALIB), "gates": {ABORT_ANNOTATION: "1"}},
        P.ROLLING_BACK,
        [f"Clear {ABORT_ANNOTATION}"],
        ["Aborted"],
    ),
    Case(
        "rolling back stops a running job",
        status(P.ROLLING_BACK),
        {"calibration_job": job(CALIB)},
        P.ROLLED_BACK,
        [f"Delete Job/{CALIB}", "SetWeight 0", f"Delete Deployment/{CANARY}", f"Delete Service/{CANARY}"],
        ["RolledBack"],
    ),
    Case(
        "abort after success is ignored",
        status(P.SUCCEEDED),
        {"gates": {ABORT_ANNOTATION: "1"}, "baseline": baseline(promoted=True)},
        P.SUCCEEDED,
        [f"Clear {ABORT_ANNOTATION}"],
        ["AbortIgnored"],
    ),
    Case(
        "promote before analysis is ignored",
        status(P.CALIBRATING),
        {"calibration_job": job(CALIB), "gates": {PROMOTE_ANNOTATION: "1"}},
        P.CALIBRATING,
        [f"Clear {PROMOTE_ANNOTATION}"],
        ["PromoteIgnored"],
    ),
    Case(
        "kvcal retry after a rollback re-runs the analysis",
        status(P.ROLLED_BACK, verification=VerificationStatus(job=VERIFY, mismatches=0)),
        {"gates": {RETRY_ANNOTATION: "1"}},
        P.DEPLOYING,
        [f"Clear {RETRY_ANNOTATION}"],
        ["Retry"],
    ),
    Case(
        "kvcal retry after an abort during calibration recalibrates",
        status(P.ROLLED_BACK),
        {"gates": {RETRY_ANNOTATION: "1"}},
        P.PENDING,
        [f"Clear {RETRY_ANNOTATION}", f"Delete Job/{CALIB}", f"Delete ConfigMap/{CALIB}"],
        ["Retry"],
    ),
    Case(
        "kvcal retry after a failed calibration recalibrates",
        status(P.FAILED),
        {"gates": {RETRY_ANNOTATION: "1"}},
        P.PENDING,
        [f"Clear {RETRY_ANNOTATION}", f"Delete Job/{CALIB}", f"Delete ConfigMap/{CALIB}"],
        ["Retry"],
    ),
    Case(
        "retry while running is ignored",
        status(P.CALIBRATING),
        {"calibration_job": job(CALIB), "gates": {RETRY_ANNOTATION: "1"}},
        P.CALIBRATING,
        [f"Clear {RETRY_ANNOTATION}"],
        ["RetryIgnored"],
    ),
    Case("terminal phases stay", status(P.SUCCEEDED), {"baseline": baseline(promoted=True)}, P.SUCCEEDED, []),
]


OBSERVED_FIELDS = ("calibration_job", "verification_job", "canary", "baseline", "baseline_service")


def observed(start: Phase, **fields: Any) -> Observations:
    """What the reconciler passes in phase `start`: the fields the descriptor names; the others None."""
    obs = observations(**fields)
    unread: dict[str, Any] = dict.fromkeys(f for f in OBSERVED_FIELDS if f not in LIFECYCLE.observes(start))
    return replace(obs, **unread)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_transition(case: Case) -> None:
    for f in case.obs:
        assert f in ("gates", "measurements") or f in LIFECYCLE.observes(case.start.phase), (
            f"{f} is not read in {case.start.phase}"
        )
    d = decide(case.spec, case.start, observed(case.start.phase, **case.obs), NOW)
    assert d.status.phase == case.phase, d.status.message
    assert summarize(d) == case.actions
    assert [e.reason for e in d.events] == case.events
    assert d.status.observed_generation == 1
    if case.phase != case.start.phase:
        assert d.status.history[-1].phase == case.phase
        assert d.requeue_after == 0.0
    ready = next(c for c in d.status.conditions if c.type == "Ready")
    assert (ready.status == "True") == (case.phase == P.SUCCEEDED)


def test_every_phase_has_cases() -> None:
    covered = {c.start.phase for c in CASES} | {c.phase for c in CASES}
    assert covered >= set(Phase) - {P.INVALID_SPEC}


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(Phase, Phase)), ids=lambda p: str(p))
def test_transition_table(src: Phase, dst: Phase) -> None:
    if src == dst or dst in LIFECYCLE[src].next:
        LIFECYCLE.check_transition(src, dst)
    else:
        with pytest.raises(IllegalTransition, match=f"{src} -> {dst}"):
            LIFECYCLE.check_transition(src, dst)


def test_promotion_never_rolls_back() -> None:
    assert P.ROLLING_BACK not in LIFECYCLE[P.PROMOTING].next
    d = decide(SPEC, status(P.PROMOTING), observations(gates={ABORT_ANNOTATION: "1"}), NOW)
    assert d.status.phase == P.PROMOTING
    assert [e.reason for e in d.events] == ["AbortIgnored"]


def test_calibration_summary_copied_into_status() -> None:
    d = decide(SPEC, status(P.CALIBRATING), observations(calibration_job=job(CALIB, "Succeeded", SUMMARY)), NOW)
    c = d.status.calibration
    assert (c.samples, c.tokens, c.k_scale_max, c.v_scale_max) == (64, 30712, 0.41, 0.07)
    assert c.holdout_clip_rate_default is not None and c.holdout_clip_rate_default.k == 0.012
    assert (c.top1_agreement_default, c.top1_agreement_calibrated) == (0.906, 0.981)
    assert c.artifact == "pvc://models/smollm2-fp8kv" and c.spec_hash == H and c.job == CALIB
    assert (c.model_hash, c.model_revision) == ("9f2c" * 16, "abc123")
    assert (c.device, c.placement, c.dtype) == ("cuda:0,cuda:1", "several-devices", "bfloat16")
    assert (c.peak_device_memory_bytes, c.tokens_per_second) == (71_000_000_000, 41250.5)
    calibrated = next(x for x in d.status.conditions if x.type == "Calibrated")
    assert (calibrated.status, calibrated.reason) == ("True", "JobSucceeded")


def test_failed_job_message_in_status_and_condition() -> None:
    message = "ValueError: spec.calibration.dataset: /kvcal/configmap/calib/prompts.jsonl has 0 samples"
    obs = observations(calibration_job=job(CALIB, "Failed", message, "BackoffLimitExceeded"))
    d = decide(SPEC, status(P.CALIBRATING), obs, NOW)
    assert message in (d.status.message or "")
    assert d.status.calibration.message == message
    calibrated = next(x for x in d.status.conditions if x.type == "Calibrated")
    assert (calibrated.status, calibrated.reason, calibrated.message) == ("False", "BackoffLimitExceeded", message)
    assert d.events[0].type == "Warning"


def test_verification_mismatch_never_creates_a_canary() -> None:
    d = decide(SPEC, status(P.VERIFYING), observations(verification_job=job(VERIFY, "Succeeded", MISMATCH)), NOW)
    assert not any(isinstance(a, Apply | Create) for a in d.actions)
    assert d.status.verification.mismatches == 2
    assert "layer 3 k_scale" in (d.status.message or "")
    again = decide(SPEC, d.status, observations(verification_job=job(VERIFY, "Succeeded", MISMATCH)), NOW)
    assert again.actions == () and again.status == d.status and again.requeue_after is None


def test_threshold_change_does_not_recalibrate() -> None:
    changed = spec(analysis={"failureLimit": 5, "successfulIntervals": 9, "interval": "10s"})
    assert spec_hash(changed) == H
    d = decide(changed, status(P.SUCCEEDED), observations(generation=7), NOW)
    assert d.status.phase == P.SUCCEEDED and d.actions == () and d.status.observed_generation == 7


def test_scheduling_change_does_not_recalibrate() -> None:
    job_spec = {**spec().calibration.job.to_wire(), "backoffLimit": 3, "nodeSelector": {"gpu": "a100"}}
    changed = spec(calibration={**SPEC_DICT["calibration"], "job": job_spec})
    assert spec_hash(changed) == H


@pytest.mark.parametrize(
    "change",
    [
        {"model": {"source": "pvc://models/smollm2", "revision": "def456"}},
        {"calibration": {**spec().calibration.to_wire(), "dataset": {"source": "configmap://calib/other.jsonl"}}},
        {"calibration": {**spec().calibration.to_wire(), "samples": 128}},
        {"calibration": {**spec().calibration.to_wire(), "observer": "mse"}},
    ],
    ids=["revision", "dataset", "samples", "observer"],
)
def test_calibration_input_change_recalibrates(change: dict[str, Any]) -> None:
    changed = KVCalibrationSpec.model_validate({**SPEC_DICT, **change})
    new_hash = spec_hash(changed)
    assert new_hash != H
    d = decide(changed, ANALYZING, observations(canary=canary(), generation=2), NOW)
    assert d.status.phase == P.PENDING
    assert summarize(d) == [
        "SetWeight 0",
        f"Delete Deployment/{CANARY}",
        f"Delete Service/{CANARY}",
        f"Delete Job/{CALIB}",
        f"Delete Job/{VERIFY}",
        f"Delete ConfigMap/{CALIB}",
    ]
    assert d.status.calibration == CalibrationStatus()
    nxt = decide(changed, d.status, observations(generation=2), NOW)
    assert nxt.status.phase == P.CALIBRATING
    assert nxt.status.calibration.job == calibration_job_name(OWNER.name, new_hash) != CALIB


def test_invalid_spec_and_back() -> None:
    obs = observations(spec_error="spec.calibration.samples: Input should be a valid integer")
    d = decide(None, status(P.PENDING), obs, NOW)
    assert d.status.phase == P.INVALID_SPEC and "samples" in (d.status.message or "")
    assert d.events[0].type == "Warning"
    fixed = decide(SPEC, d.status, observations(), NOW)
    assert [h.phase for h in fixed.status.history] == [P.INVALID_SPEC, P.PENDING]


def test_bad_storage_uri_is_an_invalid_spec() -> None:
    # The model rejects the URI as the CRD does; the reconciler hands decide() the error instead of a spec.
    bad, error = parse_spec({"spec": {**SPEC_DICT, "calibration": {**SPEC_DICT["calibration"], "output": "nfs://x/y"}}})
    assert bad is None
    d = decide(bad, status(P.PENDING), observations(spec_error=error), NOW)
    assert d.status.phase == P.INVALID_SPEC
    assert "spec.calibration.output" in (d.status.message or "") and "pvc://" in (d.status.message or "")


def test_condition_transition_time_only_moves_on_status_change() -> None:
    first = decide(SPEC, status(P.CALIBRATING), observations(calibration_job=job(CALIB)), NOW)
    later = NOW.replace(minute=30)
    second = decide(SPEC, first.status, observations(calibration_job=job(CALIB)), later)
    assert second.status == first.status  # nothing changed: no write
    done = decide(SPEC, second.status, observations(calibration_job=job(CALIB, "Succeeded", SUMMARY)), later)
    times = {c.type: c.last_transition_time for c in done.status.conditions}
    assert times["Calibrated"] == "2026-01-02T03:30:05Z"
    assert times["Promoted"] == "2026-01-02T03:04:05Z"


def test_steady_state_is_quiet() -> None:
    """Re-deciding on the status decide wrote, with the same observations, changes nothing and says nothing."""
    d = decide(SPEC, status(P.DEPLOYING), observations(canary=canary(ready=1)), NOW)
    again = decide(SPEC, d.status, observations(canary=canary(ready=1)), NOW)
    assert again.status == d.status and again.events == () and again.actions == ()


def test_history_is_capped() -> None:
    s = status(P.CALIBRATING)
    for _ in range(30):
        s = decide(SPEC, s, observations(calibration_job=job(CALIB, "Succeeded", SUMMARY)), NOW).status
        s = s.model_copy(update={"phase": P.CALIBRATING})
    assert len(s.history) == 20


def test_measurement_schedule() -> None:
    analysis = spec(analysis={"warmup": "60s", "interval": "30s"}).analysis
    started = ANALYZING.model_copy(update={"analysis": AnalysisStatus(started_at="2026-01-02T03:04:00Z")})
    assert next_measurement_at(analysis, started.analysis) == NOW.replace(minute=5, second=0)
    assert not measurement_due(analysis, started, NOW)
    assert measurement_due(analysis, started, NOW.replace(minute=5))
    measured = started.model_copy(
        update={"analysis": AnalysisStatus(started_at="2026-01-02T03:04:00Z", last_measured_at="2026-01-02T03:05:00Z")}
    )
    assert not measurement_due(analysis, measured, NOW.replace(minute=5, second=29))
    assert measurement_due(analysis, measured, NOW.replace(minute=5, second=30))
    assert not measurement_due(analysis, measured.model_copy(update={"phase": P.PROMOTING}), NOW.replace(minute=9))


def test_analysis_requeues_at_the_next_interval() -> None:
    s = ANALYZING.model_copy(update={"analysis": AnalysisStatus(started_at="2026-01-02T03:04:00Z")})
    d = decide(SPEC, s, observations(canary=canary(), measurements=(m("Successful"),)), NOW)
    assert d.status.analysis.last_measured_at == "2026-01-02T03:04:05Z"
    assert d.requeue_after == 30.0


def test_inconclusive_never_promotes() -> None:
    s = ANALYZING
    for _ in range(3):
        d = decide(SPEC, s, observations(canary=canary(), measurements=(m("Inconclusive"),)), NOW)
        s = d.status
    assert s.phase in (P.ROLLING_BACK, P.ROLLED_BACK)
    assert all(not isinstance(a, ApplyOwnedFields) for a in d.actions)


def test_weight_and_replicas_follow_the_traffic_plan() -> None:
    two_steps = spec(serving={"baseline": {"deployment": "llm", "service": "llm"}, "traffic": {"steps": [20, 50]}})
    d = decide(two_steps, status(P.DEPLOYING), observations(baseline=baseline(4)), NOW)
    deployment = next(a.manifest for a in d.actions if isinstance(a, Apply) and a.manifest["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 1  # 1 canary beside 4 baseline pods = 20%
    ready = decide(two_steps, d.status, observations(baseline=baseline(4), canary=canary(1, 1)), NOW)
    assert ready.status.canary.weight == 20 and SetWeight(20) in ready.actions
