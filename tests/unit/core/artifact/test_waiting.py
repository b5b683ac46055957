"""A Job's pod waiting for a Node: said once, and its wait given back to its deadline; and the reader of the wait."""

from datetime import timedelta

from tests.support.decide import CALIB, NOW, P, observations, spec, status

from kvcal.core.artifact.waiting import WAIT_AHEAD_SECONDS, deadline_for
from kvcal.core.decide import decide
from kvcal.core.observations import JobState, SetJobDeadline, Unschedulable
from kvcal.core.timestamps import rfc3339
from kvcal.services.observe import waiting_for_node

FULL = Unschedulable(1, rfc3339(NOW - timedelta(seconds=40)), "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")
RUN = 1800  # tests.support.decide.SPEC's calibration.job.activeDeadlineSeconds


def job(deadline: int, waited: float, unschedulable: Unschedulable | None = None) -> JobState:
    return JobState(CALIB, "Running", deadline_seconds=deadline, waited_seconds=waited, unschedulable=unschedulable)


def test_deadline_math() -> None:
    assert deadline_for(RUN, 0, still_waiting=False) == RUN  # placed at once: the deadline the spec asked for
    assert deadline_for(RUN, 61, still_waiting=False) == RUN + 120  # the wait, rounded up to a minute
    assert deadline_for(RUN, 40, still_waiting=True) == RUN + 60 * -(-(40 + WAIT_AHEAD_SECONDS) // 60)


def test_a_waiting_calibration_job_is_said_once_and_its_deadline_raised() -> None:
    d = decide(spec(), status(P.CALIBRATING), observations(calibration_job=job(RUN, 40, FULL)), NOW)
    assert d.status.phase == P.CALIBRATING
    assert SetJobDeadline(CALIB, deadline_for(RUN, 40, still_waiting=True)) in d.actions
    calibrated = next(c for c in d.status.conditions if c.type == "Calibrated")
    assert (calibrated.status, calibrated.reason) == ("Unknown", "Unschedulable")
    assert "(no Node has a free nvidia.com/gpu)" in calibrated.message
    assert f"its {RUN} s of run time start once it is placed" in calibrated.message
    assert [e.reason for e in d.events] == ["JobUnschedulable"]
    # The next pass, its deadline already raised: no patch, no second event.
    raised = job(deadline_for(RUN, 40, still_waiting=True), 45, FULL)
    again = decide(spec(), d.status, observations(calibration_job=raised), NOW + timedelta(seconds=5))
    assert again.actions == () and again.events == ()


def test_once_placed_the_deadline_is_the_run_time_plus_the_wait() -> None:
    placed = job(RUN, 75)
    d = decide(spec(), status(P.CALIBRATING), observations(calibration_job=placed), NOW)
    assert d.actions == (SetJobDeadline(CALIB, RUN + 120),)
    assert d.status.message == f"calibration Job {CALIB} is running"
    # Never lowered: a deadline raised while it waited stays.
    assert decide(spec(), status(P.CALIBRATING), observations(calibration_job=job(RUN + 240, 75)), NOW).actions == ()


def pod(created: str, bound_at: str | None = None, node: str | None = None) -> dict[str, object]:
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": bound_at}] if bound_at else []
    return {"metadata": {"creationTimestamp": created}, "spec": {"nodeName": node} if node else {},
            "status": {"conditions": conditions}}  # fmt: skip


def test_the_wait_is_each_pods_time_before_its_node() -> None:
    started = {"status": {"startTime": "2026-01-02T03:00:00Z"}}
    retried = [
        pod("2026-01-02T03:00:00Z", "2026-01-02T03:01:00Z", "n"),  # waited 60 s, then ran (its run is not a wait)
        pod("2026-01-02T03:03:00Z"),  # its retry, still waiting at NOW: 03:04:05 - 03:03:00 = 65 s
    ]
    assert waiting_for_node(started, retried, NOW) == 60 + 65
    assert waiting_for_node({"status": {}}, retried, NOW) is None  # not started
    assert waiting_for_node(started, [pod("2026-01-02T03:00:00Z", node="n")], NOW) == 0  # bound by no scheduler
