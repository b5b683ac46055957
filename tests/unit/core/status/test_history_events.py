"""Lifecycle events from status.history: exactly one Event per entry, even when the operator dies between the status
write and the events (a restart re-sends; the API's AlreadyExists stops a second copy)."""

from datetime import timedelta

import pytest

from kvcal.core.decide import decide
from kvcal.core.observations import ABORT_ANNOTATION, PROMOTE_ANNOTATION
from kvcal.core.spechash import spec_hash
from kvcal.core.status.events import history_event_name
from kvcal.models.status import CalibrationStatus, HistoryEntry, KVCalibrationStatus, Phase
from kvcal.ports import Manifest
from kvcal.services.reconciler import Reconciler
from tests.support.decide import NOW, POLICY, observations, spec
from tests.support.fakekube import FakeKube, kvcal


class Killed(BaseException):
    """The process dying: not an Exception, so nothing in the reconciler catches it."""


class DiesAfterStatusWrite(FakeKube):
    def __init__(self, objects: list[Manifest]) -> None:
        super().__init__(objects)
        self.alive = True

    def replace_status(self, namespace: str, name: str, resource_version: str, status: Manifest) -> None:
        super().replace_status(namespace, name, resource_version, status)
        if self.alive:
            raise Killed


def test_event_name_is_fixed_by_object_uid_and_entry() -> None:
    entry = HistoryEntry(phase=Phase.CALIBRATING, at="2026-01-02T03:04:05Z", reason="CalibrationStarted")
    name = history_event_name("smollm2", "u1", entry)
    assert name == history_event_name("smollm2", "u1", entry) and name.startswith("smollm2.")
    assert name != history_event_name("smollm2", "u2", entry)
    assert name != history_event_name("smollm2", "u1", entry.model_copy(update={"at": "2026-01-02T03:04:06Z"}))


def test_killed_between_status_write_and_events_the_restart_sends_them_once() -> None:
    kube = DiesAfterStatusWrite([kvcal()])
    with pytest.raises(Killed):
        Reconciler(kube, clock=lambda: NOW, policy=POLICY).reconcile("llm", "smollm2")
    assert kube.objects[("KVCalibration", "smollm2")]["status"]["phase"] == "Calibrating"
    assert not [c for c in kube.calls if c.startswith("event")]
    kube.alive = False
    restarted = Reconciler(kube, clock=lambda: NOW, policy=POLICY)
    restarted.reconcile("llm", "smollm2")
    restarted.reconcile("llm", "smollm2")
    Reconciler(kube, clock=lambda: NOW, policy=POLICY).reconcile(
        "llm", "smollm2"
    )  # another restart: AlreadyExists, not a copy
    assert [c for c in kube.calls if c.startswith("event")] == ["event CalibrationStarted"]


def test_entries_older_than_the_event_ttl_are_not_resent() -> None:
    kube = FakeKube([kvcal()])
    Reconciler(kube, clock=lambda: NOW, policy=POLICY).reconcile("llm", "smollm2")
    kube.event_names.clear()  # the API server dropped the Event after its TTL
    Reconciler(kube, clock=lambda: NOW + timedelta(hours=2), policy=POLICY).reconcile("llm", "smollm2")
    assert [c for c in kube.calls if c.startswith("event")] == ["event CalibrationStarted"]


@pytest.mark.parametrize(
    ("phase", "gate"), [(Phase.ROLLING_BACK, ABORT_ANNOTATION), (Phase.PROMOTING, PROMOTE_ANNOTATION)]
)
def test_a_gate_seen_again_after_a_restart_is_cleared_without_a_warning(phase: Phase, gate: str) -> None:
    """Killed after writing the phase a gate caused, before clearing the gate: the restart does not say "ignored"."""
    status = KVCalibrationStatus(phase=phase, calibration=CalibrationStatus(job="j", spec_hash=spec_hash(spec())))
    d = decide(spec(), status, observations(gates={gate: "1"}), NOW)
    assert gate in d.cleared_annotations
    assert not [e for e in d.events if e.reason.endswith("Ignored")]
