"""decide(spec, status, observations, now) -> Decision: the whole lifecycle as one pure function.

One call computes the complete next status (phase, conditions, history, child summaries), the actions that make the
world match it, the events that explain it, and when to look again. Every phase change goes through
phases.check_transition. Children have deterministic names, so running an action twice (an operator restarted
between acting and writing status) creates nothing twice.
"""

from datetime import datetime

from kvcal.core.finished import recalibrate, spec_changed_when_done
from kvcal.core.guards import baseline_scaled_to_zero, blocked, refuse_served_output
from kvcal.core.lifecycle import HANDLERS, POLL_SECONDS, Builder, fail, next_measurement_at, remove_canary, start_over
from kvcal.core.manifests import BaselineError
from kvcal.core.observations import (
    ABORT_ANNOTATION,
    PROMOTE_ANNOTATION,
    RECALIBRATE_ANNOTATION,
    RETRY_ANNOTATION,
    ClearAnnotations,
    Decision,
    Delete,
    Observations,
)
from kvcal.core.phases import ACTIVE, RETRYABLE, is_allowed
from kvcal.core.policy import Violation, check
from kvcal.core.protected import with_report_layers
from kvcal.core.provenance import calibrator_image, record_calibrator_image, with_calibrator_image
from kvcal.core.redact import redact
from kvcal.core.reverts import watch_promotion
from kvcal.core.serving import watch_serving
from kvcal.core.spechash import effective_spec_hash
from kvcal.models.spec import AnalysisSpec, KVCalibrationSpec
from kvcal.models.status import (
    TERMINAL_PHASES,
    AnalysisStatus,
    CalibrationStatus,
    CanaryStatus,
    KVCalibrationStatus,
    Phase,
    VerificationStatus,
)

__all__ = ["OBSERVES", "POLL_SECONDS", "decide", "measurement_due", "next_measurement_at"]

# What the reconciler must read for a KVCalibration in each phase (Observations fields; the others stay None). It
# covers the phases a pass can chain into (Analyzing -> Promoting, Deploying -> RollingBack, ...); gates and spec
# changes never chain, so a pass never acts on something it did not read.
OBSERVES: dict[Phase, frozenset[str]] = {
    Phase.PENDING: frozenset({"calibration_job", "baseline"}),  # the baseline: never calibrate into what it serves
    Phase.CALIBRATING: frozenset({"calibration_job", "baseline"}),  # a vanished Job is re-created: same guard
    Phase.VERIFYING: frozenset({"verification_job", "baseline"}),
    Phase.DEPLOYING: frozenset({"canary", "baseline", "baseline_service", "routed_weight"}),
    Phase.ANALYZING: frozenset({"canary", "baseline", "baseline_service", "routed_weight"}),
    Phase.AWAITING_PROMOTION: frozenset({"canary", "baseline", "routed_weight"}),
    Phase.PROMOTING: frozenset({"canary", "baseline", "routed_weight"}),
    Phase.ROLLING_BACK: frozenset({"canary", "calibration_job", "verification_job", "routed_weight"}),
    Phase.SUCCEEDED: frozenset({"baseline"}),  # re-verify when its vLLM image or backend changes (core.serving)
    Phase.ROLLED_BACK: frozenset(),
    Phase.FAILED: frozenset(),
    Phase.INVALID_SPEC: frozenset(),
}


# Phases in which a canary may take traffic: a spec change drains it before starting over.
_SERVING_CANARY = frozenset({Phase.DEPLOYING, Phase.ANALYZING, Phase.AWAITING_PROMOTION})


def measurement_due(spec: AnalysisSpec, status: KVCalibrationStatus, now: datetime) -> bool:
    """Whether the reconciler should query metrics and probes now (only while Analyzing)."""
    due = next_measurement_at(spec, status.analysis)
    return status.phase == Phase.ANALYZING and due is not None and now >= due


def decide(spec: KVCalibrationSpec | None, status: KVCalibrationStatus, obs: Observations, now: datetime) -> Decision:
    draft = Builder(spec, status, obs, now)
    if spec is None:
        why = redact(obs.spec_error or "the spec is invalid")
        if draft.phase in TERMINAL_PHASES:  # what ran stays as it is; the spec is the user's to fix
            draft.condition("SpecCurrent", "False", "InvalidSpec", f"{why}; nothing changes until the spec is valid")
        elif not is_allowed(draft.phase, Phase.INVALID_SPEC):  # Promoting, RollingBack: they finish once it is valid
            blocked(draft, "InvalidSpec", f"{why}: fix the spec to finish {draft.phase}", 60.0)
        elif draft.phase != Phase.INVALID_SPEC:
            draft.move(Phase.INVALID_SPEC, "InvalidSpec", why)
        else:
            draft.update(message=why)
        return draft.finish()
    violations = check(spec, obs.policy)
    if violations and (draft.phase in (Phase.PENDING, Phase.INVALID_SPEC) or draft.phase in ACTIVE):
        _refuse(draft, violations)
        return draft.finish()
    current_hash = effective_spec_hash(spec, status.calibration.spec_hash, obs.policy.calibrator_image)
    if draft.phase == Phase.INVALID_SPEC:
        draft.move(Phase.PENDING, "SpecFixed", "the spec is valid again")
    if _on_spec_change(draft, spec, current_hash):
        return draft.finish()  # draining the canary before starting over
    _on_gates(draft, spec)
    if draft.phase != status.phase:
        # A spec change, an abort or a retry only moves the phase (and deletes what must go); the new phase's work
        # happens in the next pass, on observations gathered for that phase (deletions have landed by then).
        return draft.finish()
    image = calibrator_image(spec, obs)
    resolved = with_report_layers(with_calibrator_image(spec, image), status.calibration)
    before = (draft.status, list(draft.actions), list(draft.events), draft.requeue)
    try:
        try:
            if refuse_served_output(draft, resolved) or baseline_scaled_to_zero(draft, spec):
                return draft.finish()
            HANDLERS[draft.phase](draft, resolved, current_hash)
            if draft.phase == Phase.SUCCEEDED and watch_promotion(draft, resolved):
                watch_serving(draft, resolved)
        except BaselineError as e:
            fail(draft, "BaselineUnusable", str(e))
    except (ValueError, LookupError, TypeError) as e:
        # A problem no handler foresaw: shown in the status, never an exception that retries forever unseen.
        draft.status, draft.actions, draft.events, draft.requeue = before
        blocked(draft, "Blocked", redact(f"cannot continue in phase {draft.phase}: {type(e).__name__}: {e}"), 60.0)
    record_calibrator_image(draft, image)
    return draft.finish()


def _refuse(draft: Builder, violations: list[Violation]) -> None:
    """A spec the policy refuses creates nothing; one that became refused mid-way (the admin tightened the policy)
    rolls back, which removes what it had created."""
    message = "; ".join(str(v) for v in violations)
    reason = "PolicyDenied" if any(v.chart_value for v in violations) else "InvalidSpec"
    draft.condition("Calibrated", "False", reason, message)
    if draft.phase == Phase.INVALID_SPEC:
        draft.update(message=message)
    elif draft.phase == Phase.PENDING:
        draft.move(Phase.INVALID_SPEC, reason, message)
    else:
        draft.move(Phase.ROLLING_BACK, reason, message)


def _on_spec_change(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> bool:
    """A change of the calibration inputs starts over while the work is active; other spec changes apply to the
    next decision only. A terminal object never restarts by itself (core.finished). True while a canary that takes
    traffic is being drained first (0% read back, drainDelay), as a rollback does: nothing else happens meanwhile."""
    old = draft.status.calibration.spec_hash
    if draft.phase in TERMINAL_PHASES and old is not None:
        spec_changed_when_done(draft, old, current_hash)
        return False
    if old is None or old == current_hash or draft.phase in (Phase.PENDING, Phase.PROMOTING, Phase.ROLLING_BACK):
        return False
    if draft.phase in _SERVING_CANARY and not remove_canary(draft, spec):
        draft.update(message=f"the calibration inputs changed; {draft.status.message}")
        return True
    start_over(draft, "SpecChanged", "the calibration inputs changed")
    draft.move(
        Phase.PENDING, "SpecChanged", f"calibration inputs changed ({old[:8]} -> {current_hash[:8]}): recalibrating"
    )
    return False


def _on_gates(draft: Builder, spec: KVCalibrationSpec) -> None:
    gates = draft.obs.gates
    if gates.get(RECALIBRATE_ANNOTATION):
        draft.do(ClearAnnotations((RECALIBRATE_ANNOTATION,)))
        recalibrate(draft)
    if gates.get(ABORT_ANNOTATION):
        draft.do(ClearAnnotations((ABORT_ANNOTATION,)))
        if draft.phase in ACTIVE:
            draft.condition("AnalysisPassed", "False", "Aborted", "aborted by the kvcal.dev/abort annotation")
            draft.move(Phase.ROLLING_BACK, "Aborted", "aborted by the kvcal.dev/abort annotation: rolling back")
        elif draft.phase != Phase.ROLLING_BACK:  # RollingBack: the abort's own effect, seen again after a restart
            draft.event("Warning", "AbortIgnored", f"nothing to abort in phase {draft.phase}")
    if gates.get(RETRY_ANNOTATION):
        draft.do(ClearAnnotations((RETRY_ANNOTATION,)))
        _retry(draft, spec)
    if gates.get(PROMOTE_ANNOTATION) and draft.phase != Phase.AWAITING_PROMOTION:
        draft.do(ClearAnnotations((PROMOTE_ANNOTATION,)))
        if draft.phase != Phase.PROMOTING:  # Promoting: the promotion's own annotation, seen again after a restart
            draft.event(
                "Warning", "PromoteIgnored", f"nothing to promote in phase {draft.phase}: wait for AwaitingPromotion"
            )


def _retry(draft: Builder, spec: KVCalibrationSpec) -> None:
    """`kvcal retry`: re-run the analysis when the scales were verified, else the whole pipeline."""
    if draft.phase not in RETRYABLE:
        draft.event("Warning", "RetryIgnored", f"nothing to retry in phase {draft.phase}")
        return
    if draft.status.verification.mismatches == 0 and draft.status.calibration.spec_hash is not None:
        draft.update(canary=CanaryStatus(), analysis=AnalysisStatus(measurements=draft.status.analysis.measurements))
        draft.condition("AnalysisPassed", "Unknown", "Retry", "re-running the analysis")
        draft.move(Phase.DEPLOYING, "Retry", "kvcal.dev/retry: re-deploying the canary and re-running the analysis")
        return
    for name in (draft.status.calibration.job, draft.status.verification.job):
        if name:
            draft.do(Delete("Job", name))
    if draft.status.calibration.job:
        draft.do(Delete("ConfigMap", draft.status.calibration.job))
    draft.update(calibration=CalibrationStatus(), verification=VerificationStatus(), canary=CanaryStatus())
    draft.move(Phase.PENDING, "Retry", "kvcal.dev/retry: recalibrating")
