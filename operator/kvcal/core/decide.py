"""decide(spec, status, observations, now) -> Decision: the whole lifecycle as one pure function.

One call computes the complete next status (phase, conditions, history, child summaries), the actions that make the
world match it, the events that explain it, and when to look again. What each phase does comes from its descriptor
(core.phases): decide itself only handles what is the same in every phase (an invalid spec, the policy, a change of
the calibration inputs, the command annotations). Children have deterministic names, so running an action twice (an
operator restarted between acting and writing status) creates nothing twice.
"""

from dataclasses import replace
from datetime import datetime
from typing import Literal

from kvcal.core.analysis.schedule import measurement_due, next_measurement_at, with_noise
from kvcal.core.artifact.provenance import calibrator_image, record_calibrator_image, with_calibrator_image
from kvcal.core.artifact.record import verified_artifact
from kvcal.core.finished import recalibrate, spec_changed_when_done, start_over
from kvcal.core.guard.policy import Violation, check
from kvcal.core.guard.redact import redact
from kvcal.core.manifests import BaselineError
from kvcal.core.manifests.protected import with_report_layers
from kvcal.core.observations import (
    ABORT_ANNOTATION,
    PROMOTE_ANNOTATION,
    RECALIBRATE_ANNOTATION,
    RETRY_ANNOTATION,
    Decision,
    Delete,
    Observations,
    SetWeight,
)
from kvcal.core.phases import LIFECYCLE, Lifecycle
from kvcal.core.problems import NeedsFix
from kvcal.core.rollout.canary import remove_canary
from kvcal.core.spechash import effective_spec_hash
from kvcal.core.status.builder import Builder, blocked, fail
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import (
    AnalysisStatus,
    CalibrationStatus,
    CanaryStatus,
    KVCalibrationStatus,
    Phase,
    VerificationStatus,
)

__all__ = ["decide", "measurement_due", "next_measurement_at"]

# "raise": a handler's unforeseen exception propagates (tests: it is a bug). "block": the operator shows it as a
# Blocked status (the decision carries it, for the log) instead of retrying forever unseen.
OnUnexpected = Literal["raise", "block"]


def decide(
    spec: KVCalibrationSpec | None,
    status: KVCalibrationStatus,
    obs: Observations,
    now: datetime,
    lifecycle: Lifecycle = LIFECYCLE,
    on_unexpected: OnUnexpected = "raise",
) -> Decision:
    draft = Builder(spec, status, obs, now, lifecycle)
    if draft.phase not in lifecycle:
        blocked(draft, "Blocked", f"phase {draft.phase} is not one this operator knows: upgrade the operator", 60.0)
        return draft.finish()
    if spec is None:
        why = redact(obs.spec_error or "the spec is invalid")
        if lifecycle[draft.phase].terminal:  # what ran stays as it is; the spec is the user's to fix
            draft.condition("SpecCurrent", "False", "InvalidSpec", f"{why}; nothing changes until the spec is valid")
        elif not lifecycle.is_allowed(draft.phase, Phase.INVALID_SPEC):  # Promoting, RollingBack: they finish first
            blocked(draft, "InvalidSpec", f"{why}: fix the spec to finish {draft.phase}", 60.0)
        elif draft.phase != Phase.INVALID_SPEC:
            draft.move(Phase.INVALID_SPEC, "InvalidSpec", why)
        else:
            draft.update(message=why)
        return draft.finish()
    violations = check(spec, obs.policy)
    if violations and (draft.phase in (Phase.PENDING, Phase.INVALID_SPEC) or lifecycle[draft.phase].active):
        _refuse(draft, violations)
        return draft.finish()
    current_hash = effective_spec_hash(spec, status.calibration.spec_hash, obs.policy.calibrator_image)
    if draft.phase == Phase.INVALID_SPEC:
        draft.move(Phase.PENDING, "SpecFixed", "the spec is valid again")
    if _on_spec_change(draft, spec, current_hash, lifecycle):
        return draft.finish()  # draining the canary before starting over
    _on_gates(draft, spec, lifecycle)
    if draft.phase != status.phase:
        # A spec change, an abort or a retry only moves the phase (and deletes what must go); the new phase's work
        # happens in the next pass, on observations gathered for that phase (deletions have landed by then).
        return draft.finish()
    image = calibrator_image(spec, obs)
    resolved = with_report_layers(with_calibrator_image(spec, image), status.calibration)
    if obs.noise:  # learned while a canary is deployed or analyzed: kept across steps, refreshed by the observer
        draft.update(noise=with_noise(draft.status.noise, obs.noise))
    before = (draft.status, list(draft.actions), list(draft.events), draft.requeue)
    unexpected: Exception | None = None
    try:
        lifecycle[draft.phase].handler(draft, resolved, current_hash)
    except BaselineError as e:
        fail(draft, "BaselineUnusable", str(e))
    except NeedsFix as e:
        draft.status, draft.actions, draft.events, draft.requeue = before
        blocked(draft, "Blocked", redact(f"cannot continue in phase {draft.phase}: {e}"), 60.0)
    except (ValueError, LookupError, TypeError) as e:  # what bad data makes of a handler; others: ReconcileError
        if on_unexpected == "raise":
            raise
        # A problem no handler foresaw: shown in the status, never an exception that retries forever unseen.
        unexpected = e
        draft.status, draft.actions, draft.events, draft.requeue = before
        blocked(draft, "Blocked", redact(f"cannot continue in phase {draft.phase}: {type(e).__name__}: {e}"), 60.0)
    record_calibrator_image(draft, image)
    return replace(draft.finish(), unexpected=unexpected)


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


def _on_spec_change(draft: Builder, spec: KVCalibrationSpec, current_hash: str, lifecycle: Lifecycle) -> bool:
    """A change of the calibration inputs starts over while the work is active; other spec changes apply to the
    next decision only. A terminal object never restarts by itself (core.finished). True while a canary that takes
    traffic is being drained first (0% read back, drainDelay), as a rollback does: nothing else happens meanwhile."""
    old = draft.status.calibration.spec_hash
    descriptor = lifecycle[draft.phase]
    if descriptor.terminal and old is not None:
        spec_changed_when_done(draft, old, current_hash)
        return False
    if old is None or old == current_hash or not descriptor.active:  # Pending, Promoting, RollingBack: go on
        return False
    if descriptor.serving and not remove_canary(draft, spec):
        draft.update(message=f"the calibration inputs changed; {draft.status.message}")
        return True
    start_over(draft, "SpecChanged", "the calibration inputs changed")
    draft.move(
        Phase.PENDING, "SpecChanged", f"calibration inputs changed ({old[:8]} -> {current_hash[:8]}): recalibrating"
    )
    return False


def _on_gates(draft: Builder, spec: KVCalibrationSpec, lifecycle: Lifecycle) -> None:
    gates = draft.obs.gates
    if gates.get(RECALIBRATE_ANNOTATION):
        draft.clear(RECALIBRATE_ANNOTATION)
        recalibrate(draft, lifecycle)
    if gates.get(ABORT_ANNOTATION):
        draft.clear(ABORT_ANNOTATION)
        if draft.phase in lifecycle.acts_on("abort"):
            if lifecycle[draft.phase].serving:  # off the canary in this pass; RollingBack reads it back and drains
                draft.do(SetWeight(0))
            draft.condition("AnalysisPassed", "False", "Aborted", "aborted by the kvcal.dev/abort annotation")
            draft.move(Phase.ROLLING_BACK, "Aborted", "aborted by the kvcal.dev/abort annotation: rolling back")
        elif draft.phase != Phase.ROLLING_BACK:  # RollingBack: the abort's own effect, seen again after a restart
            draft.event("Warning", "AbortIgnored", f"nothing to abort in phase {draft.phase}")
    if gates.get(RETRY_ANNOTATION):
        draft.clear(RETRY_ANNOTATION)
        _retry(draft, spec, lifecycle)
    if gates.get(PROMOTE_ANNOTATION) and draft.phase not in lifecycle.acts_on("promote"):
        draft.clear(PROMOTE_ANNOTATION)
        if draft.phase != Phase.PROMOTING:  # Promoting: the promotion's own annotation, seen again after a restart
            draft.event(
                "Warning", "PromoteIgnored", f"nothing to promote in phase {draft.phase}: wait for AwaitingPromotion"
            )


def _retry(draft: Builder, spec: KVCalibrationSpec, lifecycle: Lifecycle) -> None:
    """`kvcal retry`: re-run the analysis when the scales were verified, else the whole pipeline."""
    if draft.phase not in lifecycle.acts_on("retry"):
        draft.event("Warning", "RetryIgnored", f"nothing to retry in phase {draft.phase}")
        return
    if verified_artifact(draft.status, spec.calibration.output) is not None:
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
