"""What the reconciler saw this time (the input of decide) and what decide wants done (its output)."""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from kvcal.core.analysis.capacity import KVCacheReadings
from kvcal.core.guard.policy import Policy
from kvcal.core.manifests.common import Manifest, Owner
from kvcal.models.status import KVCalibrationStatus, Measurement, NoiseStatus

# Annotations a person (or `kvcal promote|abort|retry`) sets on the KVCalibration; any non-empty value counts.
# The operator removes the annotation once it has acted on it.
PROMOTE_ANNOTATION = "kvcal.dev/promote"
ABORT_ANNOTATION = "kvcal.dev/abort"
RETRY_ANNOTATION = "kvcal.dev/retry"
# Calibrate anew (a terminal object never restarts by itself, not even on a spec change).
RECALIBRATE_ANNOTATION = "kvcal.dev/recalibrate"
GATE_ANNOTATIONS = (PROMOTE_ANNOTATION, ABORT_ANNOTATION, RETRY_ANNOTATION, RECALIBRATE_ANNOTATION)
ChildKind = Literal["Job", "ConfigMap", "Deployment", "StatefulSet", "Service", "InferencePool"]


# The scheduler names each resource no Node had enough of: "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
_INSUFFICIENT = re.compile(r"Insufficient ([A-Za-z0-9][A-Za-z0-9./_-]*[A-Za-z0-9])")


@dataclass(frozen=True)
class Unschedulable:
    """Pods the scheduler could not place (their PodScheduled condition: False, reason Unschedulable)."""

    pods: int
    since: str  # RFC 3339: the earliest of their conditions' lastTransitionTime
    message: str  # the scheduler's own words for one of them (no user data: node counts and resource names)

    @property
    def missing(self) -> tuple[str, ...]:
        """The resources no Node had free enough of, e.g. ("nvidia.com/gpu",); empty for other causes (taints,
        node selectors, affinity), which the message names."""
        return tuple(dict.fromkeys(_INSUFFICIENT.findall(self.message)))

    @property
    def shortage(self) -> str:
        """ " (no Node has a free nvidia.com/gpu)" for the messages that name it; "" when no resource ran out."""
        return f" (no Node has a free {', '.join(self.missing)})" if self.missing else ""


@dataclass(frozen=True)
class JobState:
    name: str
    state: Literal["Running", "Succeeded", "Failed"]
    message: str = ""  # the pod's termination message (the summary JSON), else the Job condition's message
    reason: str = ""  # the Job condition's reason: BackoffLimitExceeded, DeadlineExceeded, ...
    deleting: bool = False
    # A running Job's spec.activeDeadlineSeconds as the API holds it (None: unset, or not read).
    deadline_seconds: int | None = None
    # Seconds its pods waited to be placed, added up: each until the scheduler bound it, or until now while it still
    # waits (None: not started, or not read). The Job controller counts them against the deadline.
    waited_seconds: float | None = None
    unschedulable: Unschedulable | None = None  # its pod, while the scheduler cannot place it


@dataclass(frozen=True)
class DeploymentState:
    """The rollout state of a baseline or canary workload, in the Deployment's terms whatever its kind (the reconciler
    maps a StatefulSet's status onto the same fields: services.observe.workload_state)."""

    manifest: Manifest
    replicas: int
    ready_replicas: int = 0
    updated_replicas: int = 0
    available_replicas: int = 0
    generation: int = 1
    observed_generation: int = 0
    # Only a Deployment reports it (its Progressing condition); a StatefulSet has no progress deadline.
    progress_deadline_exceeded: bool = False
    # A StatefulSet whose currentRevision is not yet its updateRevision: its controller has not finished the rollout.
    revision_pending: bool = False
    # status.replicas: the pods of every revision not terminating (None: not reported). More than `replicas` means
    # old pods still run beside the updated ones, e.g. an updated pod the scheduler could not place yet.
    pods: int | None = None
    # status.terminatingReplicas: pods being deleted, which still hold their Node's resources (None: not reported,
    # as by API servers before Kubernetes 1.33).
    terminating: int | None = None

    @property
    def rolled_out(self) -> bool:
        """The controller has seen the latest template and every replica runs it and is available."""
        return (
            not self.revision_pending
            and (self.pods is None or self.pods <= self.replicas)
            and self.observed_generation >= self.generation
            and self.updated_replicas >= self.replicas
            and self.available_replicas >= self.replicas
            and self.ready_replicas >= self.replicas
        )


@dataclass(frozen=True)
class PoolState:
    """Router inference-pool: the baseline's pool and picker (what the canary's copy from) and the canary's own
    (core.rollout.pool). None where absent; `error`: what the reconciler could not read, e.g. the CRD missing."""

    baseline_pool: Manifest | None = None
    picker_service: Manifest | None = None  # the Service the baseline pool's endpointPickerRef names
    deployments: tuple[Manifest, ...] = ()  # the namespace's Deployments: one of them is the picker behind it
    canary_pool: Manifest | None = None
    canary_picker: DeploymentState | None = None
    ready_endpoints: int = 0  # Ready pods the canary pool selects now (0 without a canary pool)
    error: str | None = None


@dataclass(frozen=True)
class Observations:
    owner: Owner
    generation: int
    gates: Mapping[str, str] = field(default_factory=dict)
    calibration_job: JobState | None = None
    verification_job: JobState | None = None
    canary: DeploymentState | None = None
    # The canary's pods the scheduler could not place; None: all placed (or not read in this phase).
    canary_unschedulable: Unschedulable | None = None
    baseline: DeploymentState | None = None
    # The baseline's own pods the scheduler could not place (e.g. a promotion's surge pod); None: none, or not read.
    baseline_unschedulable: Unschedulable | None = None
    # The HorizontalPodAutoscaler whose scaleTargetRef is the baseline (its name); None: none, or not read.
    baseline_autoscaler: str | None = None
    baseline_service: Manifest | None = None
    measurements: tuple[Measurement, ...] = ()
    # The canary's share of user traffic as the router reports it (read back, never assumed); None where the router
    # has no weight to read (replicas: the replica ratio is the weight; none: no user traffic) or it was not read.
    routed_weight: int | None = None
    # The percent of requests the route mirrors to the canary (the shadow stage), read with routed_weight.
    routed_mirror: int | None = None
    # The features the HTTPRoute's Gateway class lists in status.supportedFeatures (Gateway API names, e.g.
    # HTTPRouteRequestMirror); None: not read, or no parent Gateway/class could be read.
    gateway_features: frozenset[str] | None = None
    inference_pool: PoolState | None = None  # router inference-pool only
    spec_error: str | None = None  # the spec failed validation: why, naming the field
    # The operator's security policy (chart values policy.*). Its calibrator image (jobImages.calibrator) is the
    # default for specs that name none: used to build the Job and recorded as provenance, never hashed (an operator
    # upgrade must not restart anything).
    policy: Policy = field(default_factory=Policy)
    serving_verification_job: JobState | None = None  # the Job named in status.serving.verification.job
    kv_cache: KVCacheReadings | None = None  # read with the measurements; None: not read (no metrics backend)
    # The baseline pods' noise just learned from their history (schedule.noise_due); empty: not learned this pass.
    noise: tuple[NoiseStatus, ...] = ()

    @property
    def canary_exposure(self) -> int | None:
        """The most live traffic the route still sends the canary, weighted or mirrored: a canary is drained only at
        0 (a mirror filter naming a deleted Service breaks the route on some gateways)."""
        if self.routed_weight is None:
            return None
        return max(self.routed_weight, self.routed_mirror or 0)


@dataclass(frozen=True)
class Create:
    """Create if absent (an existing object of that name is left alone)."""

    manifest: Manifest


@dataclass(frozen=True)
class Apply:
    """Create, or replace the existing object's labels and spec with these."""

    manifest: Manifest


@dataclass(frozen=True)
class ApplyOwnedFields:
    """Server-side apply, as field manager kvcal with force, of the fields kvcal owns in an object it does not own
    (the promoted baseline): the API server records them as kvcal's, and every other field keeps its owner."""

    manifest: Manifest


@dataclass(frozen=True)
class Delete:
    kind: ChildKind
    name: str


@dataclass(frozen=True)
class SetWeight:
    """Route `weight` percent of user traffic to the canary (the router named in the spec), and mirror `mirror`
    percent of it there on top (the shadow stage; 0 removes the mirror)."""

    weight: int
    mirror: int = 0


@dataclass(frozen=True)
class ScaleBaseline:
    """Set the baseline workload's replicas (spec.serving.canary.capacity fromBaseline), as `kubectl scale` does:
    only spec.replicas changes."""

    kind: Literal["Deployment", "StatefulSet"]
    name: str
    replicas: int


@dataclass(frozen=True)
class SetJobDeadline:
    """Raise a running Job's spec.activeDeadlineSeconds (the time its pod waited for a Node is given back)."""

    name: str
    seconds: int


Action = Create | Apply | ApplyOwnedFields | Delete | SetWeight | ScaleBaseline | SetJobDeadline


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    status: KVCalibrationStatus
    actions: tuple[Action, ...]
    requeue_after: float | None
    events: tuple[Event, ...]
    # Command annotations to remove once the status is written (not an action: actions run before the write).
    cleared_annotations: tuple[str, ...] = ()
    # An exception no handler foresaw, turned into a Blocked status: the reconciler logs its traceback.
    unexpected: Exception | None = field(default=None, compare=False)
