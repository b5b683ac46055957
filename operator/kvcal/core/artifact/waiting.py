"""A Job's pod waiting for a Node (GPUs full, or no Node matching its selector): the wait is said, and not counted.

The Job controller counts spec.activeDeadlineSeconds from the Job's start, Pending time included, so on a busy GPU
cluster a Job could spend its whole run time waiting for a Node and fail without having run. kvcal gives the wait
back: while the pod waits, the deadline is kept WAIT_AHEAD_SECONDS ahead of it; once the pod is bound, it stays at
the run time plus the wait (rounded up to a minute, so the Job is patched once a minute at most). The run time the
spec asked for (or the verification's own) is what the pod gets once placed. An operator that is down while the pod
waits cannot raise it: the Job then fails at its deadline as it would without kvcal.
"""

import math

from kvcal.core.observations import JobState, SetJobDeadline
from kvcal.core.status.builder import Builder, reported
from kvcal.models.status import ConditionType

# Beyond the wait so far, while the pod still waits: covers the passes until the operator looks again (Calibrating
# polls every 60 s; Job events wake it sooner).
WAIT_AHEAD_SECONDS = 150
DEADLINE_STEP_SECONDS = 60


def deadline_for(run_seconds: int, waited_seconds: float, still_waiting: bool) -> int:
    """The activeDeadlineSeconds that leaves the pod `run_seconds` of running after `waited_seconds` of waiting."""
    if waited_seconds <= 0 and not still_waiting:
        return run_seconds
    ahead = waited_seconds + (WAIT_AHEAD_SECONDS if still_waiting else 0)
    return run_seconds + DEADLINE_STEP_SECONDS * math.ceil(ahead / DEADLINE_STEP_SECONDS)


def waiting_for_a_node(draft: Builder, job: JobState, run_seconds: int, condition: ConditionType, what: str) -> bool:
    """Raise the Job's deadline by the time its pod waited; True (and the wait said: `condition` Unknown with reason
    Unschedulable, one Warning event) while the scheduler cannot place it."""
    if job.waited_seconds is not None and job.deadline_seconds is not None:
        wanted = deadline_for(run_seconds, job.waited_seconds, job.unschedulable is not None)
        if wanted > job.deadline_seconds:
            draft.do(SetJobDeadline(job.name, wanted))
    pending = job.unschedulable
    if pending is None:
        return False
    message = (
        f"{what} Job {job.name} waits for a Node since {pending.since}{pending.shortage}: {pending.message}; its "
        f"{run_seconds} s of run time start once it is placed"
    )
    reported(draft, condition, "Unknown", "Unschedulable", message, ("Warning", "JobUnschedulable"))
    draft.wait(message, 30.0)
    return True
