"""act: carrying out what `decide` returned, against the API and the router.

Actions are idempotent (deterministic names, create-if-absent), so a pass that dies halfway is finished by the next.
A weight is set compare-and-set: the router is told the (weight, mirror) the decision was made on, and a route that
changed since raises Conflict, so the pass re-reads and judges the edit (WeightDrift) before undoing it.

Lifecycle events are sent from status.history, each under a name fixed by (object uid, entry): a pass re-sends any
entry whose Event it has not seen created (the API's AlreadyExists counts as sent), so an operator killed between the
status write and the events loses none and sends none twice. Other events (WeightDrift, *Ignored) stay best effort:
one per pass that decides them, lost if the process dies first.
"""

import logging
from datetime import datetime, timedelta

from kvcal.core.manifests import FIELD_MANAGER, Owner
from kvcal.core.manifests.common import LABEL_CALIBRATION, LABEL_MANAGED_BY, MANAGED_BY, label_value
from kvcal.core.observations import (
    Apply,
    ApplyOwnedFields,
    ChildKind,
    Create,
    Decision,
    Delete,
    Event,
    ScaleBaseline,
    SetJobDeadline,
    SetWeight,
)
from kvcal.core.phases import LIFECYCLE
from kvcal.core.status.events import history_event, history_event_name
from kvcal.core.timestamps import parse_rfc3339
from kvcal.metrics import OperatorMetrics
from kvcal.models.status import HistoryEntry, KVCalibrationStatus
from kvcal.ports import Kube, Manifest, Routing
from kvcal.services.observe import PassAdapters

log = logging.getLogger(__name__)


def lifecycle_event(entry: HistoryEntry) -> Event:
    """The Event of a status.history entry: Warning where the phase table says so (a phase this operator does not
    know, written by another version, is Normal)."""
    return history_event(entry, entry.phase in LIFECYCLE and LIFECYCLE[entry.phase].warning)


# The API server drops Events after --event-ttl (1 h by default): an older entry is not re-sent after a restart, where
# AlreadyExists could no longer tell that it was sent.
EVENT_RESEND_WINDOW = timedelta(minutes=50)
# What the delete handler removes: the kinds kvcal creates, found by the labels it puts on them.
CHILD_KINDS: tuple[ChildKind, ...] = ("Deployment", "StatefulSet", "Service", "Job", "ConfigMap")


class Actor:
    """Acts for one operator process; remembers which history Events exist, so a pass does not re-send them."""

    def __init__(self, kube: Kube, metrics: OperatorMetrics | None = None) -> None:
        self.kube = kube
        self.metrics = metrics
        self._sent_events: dict[str, set[str]] = {}  # object uid -> history Event names known to exist

    def act(self, owner: Owner, decision: Decision, adapters: PassAdapters | None, seen: Routing | None = None) -> None:
        """The decision's actions, in order. `seen`: the route's (weight, mirror) the decision was made on; a route
        that changed since raises Conflict, so the pass re-reads and judges the edit (WeightDrift) before undoing it."""
        ns = owner.namespace
        for action in decision.actions:
            match action:
                case Create(manifest=m):
                    self.kube.create(m)
                case Apply(manifest=m):
                    self.kube.apply(m)
                case ApplyOwnedFields(manifest=m):
                    self.kube.apply_owned_fields(m, FIELD_MANAGER)
                case Delete(kind=kind, name=name):
                    self.kube.delete(kind, ns, name)
                case ScaleBaseline(kind=kind, name=name, replicas=replicas):
                    self.kube.scale(kind, ns, name, replicas)
                case SetJobDeadline(name=name, seconds=seconds):
                    self.kube.set_job_deadline(ns, name, seconds)
                case SetWeight(weight=weight, mirror=mirror):
                    router = adapters.router if adapters else None
                    if router is not None and adapters is not None:
                        router.set_weight(adapters.target, weight, mirror, seen)
                        seen = (weight, mirror) if seen is not None else None

    def after_write(self, obj: Manifest, owner: Owner, decision: Decision, now: datetime) -> None:
        """What follows the status write: the history Events, the decision's other events, the gate annotations it
        acted on cleared (after the write, so a pass that dies first sees the gate again)."""
        self.send_history_events(obj, decision.status, now)
        lifecycle = {lifecycle_event(entry) for entry in decision.status.history}
        for event in decision.events:
            if self.metrics and event.type == "Warning":
                self.metrics.warned(event.reason)
            if event in lifecycle:
                continue  # sent from the history above
            try:
                self.kube.emit_event(obj, event.type, event.reason, event.message)
            except Exception:  # an event is best effort: never fail a reconcile over it
                log.exception("could not emit event %s", event.reason)
        if decision.cleared_annotations:
            self.kube.remove_annotations(owner.namespace, owner.name, list(decision.cleared_annotations))

    def send_history_events(self, obj: Manifest, status: KVCalibrationStatus, now: datetime) -> None:
        """One Event per status.history entry, exactly once across restarts (see the module docstring)."""
        uid = obj["metadata"]["uid"]
        sent = self._sent_events.get(uid, set())
        current = set()
        for entry in status.history:
            name = history_event_name(obj["metadata"]["name"], uid, entry)
            current.add(name)
            if name in sent:
                continue
            if now - parse_rfc3339(entry.at) > EVENT_RESEND_WINDOW:
                sent.add(name)
                continue
            event = lifecycle_event(entry)
            try:
                self.kube.emit_event(obj, event.type, event.reason, event.message, name=name)
                sent.add(name)
            except Exception:  # the next pass tries again
                log.exception("could not emit event %s", event.reason)
        self._sent_events[uid] = sent & current

    def forget(self, uid: str) -> None:
        """The object is being deleted: no history entry comes after it."""
        self._sent_events.pop(uid, None)

    def remove_children(self, namespace: str, name: str) -> list[str]:
        """Delete every child kvcal created for `name` (found by its labels); returns those it deleted."""
        removed: list[str] = []
        selector = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_CALIBRATION: label_value(name)}
        for kind in CHILD_KINDS:
            for child in self.kube.list(kind, namespace, selector):
                child_name = child["metadata"]["name"]
                if self.kube.delete(kind, namespace, child_name):
                    removed.append(f"{kind}/{child_name}")
        return removed
