"""What deleting a KVCalibration does before its finalizer goes: the canary leaves traffic the way a rollback takes
it out (core.rollout.drain: 0% asked, 0% read back, drainDelay, then delete), whatever phase the object was in."""

from dataclasses import replace
from datetime import datetime

from kvcal.core.observations import Decision, Observations
from kvcal.core.phases import LIFECYCLE
from kvcal.core.rollout.canary import remove_canary
from kvcal.core.status.builder import Builder
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import KVCalibrationStatus


def decide_deletion(
    spec: KVCalibrationSpec | None, status: KVCalibrationStatus, obs: Observations, now: datetime
) -> Decision:
    """requeue_after None: the canary is being deleted and the rest of the children may go; else look again then.
    An unreadable spec names no router: nothing can be asked of it, so the children go at once."""
    draft = Builder(spec, status, obs, now, LIFECYCLE)
    done = spec is None or remove_canary(draft, spec)
    decision = draft.finish()
    return replace(decision, requeue_after=None if done else decision.requeue_after)
