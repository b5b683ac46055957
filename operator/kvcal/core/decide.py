"""decide(spec, status, observations, now) -> Decision: the whole lifecycle as one pure function.

One call computes the complete next status (phase, conditions, history, child summaries), the actions that make the
world match it, the events that explain it, and when to look again. Every phase change goes through
phases.check_transition. Children have deterministic names, so running an action twice (an operator restarted
between acting and writing status) creates nothing twice.
"""

from datetime import datetime

from kvcal.core.finished import recalibrate, spec_changed_when_done
from kvcal.core.guards import baseline_scaled_to_zero, blocked, refuse_served_output
from kvcal.core.lifecycle import HANDLERS, POLL_SECONDS, Builder, fail, next_measurement_at, remove_children
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
from kvcal.core.provenance import calibrator_image, record_calibrator_image, with_calibrator_image
from kvcal.core.redact import redact
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

P = Phase

__all__ = ["OBSERVES", "POLL_SECONDS", "decide", "measurement_due", "next_measurement_at"]

# What the reconciler must read for a KVCalibration in each phase (Observations fields; the others stay None). It
# covers the phases a pass can chain into (Analyzing -> Promoting, Deploying -> RollingBack, ...); gates and spec
# changes never chain, so a pass never acts on something it did not read.
OBSERVES: dict[Phase, frozenset[str]] = {
    P.PENDING: frozenset({"calibration_job", "baseline"}),  # the baseline: never calibrate into what it serves
    P.CALIBRATING: frozenset({"calibration_job"}),
    P.VERIFYING: frozenset({"verification_job", "baseline"}),
    P.DEPLOYING: frozenset({"canary", "baseline", "baseline_service", "routed_weight"}),
    P.ANALYZING: frozenset({"canary", "baseline", "baseline_service", "routed_weight"}),
    P.AWAITING_PROMOTION: frozenset({"canary", "baseline", "routed_weight"}),
    P.PROMOTING: frozenset({"canary", "baseline", "routed_weight"}),
    P.ROLLING_BACK: frozenset({"canary", "calibration_job", "verification_job", "routed_weight"}),
    P.SUCCEEDED: frozenset({"baseline"}),  # re-verify when its vLLM image or backend changes (core.serving)
    P.ROLLED_BACK: frozenset(),
    P.FAILED: frozenset(),
    P.INVALID_SPEC: frozenset(),
}


def measurement_due(spec: AnalysisSpec, status: KVCalibrationStatus, now: datetime) -> bool:
    """Whether the reconciler should query metrics and probes now (only while Analyzing)."""
    due = next_measurement_at(spec, status.analysis)
    return status.phase == P.ANALYZING and due is not None and now >= due


def decide(spec: KVCalibrationSpec | None, status: KVCalibrationStatus, obs: Observations, now: datetime) -> Decision:
    b = Builder(spec, status, obs, now)
    if spec is None:
        why = redact(obs.spec_error or "the spec is invalid")
        if b.phase in TERMINAL_PHASES:  # what ran stays as it is; the spec is the user's to fix
            b.condition("SpecCurrent", "False", "InvalidSpec", f"{why}; nothing changes until the spec is valid")
        elif not is_allowed(b.phase, P.INVALID_SPEC):  # Promoting, RollingBack: they finish once it is valid
            blocked(b, "InvalidSpec", f"{why}: fix the spec to finish {b.phase}", 60.0)
        elif b.phase != P.INVALID_SPEC:
            b.move(P.INVALID_SPEC, "InvalidSpec", why)
        else:
            b.update(message=why)
        return b.finish()
    violations = check(spec, obs.policy)
    if violations and (b.phase in (P.PENDING, P.INVALID_SPEC) or b.phase in ACTIVE):
        _refuse(b, violations)
        return b.finish()
    current_hash = effective_spec_hash(spec, status.calibration.spec_hash, obs.policy.calibrator_image)
    if b.phase == P.INVALID_SPEC:
        b.move(P.PENDING, "SpecFixed", "the spec is valid again")
    _on_spec_change(b, spec, current_hash)
    _on_gates(b, spec)
    if b.phase != status.phase:
        # A spec change, an abort or a retry only moves the phase (and deletes what must go); the new phase's work
        # happens in the next pass, on observations gathered for that phase (deletions have landed by then).
        return b.finish()
    image = calibrator_image(spec, obs)
    resolved = with_calibrator_image(spec, image)
    before = (b.status, list(b.actions), list(b.events), b.requeue)
    try:
        try:
            if refuse_served_output(b, resolved) or baseline_scaled_to_zero(b, spec):
                return b.finish()
            HANDLERS[b.phase](b, resolved, current_hash)
            if b.phase == P.SUCCEEDED:
                watch_serving(b, resolved)
        except BaselineError as e:
            fail(b, "BaselineUnusable", str(e))
    except (ValueError, LookupError, TypeError) as e:
        # A problem no handler foresaw: shown in the status, never an exception that retries forever unseen.
        b.status, b.actions, b.events, b.requeue = before
        blocked(b, "Blocked", redact(f"cannot continue in phase {b.phase}: {type(e).__name__}: {e}"), 60.0)
    record_calibrator_image(b, image)
    return b.finish()


def _refuse(b: Builder, violations: list[Violation]) -> None:
    """A spec the policy refuses creates nothing; one that became refused mid-way (the admin tightened the policy)
    rolls back, which removes what it had created."""
    message = "; ".join(str(v) for v in violations)
    reason = "PolicyDenied" if any(v.chart_value for v in violations) else "InvalidSpec"
    b.condition("Calibrated", "False", reason, message)
    if b.phase == P.INVALID_SPEC:
        b.update(message=message)
    elif b.phase == P.PENDING:
        b.move(P.INVALID_SPEC, reason, message)
    else:
        b.move(P.ROLLING_BACK, reason, message)


def _on_spec_change(b: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    """A change of the calibration inputs starts over while the work is active; other spec changes apply to the
    next decision only. A terminal object never restarts by itself (core.finished)."""
    old = b.status.calibration.spec_hash
    if b.phase in TERMINAL_PHASES and old is not None:
        spec_changed_when_done(b, old, current_hash)
        return
    if old is None or old == current_hash or b.phase in (P.PENDING, P.PROMOTING, P.ROLLING_BACK):
        return
    remove_children(b, include_jobs=True)
    b.update(
        calibration=CalibrationStatus(),
        verification=VerificationStatus(),
        canary=CanaryStatus(),
        analysis=AnalysisStatus(),
    )
    for t in ("Calibrated", "ScalesVerified", "CanaryReady", "AnalysisPassed", "Promoted"):
        b.condition(t, "Unknown", "SpecChanged", "the calibration inputs changed")
    b.move(P.PENDING, "SpecChanged", f"calibration inputs changed ({old[:8]} -> {current_hash[:8]}): recalibrating")


def _on_gates(b: Builder, spec: KVCalibrationSpec) -> None:
    gates = b.obs.gates
    if gates.get(RECALIBRATE_ANNOTATION):
        b.do(ClearAnnotations((RECALIBRATE_ANNOTATION,)))
        recalibrate(b)
    if gates.get(ABORT_ANNOTATION):
        b.do(ClearAnnotations((ABORT_ANNOTATION,)))
        if b.phase in ACTIVE:
            b.condition("AnalysisPassed", "False", "Aborted", "aborted by the kvcal.dev/abort annotation")
            b.move(P.ROLLING_BACK, "Aborted", "aborted by the kvcal.dev/abort annotation: rolling back")
        elif b.phase != P.ROLLING_BACK:  # RollingBack: the abort's own effect, seen again after a restart
            b.event("Warning", "AbortIgnored", f"nothing to abort in phase {b.phase}")
    if gates.get(RETRY_ANNOTATION):
        b.do(ClearAnnotations((RETRY_ANNOTATION,)))
        _retry(b, spec)
    if gates.get(PROMOTE_ANNOTATION) and b.phase != P.AWAITING_PROMOTION:
        b.do(ClearAnnotations((PROMOTE_ANNOTATION,)))
        if b.phase != P.PROMOTING:  # Promoting: the promotion's own annotation, seen again after a restart
            b.event("Warning", "PromoteIgnored", f"nothing to promote in phase {b.phase}: wait for AwaitingPromotion")


def _retry(b: Builder, spec: KVCalibrationSpec) -> None:
    """`kvcal retry`: re-run the analysis when the scales were verified, else the whole pipeline."""
    if b.phase not in RETRYABLE:
        b.event("Warning", "RetryIgnored", f"nothing to retry in phase {b.phase}")
        return
    if b.status.verification.mismatches == 0 and b.status.calibration.spec_hash is not None:
        b.update(canary=CanaryStatus(), analysis=AnalysisStatus(measurements=b.status.analysis.measurements))
        b.condition("AnalysisPassed", "Unknown", "Retry", "re-running the analysis")
        b.move(P.DEPLOYING, "Retry", "kvcal.dev/retry: re-deploying the canary and re-running the analysis")
        return
    for name in (b.status.calibration.job, b.status.verification.job):
        if name:
            b.do(Delete("Job", name))
    if b.status.calibration.job:
        b.do(Delete("ConfigMap", b.status.calibration.job))
    b.update(calibration=CalibrationStatus(), verification=VerificationStatus(), canary=CanaryStatus())
    b.move(P.PENDING, "Retry", "kvcal.dev/retry: recalibrating")
