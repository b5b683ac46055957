"""The next status being computed in one pass, shared by both machines (core.artifact, core.rollout) and decide().

A Builder accumulates the next status, the actions that make the world match it, the events that explain it and
when to look again; every phase change goes through the phase rules it carries (the table in core.phases satisfies
``PhaseRules``), so a move the table does not allow is an exception, never a silently corrupted status. Pure: no I/O,
`now` passed in. The builder sees the table only through that Protocol: the machines import the builder, the table
imports the machines, and nothing here imports either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from kvcal.core.observations import Action, Decision, Event, Observations
from kvcal.core.status.conditions import CONDITION_TYPES, get_condition, set_condition
from kvcal.core.status.events import history_event
from kvcal.core.timestamps import rfc3339
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import MAX_HISTORY, ConditionType, HistoryEntry, KVCalibrationStatus, Phase


@dataclass(frozen=True)
class StepEntered:
    """Which traffic step a move enters, recorded in its history entry (read by notifications, never parsed back
    out of the message)."""

    step: int  # 1-based
    steps: int
    weight: int | None  # None while the canary only receives a mirror


class PhaseFacts(Protocol):
    """What the builder reads of one phase's row."""

    @property
    def ready(self) -> bool: ...

    @property
    def warning(self) -> bool: ...


class PhaseRules(Protocol):
    """What the builder needs of the phase table: which moves are allowed, how often a phase is looked at, and
    each phase's row."""

    def __getitem__(self, phase: str) -> PhaseFacts: ...

    def check_transition(self, source: str, target: str) -> None: ...

    def poll_seconds(self, phase: str) -> float | None: ...

    def __contains__(self, phase: object) -> bool: ...


@dataclass
class Builder:
    """The next status being computed, plus the actions, events and annotation clears that go with it."""

    spec: KVCalibrationSpec | None
    start: KVCalibrationStatus
    obs: Observations
    now: datetime
    lifecycle: PhaseRules
    status: KVCalibrationStatus = field(init=False)
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    requeue: float | None = None

    def __post_init__(self) -> None:
        self.status = self.start.model_copy(update={"observed_generation": self.obs.generation})
        if not self.status.conditions:
            for condition_type in CONDITION_TYPES:
                self.condition(condition_type, "Unknown", "NotStarted", "")

    @property
    def phase(self) -> str:
        return self.status.phase

    def update(self, **fields: Any) -> None:
        self.status = self.status.model_copy(update=fields)

    def condition(self, type_: ConditionType, status: str, reason: str, message: str = "") -> None:
        now, generation = self.now, self.obs.generation
        self.update(conditions=set_condition(self.status.conditions, type_, status, reason, message, now, generation))

    def move(self, phase: str, reason: str, message: str, *, step: StepEntered | None = None) -> None:
        self.lifecycle.check_transition(self.phase, phase)
        at = rfc3339(self.now)
        where = {"step": step.step, "steps": step.steps, "weight": step.weight} if step is not None else {}
        entry = HistoryEntry(phase=phase, at=at, reason=reason, message=message[:512], **where)
        self.update(
            phase=phase,
            message=message,
            phase_started_at=at,
            history=[*self.status.history, entry][-MAX_HISTORY:],
        )
        # The reconciler sends this one from status.history (idempotently, surviving a restart); listed here so a
        # decision says everything it announces.
        self.events.append(history_event(entry, self.lifecycle[phase].warning))

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event("Warning" if type_ == "Warning" else "Normal", reason, message[:1024]))

    def wait(self, message: str, seconds: float | None = None) -> None:
        self.update(message=message)
        self.requeue = seconds

    def do(self, *actions: Action) -> None:
        # An action already queued in this pass is not queued again (e.g. a drained canary's deletes, then starting
        # over, which removes every child): doing it twice would change nothing.
        self.actions.extend(action for action in actions if action not in self.actions)

    def clear(self, annotation: str) -> None:
        """Remove a command annotation (kvcal.dev/promote, ...): after the status write, which must record what it
        caused first (a restart in between sees the annotation again, and its effect in the status)."""
        if annotation not in self.cleared:
            self.cleared.append(annotation)

    def finish(self) -> Decision:
        promoted = get_condition(self.status.conditions, "Promoted")
        reverted = promoted is not None and promoted.status == "False"  # in Succeeded: reverted (core.rollout)
        ready = self.phase in self.lifecycle and self.lifecycle[self.phase].ready and not reverted
        self.condition("Ready", "True" if ready else "False", str(self.phase), self.status.message or "")
        requeue = self.requeue if self.requeue is not None else self.lifecycle.poll_seconds(self.phase)
        if self.phase != self.start.phase:
            requeue = 0.0  # act on the new phase at once
        return Decision(self.status, tuple(self.actions), requeue, tuple(self.events), tuple(sorted(self.cleared)))


def blocked(draft: Builder, reason: str, message: str, seconds: float) -> None:
    """Wait with `message` in the status; a Warning event only when the message is new (not on every pass)."""
    if draft.start.message != message:
        draft.event("Warning", reason, message)
    draft.wait(message, seconds)


def reported(
    draft: Builder, type_: ConditionType, status: str, reason: str, message: str, event: tuple[str, str]
) -> None:
    """Set the condition, with `event` (type, reason) sent only when the condition takes this reason (not on every
    pass that keeps it)."""
    before = get_condition(draft.start.conditions, type_)
    if before is None or before.reason != reason:
        draft.event(event[0], event[1], message)
    draft.condition(type_, status, reason, message)


def fail(draft: Builder, reason: str, message: str) -> None:
    draft.move(Phase.FAILED, reason, message)


def no_baseline(spec: KVCalibrationSpec) -> str:
    return f"waiting for the baseline {spec.serving.baseline.workload}"
