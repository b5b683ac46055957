"""observe -> decide -> act -> one status write (+ events).

The only place where the pure core meets the adapters. A pass reads the KVCalibration and its children fresh from the
API, lets `decide` compute the whole next status and the actions, performs the actions (idempotent: deterministic
names, create-if-absent), writes the status once with the resourceVersion it read (a 409 re-runs the pass), then
emits the events and clears the gate annotations it acted on.

Lifecycle events are sent from status.history, each under a name fixed by (object uid, entry): a pass re-sends any
entry whose Event it has not seen created (the API's AlreadyExists counts as sent), so an operator killed between the
status write and the events loses none and sends none twice. Other events (WeightDrift, *Ignored) stay best effort:
one per pass that decides them, lost if the process dies first.

Webhook notifications (services.notifier) follow status the same way: the deliveries the sender confirmed go into the
pass's status write, and what the written status still calls for is handed to the sender after it.
"""

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property

from pydantic import ValidationError

from kvcal.core.analysis.capacity import KVCacheReadings
from kvcal.core.analysis.ranktest import step_window_seconds
from kvcal.core.analysis.verdict import error_measurement
from kvcal.core.decide import decide, measurement_due
from kvcal.core.deletion import decide_deletion
from kvcal.core.guard.policy import Policy
from kvcal.core.manifests import FIELD_MANAGER, Owner, calibration_job_name, canary_name, verification_job_name
from kvcal.core.manifests.common import LABEL_CALIBRATION, LABEL_MANAGED_BY, MANAGED_BY, label_value, match_labels
from kvcal.core.manifests.endpoints import canary_pod_labels, pod_ready, probe_urls
from kvcal.core.manifests.pool import canary_picker_name, canary_pool_name, picker_service_name
from kvcal.core.observations import (
    GATE_ANNOTATIONS,
    Apply,
    ApplyOwnedFields,
    ChildKind,
    Create,
    Decision,
    Delete,
    DeploymentState,
    JobState,
    Observations,
    PoolState,
    SetWeight,
)
from kvcal.core.phases import LIFECYCLE
from kvcal.core.problems import NeedsFix
from kvcal.core.rollout.reverts import is_reverted
from kvcal.core.spechash import effective_spec_hash
from kvcal.core.status.conditions import get_condition, set_condition
from kvcal.core.status.events import history_event, history_event_name
from kvcal.core.timestamps import parse_rfc3339, rfc3339
from kvcal.metrics import OperatorMetrics
from kvcal.models.errors import describe
from kvcal.models.spec import KVCalibrationSpec, WorkloadKind
from kvcal.models.status import ConditionType, KVCalibrationStatus, Measurement, Phase
from kvcal.ports import AnalysisBackends, Conflict, Kube, Manifest, MetricsSource, Probes, Router, Routing, Target
from kvcal.services.failures import describe_failure
from kvcal.services.notifier import Notifier

log = logging.getLogger(__name__)
MAX_CONFLICT_RETRIES = 3
# The API server drops Events after --event-ttl (1 h by default): an older entry is not re-sent after a restart, where
# AlreadyExists could no longer tell that it was sent.
EVENT_RESEND_WINDOW = timedelta(minutes=50)
RECONCILE_ERROR: ConditionType = "ReconcileError"


@dataclass
class Cleanup:
    """One pass of the delete handler: `retry_after` None once every child is deleted."""

    removed: list[str] = field(default_factory=list)
    retry_after: float | None = None


@dataclass(frozen=True)
class PassAdapters:
    """The analysis adapters of one pass for one KVCalibration: each built at most once, and only if the pass uses
    it (building one may read the cluster: the probes read their ConfigMaps)."""

    target: Target
    backends: AnalysisBackends | None

    @cached_property
    def metrics_source(self) -> MetricsSource | None:
        return self.backends.metrics_source(self.target) if self.backends else None

    @cached_property
    def probes(self) -> Probes | None:
        return self.backends.probes(self.target) if self.backends else None

    @cached_property
    def router(self) -> Router | None:
        return self.backends.router(self.target) if self.backends else None


def parse_spec(obj: Manifest) -> tuple[KVCalibrationSpec | None, str | None]:
    try:
        return KVCalibrationSpec.model_validate(obj.get("spec") or {}), None
    except ValidationError as e:
        return None, "; ".join(describe(e))[:1024]


def parse_status(obj: Manifest) -> KVCalibrationStatus:
    try:
        return KVCalibrationStatus.model_validate(obj.get("status") or {})
    except ValidationError as e:
        log.warning("unreadable status of %s, starting over: %s", obj["metadata"]["name"], e)
        return KVCalibrationStatus()


def job_state(job: Manifest | None, message: Callable[[str], str | None]) -> JobState | None:
    """Summarise a Job the way the Job controller reports it; `message` reads the pod's termination message."""
    if job is None:
        return None
    name = job["metadata"]["name"]
    deleting = bool(job["metadata"].get("deletionTimestamp"))
    for cond in job.get("status", {}).get("conditions") or []:
        if cond.get("status") != "True" or cond.get("type") not in ("Complete", "Failed"):
            continue
        text = message(name) or cond.get("message") or ""
        if cond["type"] == "Complete":
            return JobState(name, "Succeeded", text, cond.get("reason", ""), deleting)
        return JobState(name, "Failed", text, cond.get("reason", ""), deleting)
    return JobState(name, "Running", deleting=deleting)


def workload_state(kind: WorkloadKind, workload: Manifest | None) -> DeploymentState | None:
    """A Deployment's or StatefulSet's rollout state. Both report replicas, readyReplicas, updatedReplicas,
    availableReplicas and observedGeneration with the same meaning. Only a Deployment has a progress deadline (its
    Progressing condition); a StatefulSet has none, so kvcal waits for it, saying how many pods are ready, until it
    is ready or aborted. A StatefulSet's rollout is finished once its currentRevision is its updateRevision."""
    if workload is None:
        return None
    status = workload.get("status") or {}
    stuck = any(
        c.get("type") == "Progressing" and c.get("status") == "False" and c.get("reason") == "ProgressDeadlineExceeded"
        for c in status.get("conditions") or []
    )
    pending = kind == "StatefulSet" and status.get("currentRevision") != status.get("updateRevision")
    return DeploymentState(
        manifest=workload,
        replicas=int(workload["spec"].get("replicas", 1)),
        ready_replicas=int(status.get("readyReplicas", 0)),
        updated_replicas=int(status.get("updatedReplicas", 0)),
        available_replicas=int(status.get("availableReplicas", 0)),
        generation=int(workload["metadata"].get("generation", 1)),
        observed_generation=int(status.get("observedGeneration", 0)),
        progress_deadline_exceeded=stuck,
        revision_pending=pending,
    )


def routed(obs: Observations) -> Routing | None:
    """The route's (weight, mirror) the pass read; None where it read none."""
    return None if obs.routed_weight is None else (obs.routed_weight, obs.routed_mirror)


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
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.backends = backends
        self.metrics = metrics
        # The security policy (chart values policy.*). Its calibrator image (chart value jobImages.calibrator) goes to
        # the core beside the spec, never into it: the spec hash covers only what the user declared.
        self.policy = policy or Policy()
        self._sent_events: dict[str, set[str]] = {}  # object uid -> history Event names known to exist
        self.notifier = notifier  # webhook notifications (chart values notifications.webhooks); None: none

    def reconcile(self, namespace: str, name: str) -> float | None:
        """One pass; returns seconds until the next one (None: only when something changes)."""
        started = time.monotonic()
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
                self.metrics.reconciled(result, time.monotonic() - started)

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
        adapters = self.adapters(owner, spec) if spec else None
        obs = self.observe(obj, owner, spec, spec_error, status, now, adapters)
        decision = decide(spec, status, obs, now, on_unexpected="block")
        if decision.unexpected is not None:
            log.error("%s/%s: blocked by an unexpected error", namespace, name, exc_info=decision.unexpected)
        self.act(owner, decision, adapters, routed(obs))
        new_status = _recovered(decision.status, now, obs.generation)
        if self.notifier:  # the deliveries it confirmed go into this write (module docstring)
            new_status = self.notifier.record(owner, new_status)
        if new_status != status:
            self.kube.replace_status(namespace, name, obj["metadata"]["resourceVersion"], new_status.to_wire())
        if self.notifier:  # what the written status calls for, posted in the background
            self.notifier.submit(owner, new_status, now)
        self._after_write(obj, owner, status, decision, now)
        return decision.requeue_after

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
            event = history_event(entry)
            try:
                self.kube.emit_event(obj, event.type, event.reason, event.message, name=name)
                sent.add(name)
            except Exception:  # the next pass tries again
                log.exception("could not emit event %s", event.reason)
        self._sent_events[uid] = sent & current

    def _after_write(
        self, obj: Manifest, owner: Owner, before: KVCalibrationStatus, decision: Decision, now: datetime
    ) -> None:
        self.send_history_events(obj, decision.status, now)
        lifecycle = {history_event(entry) for entry in decision.status.history}
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
        if self.metrics:
            self.metrics.set_phase(owner.namespace, owner.name, decision.status.phase)
            self.metrics.set_capacity(owner.namespace, owner.name, decision.status.capacity)
            self.metrics.set_reverted(owner.namespace, owner.name, is_reverted(decision.status))
            if decision.status.phase != before.phase and before.phase_started_at:
                started = parse_rfc3339(before.phase_started_at)
                self.metrics.phase_left(before.phase, (now - started).total_seconds())

    def observe(
        self,
        obj: Manifest,
        owner: Owner,
        spec: KVCalibrationSpec | None,
        spec_error: str | None,
        status: KVCalibrationStatus,
        now: datetime,
        adapters: PassAdapters | None,
    ) -> Observations:
        meta = obj["metadata"]
        annotations: Mapping[str, str] = meta.get("annotations") or {}
        gates = {k: v for k, v in annotations.items() if k in GATE_ANNOTATIONS and v}
        generation = int(meta.get("generation", 1))
        base = Observations(owner, generation, gates=gates, spec_error=spec_error, policy=self.policy)
        if spec is None or adapters is None:
            return base
        current_hash = effective_spec_hash(spec, status.calibration.spec_hash, self.policy.calibrator_image)
        ns, needs = owner.namespace, LIFECYCLE.observes(status.phase)
        read_messages = status.phase not in LIFECYCLE.names("terminal")

        def message(job: str) -> str | None:
            return self.kube.termination_message(ns, job) if read_messages else None

        def job(observation: str, name: str) -> JobState | None:
            return job_state(self.kube.get("Job", ns, name), message) if observation in needs else None

        baseline = spec.serving.baseline

        def workload(observation: str, name: str) -> DeploymentState | None:  # the canary has the baseline's kind
            if observation not in needs:
                return None
            return workload_state(baseline.kind, self.kube.get(baseline.kind, ns, name))

        serving_job_name = status.serving.verification.job if status.phase == Phase.SUCCEEDED else None
        serving_job = (
            job_state(self.kube.get("Job", ns, serving_job_name), lambda job: self.kube.termination_message(ns, job))
            if serving_job_name
            else None
        )
        routed_weight, routed_mirror = self.routing(adapters) if "routed_weight" in needs else (None, None)
        obs = Observations(
            owner=owner,
            generation=base.generation,
            gates=gates,
            calibration_job=job("calibration_job", calibration_job_name(owner.name, current_hash)),
            verification_job=job("verification_job", verification_job_name(owner.name, current_hash)),
            canary=workload("canary", canary_name(owner.name)),
            baseline=workload("baseline", baseline.deployment),
            baseline_service=self.kube.get("Service", ns, baseline.service) if "baseline_service" in needs else None,
            policy=self.policy,
            routed_weight=routed_weight,
            routed_mirror=routed_mirror,
            gateway_features=self.gateway_features(adapters) if "gateway_features" in needs else None,
            inference_pool=self.pool_state(owner, spec) if "inference_pool" in needs else None,
            serving_verification_job=serving_job,
        )
        if measurement_due(spec.analysis, status, now):
            step_seconds = step_window_seconds(spec.analysis, status.analysis, now)
            measurements = tuple(self.measure(adapters, now, step_seconds))
            obs = Observations(**{**obs.__dict__, "measurements": measurements, "kv_cache": self.kv_cache(adapters)})
        return obs

    def routing(self, adapters: PassAdapters) -> Routing:
        """The canary's weight and mirrored percent as the router reads them back."""
        router = adapters.router
        return (
            (None, None) if router is None else (router.get_weight(adapters.target), router.get_mirror(adapters.target))
        )

    def pool_state(self, owner: Owner, spec: KVCalibrationSpec) -> PoolState | None:
        """Router inference-pool (where the chart allows it): the baseline's pool and the Service of its endpoint
        picker (with the namespace's Deployments, to find the picker, until the canary's copy exists), and the
        canary's pool, picker and ready endpoints (core.rollout.pool)."""
        traffic, ns = spec.serving.traffic, owner.namespace
        if traffic.router != "inference-pool" or traffic.inference_pool is None or not self.policy.inference_pool:
            return None
        baseline_pool = self.kube.get("InferencePool", ns, traffic.inference_pool)
        picker_service: Manifest | None = None
        if baseline_pool is not None:
            with contextlib.suppress(NeedsFix):  # decide() says why the picker cannot be copied
                picker_service = self.kube.get("Service", ns, picker_service_name(baseline_pool))
        canary_pool = self.kube.get("InferencePool", ns, canary_pool_name(owner.name))
        picker = workload_state("Deployment", self.kube.get("Deployment", ns, canary_picker_name(owner.name)))
        need_deployments = picker is None and picker_service is not None
        deployments = tuple(self.kube.list("Deployment", ns, {})) if need_deployments else ()
        selector = match_labels(canary_pool)
        ready = sum(1 for pod in self.kube.list("Pod", ns, selector) if pod_ready(pod)) if selector else 0
        return PoolState(baseline_pool, picker_service, deployments, canary_pool, picker, ready)

    def gateway_features(self, adapters: PassAdapters) -> frozenset[str] | None:
        """Read only for a shadow stage: a run without one needs no Gateway or GatewayClass access."""
        router = adapters.router if adapters.target.spec.serving.traffic.shadow is not None else None
        return None if router is None else router.gateway_features(adapters.target)

    def adapters(self, owner: Owner, spec: KVCalibrationSpec) -> PassAdapters:
        """What one pass reaches the analysis backends through (for `spec`'s canary)."""
        canary = canary_name(owner.name)
        target = Target(
            namespace=owner.namespace,
            name=owner.name,
            spec=spec,
            canary_deployment=canary,
            canary_service=canary,
        )
        return PassAdapters(target, self.backends)

    def measure(self, adapters: PassAdapters, now: datetime, step_seconds: float | None = None) -> list[Measurement]:
        """One interval's measurements and probes; an adapter that raises yields an Error measurement, never a pass."""
        target = adapters.target
        analysis = target.spec.analysis
        out: list[Measurement] = []
        try:  # building the source reads the baseline's selector, which can fail like a query
            source = adapters.metrics_source
            if source is not None:
                out += source.measure(analysis, analysis.interval_seconds, step_seconds)
        except Exception as e:
            out.append(error_measurement("prometheus", f"{type(e).__name__}: {e}", at=rfc3339(now)))
        probes = adapters.probes
        if probes is not None:
            try:
                baseline_url, canary_url = self.probe_urls(target)
                out += probes.run(analysis, baseline_url, canary_url)
            except Exception as e:
                out.append(error_measurement("probes", f"{type(e).__name__}: {e}", at=rfc3339(now)))
        return out

    def kv_cache(self, adapters: PassAdapters) -> KVCacheReadings | None:
        """The KV cache each role reports (core.analysis.capacity); None without a metrics backend."""
        try:
            source = adapters.metrics_source
            if source is None:
                return None
            return source.kv_cache(adapters.target.spec.analysis)
        except Exception as e:
            return KVCacheReadings(error=f"{type(e).__name__}: {e}")

    def probe_urls(self, target: Target) -> tuple[str, str]:
        """One ready pod of each role by pod IP (see core.manifests.endpoints: the baseline Service also reaches the
        canary)."""
        ns, baseline = target.namespace, target.spec.serving.baseline
        workload = self.kube.get(baseline.kind, ns, baseline.deployment)
        selector = match_labels(workload)
        pods: list[Manifest] = []
        if workload:  # the canary's pods may not carry the baseline's labels (core.manifests.canary)
            listed = [*self.kube.list("Pod", ns, selector), *self.kube.list("Pod", ns, canary_pod_labels(target.name))]
            pods = list({p["metadata"]["name"]: p for p in listed}.values())
        return probe_urls(target.name, pods, workload, self.kube.get("Service", ns, baseline.service))

    def act(
        self,
        owner: Owner,
        decision: Decision,
        adapters: PassAdapters | None,
        seen: Routing | None = None,
    ) -> None:
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
                case SetWeight(weight=weight, mirror=mirror):
                    router = adapters.router if adapters else None
                    if router is not None and adapters is not None:
                        router.set_weight(adapters.target, weight, mirror, seen)
                        seen = (weight, mirror) if seen is not None else None

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
        removed: list[str] = []
        selector = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_CALIBRATION: label_value(name)}
        kinds: tuple[ChildKind, ...] = ("Deployment", "StatefulSet", "Service", "Job", "ConfigMap")
        for kind in kinds:
            for child in self.kube.list(kind, namespace, selector):
                child_name = child["metadata"]["name"]
                if self.kube.delete(kind, namespace, child_name):
                    removed.append(f"{kind}/{child_name}")
        return Cleanup(removed)

    def _drain_for_deletion(self, namespace: str, name: str) -> float | None:
        obj = self.kube.get("KVCalibration", namespace, name)
        if obj is None:
            return None
        meta = obj["metadata"]
        self._sent_events.pop(meta["uid"], None)  # no history entry comes after the delete
        if self.notifier:
            self.notifier.forget(meta["uid"])
        now = self.clock()
        spec, _ = parse_spec(obj)
        status = parse_status(obj)
        owner = Owner(meta["name"], meta["namespace"], meta["uid"])
        obs = Observations(owner=owner, generation=int(meta.get("generation", 1)), policy=self.policy)
        adapters = self.adapters(owner, spec) if spec else None
        if spec is not None and adapters is not None:
            kind = spec.serving.baseline.kind
            canary = workload_state(kind, self.kube.get(kind, owner.namespace, canary_name(owner.name)))
            weight, mirror = self.routing(adapters)
            obs = Observations(**{**obs.__dict__, "canary": canary, "routed_weight": weight, "routed_mirror": mirror})
        decision = decide_deletion(spec, status, obs, now)
        self.act(owner, decision, adapters, routed(obs))
        if decision.requeue_after is not None and decision.status != status:  # the drain resumes from status
            self.kube.replace_status(owner.namespace, owner.name, meta["resourceVersion"], decision.status.to_wire())
        return decision.requeue_after
