"""core.notifications: which phase changes are told, to whom, with what key and body; what status records."""

from datetime import timedelta

from kvcal.core.decide import decide
from kvcal.core.manifests.traffic import plan_step
from kvcal.core.notifications import (
    MAX_DELIVERED,
    NOTIFY_WINDOW,
    WebhookTarget,
    deliveries,
    delivery_id,
    due,
    payload,
    recorded,
    transitions,
)
from kvcal.core.observations import ABORT_ANNOTATION
from kvcal.core.status.conditions import set_condition
from kvcal.core.timestamps import rfc3339
from kvcal.models.status import (
    MAX_HISTORY,
    CanaryStatus,
    HistoryEntry,
    KVCalibrationStatus,
    NotificationsStatus,
    Phase,
)
from tests.support.decide import ANALYZING, NOW, OWNER, baseline, canary, observations, spec, status

UID = OWNER.uid
JSON = WebhookTarget(name="ops", url_file="/u")
SLACK = WebhookTarget(name="chat", format="slack", url_file="/c", events=("RolledBack", "Failed"))
TWO_STEPS = spec(serving={"traffic": {"steps": [10, 50]}})


def analyzing_from_deploying(step_index: int) -> KVCalibrationStatus:
    """Deploying -> Analyzing as the real lifecycle writes it, at traffic step `step_index` (0-based)."""
    plan = plan_step(TWO_STEPS.serving.traffic, step_index, baseline().replicas)
    start = status(Phase.DEPLOYING, canary=CanaryStatus(step_index=step_index))
    ready = canary(replicas=plan.canary_replicas, ready=plan.canary_replicas)
    decision = decide(TWO_STEPS, start, observations(canary=ready), NOW)
    assert decision.status.phase == Phase.ANALYZING, decision.status.message
    return decision.status


def test_each_traffic_step_the_lifecycle_enters_is_told_with_its_step_and_weight() -> None:
    first, second = (transitions(UID, analyzing_from_deploying(step))[-1] for step in (0, 1))
    # The replicas router's weight is the canary's share of the pods: 1 of 3, then 2 of 4.
    weights = [plan_step(TWO_STEPS.serving.traffic, step, baseline().replicas).weight for step in (0, 1)]
    assert weights == [33, 50]
    assert (first.event, first.step, first.steps, first.weight) == ("AnalysisStarted", 1, 2, weights[0])
    assert (second.event, second.step, second.steps, second.weight) == ("StepStarted", 2, 2, weights[1])
    assert first.key == f"{UID}/Analyzing/{rfc3339(NOW)}"
    entry = analyzing_from_deploying(1).history[-1]
    assert (entry.step, entry.steps, entry.weight) == (2, 2, weights[1])  # recorded in status, for receivers


def test_the_step_is_read_from_the_history_entry_never_from_its_message() -> None:
    """A message reworded (or one that reads like another step) changes nothing a receiver gets."""
    entry = HistoryEntry(phase=Phase.ANALYZING, at=rfc3339(NOW), reason="CanaryReady", message="step 9/9: weight 99%")
    told = transitions(UID, status(Phase.ANALYZING, history=[entry.model_copy(update={"step": 2, "steps": 3})]))
    assert (told[-1].event, told[-1].step, told[-1].steps, told[-1].weight) == ("StepStarted", 2, 3, None)
    (shadow,) = transitions(UID, status(Phase.ANALYZING, history=[entry]))  # no step: the shadow stage
    assert (shadow.event, shadow.step, shadow.weight) == ("AnalysisStarted", None, None)


def rolled_back() -> KVCalibrationStatus:
    """Aborted in Analyzing, then the passes of the real lifecycle until RolledBack (the canary is gone)."""
    current = decide(spec(), ANALYZING, observations(gates={ABORT_ANNOTATION: "1"}), NOW).status
    for minute in range(1, 6):
        if current.phase == Phase.ROLLED_BACK:
            break
        current = decide(spec(), current, observations(), NOW + timedelta(minutes=minute)).status
    assert [h.phase for h in current.history][-2:] == [Phase.ROLLING_BACK, Phase.ROLLED_BACK]
    return current


def test_a_rollback_is_told_once_with_its_cause() -> None:
    """RollingBack is not told, RolledBack is, with the reason it rolled back."""
    (told,) = transitions(UID, rolled_back())
    assert (told.event, told.cause) == ("RolledBack", "Aborted")
    assert told.message.startswith("rolled back: aborted")


def test_phases_nobody_asked_about_are_not_told() -> None:
    history = [HistoryEntry(phase=phase, at=rfc3339(NOW), reason="r") for phase in Phase]
    told = {t.event for t in transitions(UID, KVCalibrationStatus(history=history))}
    assert told == {"AnalysisStarted", "AwaitingPromotion", "Promoted", "RolledBack", "Failed"}


def test_a_reverted_promotion_is_told_once_per_revert() -> None:
    succeeded = KVCalibrationStatus(phase=Phase.SUCCEEDED)
    reverted = set_condition(succeeded.conditions, "Promoted", "False", "Reverted", "args changed by kubectl", NOW, 1)
    later = NOW + timedelta(hours=1)
    again = set_condition(reverted, "Promoted", "True", "Restored", "", later, 1)
    again = set_condition(again, "Promoted", "False", "Reverted", "args changed again", later, 1)
    first = transitions(UID, succeeded.model_copy(update={"conditions": reverted}))
    second = transitions(UID, succeeded.model_copy(update={"conditions": again}))
    assert [t.event for t in first] == ["PromotionReverted"] == [t.event for t in second]
    assert first[0].key != second[0].key


def test_each_target_gets_the_events_it_asked_for() -> None:
    history = [
        HistoryEntry(phase=Phase.AWAITING_PROMOTION, at="2026-01-02T03:00:00Z", reason="AwaitingPromotion"),
        HistoryEntry(phase=Phase.FAILED, at="2026-01-02T03:01:00Z", reason="PromotionFailed"),
    ]
    found = deliveries(OWNER, KVCalibrationStatus(history=history), [JSON, SLACK])
    assert [(d.target, d.transition.event) for d in found] == [
        ("ops", "AwaitingPromotion"),
        ("ops", "Failed"),
        ("chat", "Failed"),
    ]


def test_due_leaves_out_what_status_records_and_what_is_too_old() -> None:
    fresh = HistoryEntry(phase=Phase.FAILED, at=rfc3339(NOW), reason="x")
    old = HistoryEntry(phase=Phase.ROLLED_BACK, at=rfc3339(NOW - NOTIFY_WINDOW - timedelta(seconds=1)), reason="y")
    start = KVCalibrationStatus(history=[old, fresh])
    assert [d.transition.event for d in due(OWNER, start, [JSON], NOW)] == ["Failed"]
    done = recorded(OWNER, start, [JSON], [delivery_id("ops", f"{UID}/Failed/{fresh.at}")], None)
    assert due(OWNER, start.model_copy(update={"notifications": done}), [JSON], NOW) == []


def test_recorded_keeps_only_ids_still_in_history_and_configured() -> None:
    entries = [HistoryEntry(phase=Phase.FAILED, at=rfc3339(NOW + timedelta(seconds=s)), reason="r") for s in range(3)]
    start = KVCalibrationStatus(history=entries)
    ids = [d.id for d in deliveries(OWNER, start, [JSON, SLACK])]
    assert len(ids) == 6
    kept = recorded(OWNER, start, [JSON, SLACK], ids, "webhook chat: HTTP 503")
    assert kept == NotificationsStatus(delivered=ids, last_error="webhook chat: HTTP 503")
    # The oldest entry left the (capped) history and the chat target left the chart values: their ids go.
    later = start.model_copy(update={"history": entries[1:], "notifications": kept})
    assert recorded(OWNER, later, [JSON], [], None).delivered == [i for i in ids[2:] if i.startswith("ops/")]
    assert MAX_DELIVERED >= (MAX_HISTORY + 1) * 2


def test_the_json_payload_names_the_object_the_transition_and_its_key() -> None:
    (transition,) = transitions(UID, rolled_back())
    body = payload("json", OWNER, transition)
    assert body == {
        "version": 1,
        "idempotencyKey": f"{UID}/RolledBack/{transition.at}",
        "event": "RolledBack",
        "object": {"kind": "KVCalibration", "namespace": "llm", "name": "smollm2", "uid": UID},
        "phase": "RolledBack",
        "reason": "RolledBack",
        "cause": "Aborted",
        "message": transition.message,
        "at": transition.at,
    }


def test_the_slack_payload_is_text_only_escaped_and_redacted() -> None:
    entry = HistoryEntry(phase=Phase.FAILED, at=rfc3339(NOW), reason="JobFailed", message="<b> & token=hunter2")
    (transition,) = transitions(UID, KVCalibrationStatus(history=[entry]))
    body = payload("slack", OWNER, transition)
    assert list(body) == ["text"]
    assert body["text"] == ":x: KVCalibration llm/smollm2: *Failed*\n&lt;b&gt; &amp; token=***"
    step = transitions(UID, analyzing_from_deploying(1))[-1]
    assert "*StepStarted (step 2/2, weight 50%)*" in payload("slack", OWNER, step)["text"]
