"""Webhook notifications of the phase changes a platform team cares about. Pure: what is due, what a receiver gets.

The source of truth is the status the core wrote: one status.history entry per phase change, and the Promoted
condition turning False with reason Reverted (core.rollout.reverts). Each such transition has an idempotency key
fixed by the object's uid and the transition (what happened, when), so a receiver can drop a copy. A delivery (one
target, one key) is due until status.notifications.delivered records it: the sender (services.notifier) posts it,
and the reconciler copies the keys it confirmed (HTTP 2xx) into the next status write. A restart therefore neither
repeats a recorded delivery nor loses one still due; one confirmed in the moment before the operator died is posted
again, with the same key (at least once)."""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

from pydantic import Field

from kvcal.core.guard.redact import redact
from kvcal.core.manifests.common import Owner
from kvcal.core.phases import LIFECYCLE, NotifyEvent
from kvcal.core.rollout.reverts import REVERTED
from kvcal.core.status.conditions import get_condition
from kvcal.core.timestamps import parse_rfc3339
from kvcal.models.base import Model
from kvcal.models.spec import DNS_LABEL_PATTERN
from kvcal.models.status import MAX_DELIVERED, KVCalibrationStatus, NotificationsStatus, Phase

NOTIFY_EVENTS: tuple[NotifyEvent, ...] = get_args(NotifyEvent)
# A transition older than this is history, not news: not sent after an operator upgrade that brings notifications,
# nor to a target added later. It also bounds how long an operator may stay down without losing one.
NOTIFY_WINDOW = timedelta(hours=24)
MESSAGE_CHARS = 512  # status.history messages are capped at this too (core.status.builder)
PAYLOAD_VERSION = 1
# Which phases notify is a fact of the phase table (its `notifies` column); Analyzing's becomes StepStarted past
# the first step.
_PHASE_EVENTS: dict[str, NotifyEvent] = {
    name: descriptor.notifies for name, descriptor in LIFECYCLE.phases.items() if descriptor.notifies is not None
}


class WebhookTarget(Model):
    """One receiver, as a cluster admin configured it (chart values notifications.webhooks[]). Its URL and token are
    files: the chart's mounts of Secrets of the operator's namespace, read at every delivery (a rotated Secret needs no
    restart). Nothing of a KVCalibration chooses where the operator posts."""

    name: str = Field(max_length=63, pattern=DNS_LABEL_PATTERN)
    format: Literal["json", "slack"] = "json"
    url_file: str
    token_file: str | None = None  # sent as Authorization: Bearer <the file's content>
    events: tuple[NotifyEvent, ...] = NOTIFY_EVENTS


@dataclass(frozen=True)
class Transition:
    """One phase change worth telling, read from status."""

    key: str  # the idempotency key: object uid / what / when
    event: NotifyEvent
    phase: str
    reason: str
    message: str
    at: str
    cause: str | None = None  # RolledBack: why it rolled back (AnalysisFailed, Aborted, CanaryNotReady, ...)
    step: int | None = None  # Analyzing: the traffic step, 1-based, of `steps`
    steps: int | None = None
    weight: int | None = None  # Analyzing: the canary's share of traffic, percent


@dataclass(frozen=True)
class Delivery:
    """One transition to one target: posted until a 2xx, recorded in status under `id`."""

    target: str
    owner: Owner
    transition: Transition

    @property
    def id(self) -> str:
        return delivery_id(self.target, self.transition.key)


def delivery_id(target: str, key: str) -> str:
    return f"{target}/{key}"


def transitions(uid: str, status: KVCalibrationStatus) -> list[Transition]:
    """Every transition in status worth telling, oldest first."""
    out: list[Transition] = []
    history = status.history
    for index, entry in enumerate(history):
        event: NotifyEvent | None = _PHASE_EVENTS.get(entry.phase)
        if event == "AnalysisStarted" and entry.step is not None and entry.step > 1:
            event = "StepStarted"  # the canary's weight went up
        if event is None:
            continue
        before = history[index - 1] if index > 0 else None
        out.append(
            Transition(
                key=f"{uid}/{entry.phase}/{entry.at}",
                event=event,
                phase=str(entry.phase),
                reason=entry.reason,
                message=entry.message,
                at=entry.at,
                cause=before.reason if entry.phase == Phase.ROLLED_BACK and before is not None else None,
                step=entry.step,
                steps=entry.steps,
                weight=entry.weight,
            )
        )
    promoted = get_condition(status.conditions, "Promoted")
    if promoted is not None and promoted.status == "False" and promoted.reason == REVERTED:
        at = promoted.last_transition_time
        out.append(
            Transition(
                key=f"{uid}/PromotionReverted/{at}",
                event="PromotionReverted",
                phase=str(status.phase),
                reason=promoted.reason,
                message=promoted.message,
                at=at,
            )
        )
    return out


def deliveries(owner: Owner, status: KVCalibrationStatus, targets: Sequence[WebhookTarget]) -> list[Delivery]:
    """Every delivery the status calls for (each target, each transition it asked for), delivered or not."""
    return [
        Delivery(target.name, owner, transition)
        for transition in transitions(owner.uid, status)
        for target in targets
        if transition.event in target.events
    ]


def due(owner: Owner, status: KVCalibrationStatus, targets: Sequence[WebhookTarget], now: datetime) -> list[Delivery]:
    """The deliveries status does not record as delivered, within NOTIFY_WINDOW of `now`."""
    delivered = set(status.notifications.delivered)
    return [
        delivery
        for delivery in deliveries(owner, status, targets)
        if delivery.id not in delivered and now - parse_rfc3339(delivery.transition.at) <= NOTIFY_WINDOW
    ]


def recorded(
    owner: Owner,
    status: KVCalibrationStatus,
    targets: Sequence[WebhookTarget],
    confirmed: Iterable[str],
    error: str | None,
) -> NotificationsStatus:
    """status.notifications with the deliveries the sender confirmed: bounded like the history it follows (an id
    whose transition left status.history, or whose target left the chart values, is dropped)."""
    current = [delivery.id for delivery in deliveries(owner, status, targets)]
    known = set(status.notifications.delivered) | set(confirmed)
    kept = [id_ for id_ in current if id_ in known][-MAX_DELIVERED:]
    return NotificationsStatus(delivered=kept, last_error=error)


def payload(target_format: str, owner: Owner, transition: Transition) -> dict[str, Any]:
    """The body posted: a generic JSON document, or Slack's incoming-webhook `{"text": ...}` (a Slack-compatible
    receiver refuses or ignores other fields: its idempotency key is in the Idempotency-Key header only)."""
    message = redact(transition.message)[:MESSAGE_CHARS]
    if target_format == "slack":
        return {"text": _slack_text(owner, transition, message)}
    body: dict[str, Any] = {
        "version": PAYLOAD_VERSION,
        "idempotencyKey": transition.key,
        "event": transition.event,
        "object": {"kind": "KVCalibration", "namespace": owner.namespace, "name": owner.name, "uid": owner.uid},
        "phase": transition.phase,
        "reason": transition.reason,
        "message": message,
        "at": transition.at,
    }
    if transition.cause is not None:
        body["cause"] = transition.cause
    if transition.step is not None:
        body["step"] = {"index": transition.step, "of": transition.steps, "weight": transition.weight}
    return body


_SLACK_ICONS: dict[NotifyEvent, str] = {
    "AnalysisStarted": ":mag:",
    "StepStarted": ":arrow_up:",
    "AwaitingPromotion": ":hourglass:",
    "Promoted": ":white_check_mark:",
    "RolledBack": ":leftwards_arrow_with_hook:",
    "Failed": ":x:",
    "PromotionReverted": ":warning:",
}


def _slack_text(owner: Owner, transition: Transition, message: str) -> str:
    what: str = transition.event
    if transition.step is not None:
        what += f" (step {transition.step}/{transition.steps}, weight {transition.weight}%)"
    if transition.cause is not None:
        what += f" ({transition.cause})"
    # Slack's mrkdwn escapes: &, < and > are control characters there.
    text = message.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return f"{_SLACK_ICONS[transition.event]} KVCalibration {owner.namespace}/{owner.name}: *{what}*\n{text}"
