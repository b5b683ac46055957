"""A finished run (Succeeded, RolledBack, Failed) never restarts by itself: a spec change is reported in the
SpecCurrent condition, and `kvcal recalibrate` (annotation kvcal.dev/recalibrate) starts over on demand."""

from kvcal.core.conditions import get_condition
from kvcal.core.lifecycle import Builder, start_over
from kvcal.models.status import (
    TERMINAL_PHASES,
    Phase,
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


def recalibrate(draft: Builder) -> None:
    """`kvcal recalibrate`: calibrate anew from the current spec; only a terminal object (an active one restarts on
    a spec change by itself, or is aborted first)."""
    if draft.phase not in TERMINAL_PHASES:
        draft.event(
            "Warning", "RecalibrateIgnored", f"nothing to recalibrate in phase {draft.phase}: abort it or let it end"
        )
        return
    start_over(draft, "Recalibrate", "recalibrating")
    draft.move(Phase.PENDING, "Recalibrate", "kvcal.dev/recalibrate: calibrating anew from the current spec")
