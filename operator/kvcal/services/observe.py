"""observe: the reads of one pass, turned into the core's Observations.

The core decides on value types (JobState, DeploymentState, PoolState, Measurement), never on API objects, so the
parsers here are the one place that knows how the Job controller, a Deployment or a StatefulSet report their state.
A pass reads only what its phase looks at (`LIFECYCLE.observes(phase)`): a read the phase does not need would cost an
API call per pass and could fail the pass over an object that does not matter to it (and needs RBAC it may lack).

Measuring is observing too: when an analysis interval is due, the metrics source and the probes run here and their
results go into Observations like any read. An adapter that raises yields an Error measurement for the core to
judge, never a failed pass.
"""

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

from pydantic import ValidationError

from kvcal.core.analysis.capacity import KVCacheReadings
from kvcal.core.analysis.schedule import noise_due, step_window_seconds, with_noise
from kvcal.core.analysis.verdict import error_measurement
from kvcal.core.decide import measurement_due
from kvcal.core.guard.policy import Policy
from kvcal.core.manifests import Owner, calibration_job_name, canary_name, verification_job_name
from kvcal.core.manifests.common import LABEL_ROLE, match_labels
from kvcal.core.manifests.endpoints import canary_pod_labels, pod_ready, probe_urls
from kvcal.core.manifests.pool import canary_picker_name, canary_pool_name, picker_service_name
from kvcal.core.observations import (
    GATE_ANNOTATIONS,
    DeploymentState,
    JobState,
    Observations,
    PoolState,
    Unschedulable,
)
from kvcal.core.phases import LIFECYCLE
from kvcal.core.problems import NeedsFix
from kvcal.core.spechash import effective_spec_hash
from kvcal.core.timestamps import parse_rfc3339, rfc3339
from kvcal.models.errors import describe
from kvcal.models.spec import KVCalibrationSpec, WorkloadKind
from kvcal.models.status import KVCalibrationStatus, Measurement, NoiseStatus, Phase
from kvcal.ports import AnalysisBackends, Kube, Manifest, MetricsSource, Probes, Router, Routing, Target

log = logging.getLogger(__name__)


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


def job_state(
    job: Manifest | None,
    message: Callable[[str], str | None],
    pods: Callable[[str], Sequence[Manifest]] | None = None,
    now: datetime | None = None,
) -> JobState | None:
    """Summarise a Job the way the Job controller reports it; `message` reads the pod's termination message. With
    `pods` (the Job's pods) and `now`, a running Job also says how long its pod waited for a Node (waiting_for_node)
    and its deadline."""
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
    if pods is None or now is None:
        return JobState(name, "Running", deleting=deleting)
    listed = pods(name)
    deadline = job.get("spec", {}).get("activeDeadlineSeconds")
    return JobState(
        name,
        "Running",
        deleting=deleting,
        deadline_seconds=int(deadline) if deadline is not None else None,
        waited_seconds=waiting_for_node(job, listed, now),
        unschedulable=unschedulable(listed),
    )


def waiting_for_node(job: Manifest, pods: Sequence[Manifest], now: datetime) -> float | None:
    """Seconds the Job's pods waited for a Node, added up (each from its creation until the scheduler bound it, or
    until now while unbound): a retried Job counts each pod's wait, never a pod's run. None before it started."""
    if not (job.get("status") or {}).get("startTime"):
        return None
    waited = 0.0
    for pod in pods:
        created = pod["metadata"].get("creationTimestamp")
        if not created:
            continue
        bound = next(
            (
                c.get("lastTransitionTime")
                for c in (pod.get("status") or {}).get("conditions") or []
                if c.get("type") == "PodScheduled" and c.get("status") == "True"
            ),
            None,
        )
        if bound is None and pod["spec"].get("nodeName"):
            continue  # bound by no scheduler (nothing says when): no wait to give back
        if bound is None and pod["metadata"].get("deletionTimestamp"):
            continue
        end = parse_rfc3339(bound) if bound else now
        waited += max(0.0, (end - parse_rfc3339(created)).total_seconds())
    return waited


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
        pods=int(status["replicas"]) if "replicas" in status else None,
        terminating=int(status["terminatingReplicas"]) if "terminatingReplicas" in status else None,
    )


# The scheduler's message is Kubernetes' own text, but long on a big cluster (one clause per kind of Node).
UNSCHEDULABLE_MESSAGE_CHARS = 300


def unschedulable(pods: Sequence[Manifest]) -> Unschedulable | None:
    """The pods the scheduler could not place, as it reports them: PodScheduled False with reason Unschedulable.
    A pod being deleted, or already bound, does not count."""
    found: list[tuple[str, str]] = []
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp") or (pod.get("spec") or {}).get("nodeName"):
            continue
        for cond in (pod.get("status") or {}).get("conditions") or []:
            refused = cond.get("status") == "False" and cond.get("reason") == "Unschedulable"
            if cond.get("type") == "PodScheduled" and refused:
                found.append((str(cond.get("lastTransitionTime") or ""), str(cond.get("message") or "")))
    if not found:
        return None
    since, message = min(found)
    return Unschedulable(len(found), since, message.strip()[:UNSCHEDULABLE_MESSAGE_CHARS])


def autoscaler_of(autoscalers: Sequence[Manifest], kind: str, name: str) -> str | None:
    """The name of the HorizontalPodAutoscaler that scales this workload, if one does."""
    for hpa in autoscalers:
        target = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        if target.get("kind") == kind and target.get("name") == name:
            return str(hpa["metadata"]["name"])
    return None


def routed(obs: Observations) -> Routing | None:
    """The route's (weight, mirror) the pass read; None where it read none."""
    return None if obs.routed_weight is None else (obs.routed_weight, obs.routed_mirror)


@dataclass(frozen=True)
class Observer:
    """Reads the world for one KVCalibration's pass: the API through `kube`, the analysis through `backends`."""

    kube: Kube
    policy: Policy
    backends: AnalysisBackends | None

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
            if observation not in needs:
                return None
            return job_state(self.kube.get("Job", ns, name), message, self.job_pods(ns), now)

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
            canary_unschedulable=(
                unschedulable(self.kube.list("Pod", ns, canary_pod_labels(owner.name)))
                if "canary_pods" in needs
                else None
            ),
            baseline=workload("baseline", baseline.deployment),
            baseline_autoscaler=(
                autoscaler_of(self.kube.list("HorizontalPodAutoscaler", ns, {}), baseline.kind, baseline.deployment)
                if "baseline_autoscaler" in needs and spec.serving.canary.capacity == "fromBaseline"
                else None
            ),
            baseline_service=self.kube.get("Service", ns, baseline.service) if "baseline_service" in needs else None,
            policy=self.policy,
            routed_weight=routed_weight,
            routed_mirror=routed_mirror,
            gateway_features=self.gateway_features(adapters) if "gateway_features" in needs else None,
            inference_pool=self.pool_state(owner, spec) if "inference_pool" in needs else None,
            serving_verification_job=serving_job,
        )
        if "baseline_pods" in needs and obs.baseline is not None:
            unplaced = self.baseline_unschedulable(ns, obs.baseline.manifest)
            obs = Observations(**{**obs.__dict__, "baseline_unschedulable": unplaced})
        learned: tuple[NoiseStatus, ...] = ()
        if noise_due(spec.analysis, status, now):
            learned = tuple(self.learn_noise(adapters))
            obs = Observations(**{**obs.__dict__, "noise": learned})
        if measurement_due(spec.analysis, status, now):
            step_seconds = step_window_seconds(spec.analysis, status.analysis, now)
            noise = with_noise(status.noise, learned)
            measurements = tuple(self.measure(adapters, now, step_seconds, noise))
            obs = Observations(**{**obs.__dict__, "measurements": measurements, "kv_cache": self.kv_cache(adapters)})
        return obs

    def baseline_unschedulable(self, namespace: str, workload: Manifest) -> Unschedulable | None:
        """The baseline's pods (by its selector, the canary's left out) that the scheduler could not place."""
        selector = match_labels(workload)
        if not selector:
            return None
        pods = self.kube.list("Pod", namespace, selector)
        return unschedulable([p for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_ROLE) != "canary"])

    def job_pods(self, namespace: str) -> Callable[[str], list[Manifest]]:
        return lambda job: self.kube.list("Pod", namespace, {"job-name": job})

    def for_deletion(
        self, owner: Owner, generation: int, spec: KVCalibrationSpec | None, adapters: PassAdapters | None
    ) -> Observations:
        """What the drain on delete (core.deletion) looks at: the canary and the route, nothing else."""
        obs = Observations(owner=owner, generation=generation, policy=self.policy)
        if spec is None or adapters is None:
            return obs
        kind = spec.serving.baseline.kind
        canary = workload_state(kind, self.kube.get(kind, owner.namespace, canary_name(owner.name)))
        weight, mirror = self.routing(adapters)
        return Observations(**{**obs.__dict__, "canary": canary, "routed_weight": weight, "routed_mirror": mirror})

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

    def measure(
        self,
        adapters: PassAdapters,
        now: datetime,
        step_seconds: float | None = None,
        noise: Sequence[NoiseStatus] = (),
    ) -> list[Measurement]:
        """One interval's measurements and probes; an adapter that raises yields an Error measurement, never a pass."""
        target = adapters.target
        analysis = target.spec.analysis
        out: list[Measurement] = []
        try:  # building the source reads the baseline's selector, which can fail like a query
            source = adapters.metrics_source
            if source is not None:
                out += source.measure(analysis, analysis.interval_seconds, step_seconds, noise)
        except Exception as e:
            out.append(error_measurement("prometheus", f"{type(e).__name__}: {e}", at=rfc3339(now)))
        try:  # building the probes reads the baseline (its API key), which can fail like a probe
            probes = adapters.probes
            if probes is not None:
                baseline_url, canary_url = self.probe_urls(target)
                out += probes.run(analysis, baseline_url, canary_url)
        except Exception as e:
            out.append(error_measurement("probes", f"{type(e).__name__}: {e}", at=rfc3339(now)))
        return out

    def learn_noise(self, adapters: PassAdapters) -> list[NoiseStatus]:
        """The baseline pods' noise from their history (core.analysis.fleetnoise); an adapter that raises leaves it
        to be learned at the next pass (nothing recorded: the rank test estimates it meanwhile)."""
        try:
            source = adapters.metrics_source
            return [] if source is None else source.learn_noise(adapters.target.spec.analysis)
        except Exception as e:
            log.warning("learning the baseline's noise failed: %s: %s", type(e).__name__, e)
            return []

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
