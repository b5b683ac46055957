"""A finished run (Succeeded, RolledBack, Failed) never restarts by itself: a spec change is reported in the
SpecCurrent condition, and `kvcal recalibrate` (annotation kvcal.dev/recalibrate) starts over on demand; start_over is
also what a change of the calibration inputs does to active work."""

from kvcal.core.phases import Lifecycle
from kvcal.core.rollout.canary import remove_children
from kvcal.core.status.builder import Builder
from kvcal.core.status.conditions import get_condition
from kvcal.models.status import (
    AnalysisStatus,
    CalibrationStatus,
    CanaryStatus,
    CapacityStatus,
    Phase,
    ServingStatus,
    VerificationStatus,
)


def spec_changed_when_done(draft: Builder, old: str, current_hash: str) -> None:
    """Succeeded: the promoted checkpoint keeps serving, a new calibration is the user's call (it may need a new
    output folder: the baseline serves the old one). RolledBack/Failed: nothing runs, nothing starts unasked. The
    SpecCurrent condition says so, and how to calibrate anew."""
    present = get_condition(draft.status.conditions, "SpecCurrent")
    if old == current_hash:
        if present is not None and present.status != "True":
            draft.condition("SpecCurrent", "True", "SpecMatches", "the spec matches the calibration in the status")
        return
    name = draft.obs.owner.name
    message = f"the calibration inputs changed ({old[:8]} -> {current_hash[:8]}) after this {draft.phase} calibration; "
    if draft.phase == Phase.SUCCEEDED:
        message += "the promoted checkpoint keeps serving. To calibrate anew, set a new spec.calibration.output and "
    else:
        message += "nothing restarts by itself. To calibrate with the new spec, "
    message += f"run `kvcal recalibrate {name}` (annotation kvcal.dev/recalibrate)"
    if present is None or present.message != message:
        draft.event("Warning", "SpecChanged", message)
    draft.condition("SpecCurrent", "False", "SpecChanged", message)


def recalibrate(draft: Builder, lifecycle: Lifecycle) -> None:
    """`kvcal recalibrate`: calibrate anew from the current spec; only a terminal object (an active one restarts on
    a spec change by itself, or is aborted first)."""
    if draft.phase not in lifecycle.names("terminal"):
        draft.event(
            "Warning", "RecalibrateIgnored", f"nothing to recalibrate in phase {draft.phase}: abort it or let it end"
        )
        return
    start_over(draft, "Recalibrate", "recalibrating")
    draft.move(Phase.PENDING, "Recalibrate", "kvcal.dev/recalibrate: calibrating anew from the current spec")


def start_over(draft: Builder, reason: str, message: str) -> None:
    """Forget every step's result and remove every child, before moving back to Pending (a spec change of the
    calibration inputs, or `kvcal recalibrate`)."""
    remove_children(draft, include_jobs=True)
    draft.update(
        calibration=CalibrationStatus(),
        verification=VerificationStatus(),
        canary=CanaryStatus(),
        analysis=AnalysisStatus(),
        serving=ServingStatus(),
        capacity=CapacityStatus(),
    )
    for step in ("Calibrated", "ScalesVerified", "CanaryReady", "AnalysisPassed", "Promoted"):
        draft.condition(step, "Unknown", reason, message)
    for optional in ("SpecCurrent", "ServingVerified", "CalibrationCurrent"):
        if get_condition(draft.status.conditions, optional) is not None:
            draft.condition(optional, "Unknown", reason, message)
