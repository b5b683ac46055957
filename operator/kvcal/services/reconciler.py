"""observe -> decide -> act -> one status write (+ events).

The only place where the pure core meets the adapters, kept to the wiring: a pass reads the KVCalibration and what
its phase looks at fresh from the API (services.observe), lets `decide` compute the whole next status and the actions,
performs the actions (services.act), writes the status once with the resourceVersion it read (a 409 re-runs the
pass), then emits the events and clears the gate annotations it acted on.

Webhook notifications (services.notifier) follow status the same way: the deliveries the sender confirmed go into the
pass's status write, and what the written status still calls for is handed to the sender after it.
"""

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from kvcal.core.decide import decide
from kvcal.core.deletion import decide_deletion
from kvcal.core.guard.policy import Policy
from kvcal.core.manifests import Owner
from kvcal.core.rollout.reverts import is_reverted
from kvcal.core.status.conditions import get_condition, set_condition
from kvcal.core.timestamps import parse_rfc3339
from kvcal.metrics import OperatorMetrics
from kvcal.models.status import ConditionType, KVCalibrationStatus, Measurement, NoiseStatus
from kvcal.ports import AnalysisBackends, Conflict, Kube
from kvcal.services.act import EVENT_RESEND_WINDOW, Actor
from kvcal.services.failures import describe_failure
from kvcal.services.notifier import Notifier
from kvcal.services.observe import (
    Observer,
    PassAdapters,
    job_state,
    parse_spec,
    parse_status,
    routed,
    workload_state,
)

__all__ = [
    "EVENT_RESEND_WINDOW",
    "MAX_CONFLICT_RETRIES",
    "RECONCILE_ERROR",
    "Cleanup",
    "PassAdapters",
    "Reconciler",
    "job_state",
    "parse_spec",
    "parse_status",
    "routed",
    "workload_state",
]

log = logging.getLogger(__name__)
MAX_CONFLICT_RETRIES = 3
RECONCILE_ERROR: ConditionType = "ReconcileError"


@dataclass
class Cleanup:
    """One pass of the delete handler: `retry_after` None once every child is deleted."""

    removed: list[str] = field(default_factory=list)
    retry_after: float | None = None


def _recovered(status: KVCalibrationStatus, now: datetime, generation: int) -> KVCalibrationStatus:
    """A pass that got this far succeeded: a ReconcileError left by an earlier one turns False."""
    previous = get_condition(status.conditions, RECONCILE_ERROR)
    if previous is None or previous.status != "True":
        return status
    message = f"the last pass succeeded (before: {previous.message})"
    conditions = set_condition(status.conditions, RECONCILE_ERROR, "False", "Recovered", message, now, generation)
    return status.model_copy(update={"conditions": conditions})


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        clock: Callable[[], datetime],
        backends: AnalysisBackends | None = None,
        metrics: OperatorMetrics | None = None,
        policy: Policy | None = None,
        notifier: Notifier | None = None,
        monotonic: Callable[[], float] = time.monotonic,  # times a pass for the metrics; a test passes its own
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.backends = backends
        self.metrics = metrics
        # The security policy (chart values policy.*). Its calibrator image (chart value jobImages.calibrator) goes to
        # the core beside the spec, never into it: the spec hash covers only what the user declared.
        self.policy = policy or Policy()
        self.notifier = notifier  # webhook notifications (chart values notifications.webhooks); None: none
        self.monotonic = monotonic
        self.observer = Observer(kube, self.policy, backends)
        self.actor = Actor(kube, metrics)  # holds the history Events this process knows exist

    def reconcile(self, namespace: str, name: str) -> float | None:
        """One pass; returns seconds until the next one (None: only when something changes)."""
        started = self.monotonic()
        result = "error"
        try:
            for _ in range(MAX_CONFLICT_RETRIES):
                try:
                    requeue = self._pass(namespace, name)
                    result = "ok"
                    return requeue
                except Conflict as e:
                    result = "conflict"
                    log.info("%s; re-reading", e)
            return 1.0
        except Exception as e:
            self._report_failure(namespace, name, e)
            raise  # the handler logs it and retries with backoff
        finally:
            if self.metrics:
                self.metrics.reconciled(result, self.monotonic() - started)

    def measure(
        self,
        adapters: PassAdapters,
        now: datetime,
        step_seconds: float | None = None,
        noise: Sequence[NoiseStatus] = (),
    ) -> list[Measurement]:
        """One interval's measurements and probes (services.observe)."""
        return self.observer.measure(adapters, now, step_seconds, noise)

    def _report_failure(self, namespace: str, name: str, error: Exception) -> None:
        """The failed pass wrote no status: say so in the ReconcileError condition, a Warning event and a metric."""
        reason, message = describe_failure(error)
        if self.metrics:
            self.metrics.reconcile_failed(reason)
        try:
            obj = self.kube.get("KVCalibration", namespace, name)
            if obj is None:
                return
            status = parse_status(obj)
            previous = get_condition(status.conditions, RECONCILE_ERROR)
            generation = int(obj["metadata"].get("generation", 1))
            conditions = set_condition(
                status.conditions, RECONCILE_ERROR, "True", reason, message, self.clock(), generation
            )
            if previous is None or previous.status != "True" or previous.message != message:
                self.kube.replace_status(
                    namespace,
                    name,
                    obj["metadata"]["resourceVersion"],
                    status.model_copy(update={"conditions": conditions}).to_wire(),
                )
                if self.metrics:
                    self.metrics.warned("ReconcileError")
                self.kube.emit_event(obj, "Warning", "ReconcileError", f"{message} (retrying with backoff)")
        except Exception:  # reporting is best effort: the API may be what failed
            log.exception("could not report the failed reconcile of %s/%s", namespace, name)

    def _pass(self, namespace: str, name: str) -> float | None:
        obj = self.kube.get("KVCalibration", namespace, name)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            if self.metrics:
                self.metrics.set_phase(namespace, name, None)
                self.metrics.set_capacity(namespace, name, None)
            return None
        now = self.clock()
        spec, spec_error = parse_spec(obj)
        status = parse_status(obj)
        owner = Owner(name, namespace, obj["metadata"]["uid"])
        adapters = self.observer.adapters(owner, spec) if spec else None
        obs = self.observer.observe(obj, owner, spec, spec_error, status, now, adapters)
        decision = decide(spec, status, obs, now, on_unexpected="block")
        if decision.unexpected is not None:
            log.error("%s/%s: blocked by an unexpected error", namespace, name, exc_info=decision.unexpected)
        self.actor.act(owner, decision, adapters, routed(obs))
        new_status = _recovered(decision.status, now, obs.generation)
        if self.notifier:  # the deliveries it confirmed go into this write (module docstring)
            new_status = self.notifier.record(owner, new_status)
        if new_status != status:
            self.kube.replace_status(namespace, name, obj["metadata"]["resourceVersion"], new_status.to_wire())
        if self.notifier:  # what the written status calls for, posted in the background
            self.notifier.submit(owner, new_status, now)
        self.actor.after_write(obj, owner, decision, now)
        self._gauges(owner, status, decision.status, now)
        return decision.requeue_after

    def _gauges(self, owner: Owner, before: KVCalibrationStatus, after: KVCalibrationStatus, now: datetime) -> None:
        if not self.metrics:
            return
        self.metrics.set_phase(owner.namespace, owner.name, after.phase)
        self.metrics.set_capacity(owner.namespace, owner.name, after.capacity)
        self.metrics.set_reverted(owner.namespace, owner.name, is_reverted(after))
        if after.phase != before.phase and before.phase_started_at:
            started = parse_rfc3339(before.phase_started_at)
            self.metrics.phase_left(before.phase, (now - started).total_seconds())

    def cleanup(self, namespace: str, name: str) -> Cleanup:
        """On delete: take the canary out of traffic (core.deletion; the drain state goes to status, so a restart
        resumes it), then remove every child we created (canary, Jobs, ConfigMaps); the baseline is never touched."""
        for _ in range(MAX_CONFLICT_RETRIES):
            try:
                retry_after = self._drain_for_deletion(namespace, name)
                break
            except Conflict as e:
                log.info("%s; re-reading", e)
        else:
            retry_after = 1.0
        if retry_after is not None:
            return Cleanup(retry_after=retry_after)
        return Cleanup(self.actor.remove_children(namespace, name))

    def _drain_for_deletion(self, namespace: str, name: str) -> float | None:
        obj = self.kube.get("KVCalibration", namespace, name)
        if obj is None:
            return None
        meta = obj["metadata"]
        self.actor.forget(meta["uid"])
        if self.notifier:
            self.notifier.forget(meta["uid"])
        now = self.clock()
        spec, _ = parse_spec(obj)
        status = parse_status(obj)
        owner = Owner(meta["name"], meta["namespace"], meta["uid"])
        adapters = self.observer.adapters(owner, spec) if spec else None
        obs = self.observer.for_deletion(owner, int(meta.get("generation", 1)), spec, adapters)
        decision = decide_deletion(spec, status, obs, now)
        self.actor.act(owner, decision, adapters, routed(obs))
        if decision.requeue_after is not None and decision.status != status:  # the drain resumes from status
            self.kube.replace_status(owner.namespace, owner.name, meta["resourceVersion"], decision.status.to_wire())
        return decision.requeue_after
