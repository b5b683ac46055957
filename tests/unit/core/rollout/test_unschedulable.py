"""A canary the scheduler cannot place: reported at once, then the spec's choice (roll back or keep waiting) after
spec.serving.canary.scheduling.timeout; and the pod reader that finds such pods."""

from datetime import timedelta
from typing import Any

import pytest

from kvcal.core.decide import decide
from kvcal.core.observations import Unschedulable
from kvcal.core.timestamps import rfc3339
from kvcal.models.spec import KVCalibrationSpec
from kvcal.services.observe import unschedulable, workload_state
from tests.support.decide import NOW, P, actions, baseline, canary, observations, spec, status

MESSAGE = (
    "0/3 nodes are available: 1 node(s) had untolerated taint {node-role: infra}, 2 Insufficient nvidia.com/gpu. "
    "preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, 2 No preemption victims found "
    "for incoming pod."
)


def pending(since_seconds: float, replicas: int = 1) -> Unschedulable:
    return Unschedulable(replicas, rfc3339(NOW - timedelta(seconds=since_seconds)), MESSAGE)


def scheduling(**fields: Any) -> KVCalibrationSpec:
    return spec(serving={"baseline": {"deployment": "llm", "service": "llm"}, "canary": {"scheduling": fields}})


DEPLOYING = status(P.DEPLOYING)


def test_reported_at_once_with_the_missing_resource_and_one_event() -> None:
    d = decide(scheduling(), DEPLOYING, observations(canary=canary(1, 0), canary_unschedulable=pending(3)), NOW)
    assert d.status.phase == P.DEPLOYING
    ready = next(c for c in d.status.conditions if c.type == "CanaryReady")
    assert (ready.status, ready.reason) == ("False", "Unschedulable")
    deadline = rfc3339(NOW + timedelta(seconds=297))
    assert ready.message == (
        f"1 canary pod of smollm2-canary unschedulable since {rfc3339(NOW - timedelta(seconds=3))} (no Node has a "
        f"free nvidia.com/gpu): {MESSAGE}; rolling back at {deadline} (spec.serving.canary.scheduling)"
    )
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "CanaryUnschedulable")]
    # The next pass: the same condition, no second event (a status write per pass would wake the operator again).
    later = NOW + timedelta(seconds=15)
    again = decide(scheduling(), d.status, observations(canary=canary(1, 0), canary_unschedulable=pending(3)), later)
    assert again.events == () and again.status.message == d.status.message


def test_rolls_back_at_the_timeout_naming_the_cause() -> None:
    obs = observations(canary=canary(1, 0), canary_unschedulable=pending(300))
    d = decide(scheduling(timeout="5m"), DEPLOYING, obs, NOW)
    assert d.status.phase == P.ROLLING_BACK
    assert d.status.history[-1].reason == "CanaryUnschedulable"
    assert d.status.history[-1].message.endswith("rolling back after 5m (spec.serving.canary.scheduling)")
    assert "Delete Deployment/smollm2-canary" in actions(d)


def test_waits_until_the_timeout() -> None:
    obs = observations(canary=canary(1, 0), canary_unschedulable=pending(299))
    d = decide(scheduling(timeout="5m"), DEPLOYING, obs, NOW)
    assert d.status.phase == P.DEPLOYING
    assert d.requeue_after == pytest.approx(1.0)  # the rollback is due in a second, not at the next 15 s poll


@pytest.mark.parametrize("waited", [0, 3600])
def test_wait_keeps_waiting_past_the_timeout_and_the_progress_deadline(waited: int) -> None:
    # A Deployment's progress deadline (10 min by default) would roll an unschedulable canary back as "not ready":
    # the spec said wait for capacity, and the cause is known.
    obs = observations(canary=canary(1, 0, progress_deadline_exceeded=True), canary_unschedulable=pending(waited))
    d = decide(scheduling(timeout="0s", onTimeout="wait"), DEPLOYING, obs, NOW)
    assert d.status.phase == P.DEPLOYING
    assert d.status.message.endswith("waiting for capacity (onTimeout wait) (spec.serving.canary.scheduling)")
    assert actions(d) == []


def test_placed_pods_are_the_ordinary_path() -> None:
    # Every canary pod placed and ready: nothing to say, whatever an earlier pass saw.
    d = decide(scheduling(), DEPLOYING, observations(canary=canary(2, 2)), NOW)
    assert d.status.phase == P.ANALYZING


def pod(condition: dict[str, str] | None, node: str | None = None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "c-1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-02T03:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": "Pending", "conditions": [condition] if condition else []},
    }


def refused(at: str, message: str = MESSAGE) -> dict[str, str]:
    return {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastTransitionTime": at,
    }


def test_the_reader_counts_only_pods_the_scheduler_refused() -> None:
    pods = [
        pod(refused("2026-01-02T03:01:00Z")),
        pod(refused("2026-01-02T03:00:30Z", "0/3 nodes are available: 3 Insufficient memory.")),
        pod(None),  # not looked at yet
        pod(refused("2026-01-02T02:00:00Z"), deleting=True),
        pod({"type": "PodScheduled", "status": "True"}, node="gpu-1"),
        pod({"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}),
    ]
    found = unschedulable(pods)
    assert found == Unschedulable(2, "2026-01-02T03:00:30Z", "0/3 nodes are available: 3 Insufficient memory.")
    assert found.missing == ("memory",)
    assert unschedulable([pod(None), pod({"type": "PodScheduled", "status": "True"}, node="n")]) is None


def test_missing_resources_are_read_from_the_schedulers_words() -> None:
    assert pending(0).missing == ("nvidia.com/gpu",)
    both = Unschedulable(1, "", "0/2 nodes are available: 1 Insufficient cpu, 2 Insufficient nvidia.com/gpu.")
    assert both.missing == ("cpu", "nvidia.com/gpu")
    assert Unschedulable(1, "", "0/1 nodes are available: 1 node(s) didn't match Pod's node selector.").missing == ()


def test_promotion_is_not_done_while_an_old_pod_runs_beside_an_unplaced_new_one() -> None:
    # What the Deployment reports when its surge pod cannot be placed: every updated replica counted, 2 available
    # (one of them the OLD pod), 3 pods in all. Not rolled out: one pod still serves the BF16 model.
    stuck = baseline(2, promoted=True, updated_replicas=2, ready_replicas=2, available_replicas=2, pods=3)
    d = decide(spec(), status(P.PROMOTING), observations(baseline=stuck, canary=canary()), NOW)
    assert d.status.phase == P.PROMOTING
    assert d.status.message == "2/2 baseline pods updated, 2 ready, 1 old still running"
    done = baseline(2, promoted=True, pods=2)
    assert decide(spec(), status(P.PROMOTING), observations(baseline=done), NOW).status.phase == P.SUCCEEDED


def test_the_workload_reader_counts_every_revisions_pods() -> None:
    manifest = {"metadata": {"generation": 4}, "spec": {"replicas": 2}}
    state = workload_state("Deployment", {**manifest, "status": {"replicas": 3, "updatedReplicas": 2}})
    assert state is not None and state.pods == 3
    unreported = workload_state("Deployment", manifest)
    assert unreported is not None and unreported.pods is None


def test_a_promotion_stuck_on_full_nodes_takes_the_canarys_gpus() -> None:
    # The promoted baseline's surge pod cannot be placed while the canary holds its GPU (maxUnavailable 0: no old
    # pod goes first): the canary leaves now, not after a rollout that cannot finish.
    rolling = baseline(1, promoted=True, updated_replicas=1, ready_replicas=1, available_replicas=1, pods=2)
    obs = observations(baseline=rolling, canary=canary(1, 1), baseline_unschedulable=pending(10))
    d = decide(spec(), status(P.PROMOTING), obs, NOW)
    assert d.status.phase == P.PROMOTING
    assert "Delete Deployment/smollm2-canary" in actions(d)
    promoted = next(c for c in d.status.conditions if c.type == "Promoted")
    assert promoted.reason == "MakingRoom"
    assert promoted.message == (
        "1 new pod of Deployment llm unschedulable (no Node has a free nvidia.com/gpu): removing the canary now, its "
        "GPUs go to the rollout"
    )
    assert [e.reason for e in d.events] == ["CanaryMakesRoom"]
    # Once it is gone the rollout goes on as usual, and the promotion ends when it is done.
    gone = decide(spec(), d.status, observations(baseline=baseline(1, promoted=True, pods=1)), NOW)
    assert gone.status.phase == P.SUCCEEDED
