"""Protocols between the operator's services and the outside world. Fakes for tests live beside their tests.

No port takes a clock: time is passed in by the caller (the reconciler reads its injected clock once per pass).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from kvcal.core.analysis.capacity import KVCacheReadings
from kvcal.models.spec import AnalysisSpec, KVCalibrationSpec
from kvcal.models.status import Measurement, NoiseStatus

Manifest = dict[str, Any]
# Kinds the operator reads or writes; adapters map them to API groups.
Kind = Literal[
    "KVCalibration",
    "Job",
    "ConfigMap",
    "Deployment",
    "StatefulSet",
    "Service",
    "Pod",
    "InferencePool",
    "Secret",
    "HorizontalPodAutoscaler",
]


class Conflict(Exception):
    """The object changed since it was read (HTTP 409 on an update carrying a resourceVersion)."""


class Kube(Protocol):
    """The Kubernetes API as the operator needs it. Objects are plain camelCase dicts, as the API serves them."""

    def get(self, kind: Kind, namespace: str, name: str) -> Manifest | None:
        """The object, or None when it does not exist."""
        ...

    def list(self, kind: Kind, namespace: str, labels: Mapping[str, str]) -> list[Manifest]: ...

    def create(self, manifest: Manifest) -> bool:
        """Create; False (and no error) when an object of that name already exists."""
        ...

    def apply(self, manifest: Manifest) -> None:
        """Create, or merge-patch the existing object's labels and spec to the manifest's."""
        ...

    def apply_owned_fields(self, manifest: Manifest, field_manager: str) -> None:
        """Server-side apply of `manifest` (only the fields it names) as `field_manager`, taking conflicting fields
        over (force); other managers' fields are left as they are."""
        ...

    def delete(self, kind: Kind, namespace: str, name: str) -> bool:
        """Delete (background propagation); False when it was already gone."""
        ...

    def set_job_deadline(self, namespace: str, name: str, seconds: int) -> bool:
        """Set a Job's spec.activeDeadlineSeconds (the one field of a running Job kvcal changes); False when gone."""
        ...

    def scale(self, kind: Kind, namespace: str, name: str, replicas: int) -> bool:
        """Set a workload's spec.replicas and nothing else (what `kubectl scale` does); False when it is gone."""
        ...

    def termination_message(self, namespace: str, job_name: str) -> str | None:
        """The termination message of the newest terminated pod of a Job."""
        ...

    def replace_status(self, namespace: str, name: str, resource_version: str, status: Manifest) -> None:
        """Replace status.* of a KVCalibration; raises Conflict when resource_version is stale."""
        ...

    def remove_annotations(self, namespace: str, name: str, keys: Sequence[str]) -> None: ...

    def emit_event(self, involved: Manifest, type_: str, reason: str, message: str, name: str | None = None) -> bool:
        """A core/v1 Event about `involved` (a full object: kind, metadata.name/namespace/uid are used). With `name`,
        False (and no error) when an Event of that name already exists; without, a fresh name every call."""
        ...


class Leases(Protocol):
    """coordination.k8s.io/v1 Leases (leader election), as the API serves them."""

    def read_lease(self, namespace: str, name: str) -> Manifest | None: ...

    def create_lease(self, lease: Manifest) -> bool:
        """Create; False (and no error) when a lease of that name already exists."""
        ...

    def replace_lease(self, lease: Manifest) -> None:
        """Replace; raises Conflict when metadata.resourceVersion is stale."""
        ...


class MetricsSource(Protocol):
    """Canary vs baseline metrics over the last window (Prometheus in production)."""

    def measure(
        self,
        spec: AnalysisSpec,
        window_seconds: float,
        step_seconds: float | None = None,
        noise: Sequence[NoiseStatus] = (),
    ) -> list[Measurement]:
        """The last ``window_seconds``; ``step_seconds`` (default: the window) since the analysis step's first interval
        began, for the rank test, which pools the step (kvcal.core.analysis.ranktest); ``noise``: the pods' noise
        learned from the baseline's history (status.noise)."""
        ...

    def learn_noise(self, spec: AnalysisSpec) -> list[NoiseStatus]:
        """The baseline pods' own latency noise per rank-tested metric, from their history (spec.history)."""
        ...

    def kv_cache(self, spec: AnalysisSpec) -> KVCacheReadings:
        """The KV cache configuration (vllm:cache_config_info) each role's pods report now."""
        ...


class Probes(Protocol):
    """The same prompts sent to baseline and canary; one Measurement per probe family."""

    def run(self, spec: AnalysisSpec, baseline_url: str, canary_url: str) -> list[Measurement]: ...


# (the canary's weight, the percent mirrored to it) as a pass read them from the router; None where it reads none.
Routing = tuple[int | None, int | None]


class Router(Protocol):
    """Sends `weight` percent of user traffic to the canary (no-op for the replicas and none routers)."""

    def set_weight(self, target: "Target", weight: int, mirror: int = 0, seen: Routing | None = None) -> None:
        """`mirror`: percent of requests also mirrored to the canary (the shadow stage; 0 removes the mirror).
        `seen`: the (weight, mirror) the pass read (get_weight, get_mirror); where the route no longer shows them,
        raise Conflict rather than undo an edit the pass has not judged."""
        ...

    def get_weight(self, target: "Target") -> int | None:
        """The canary's share as the router reports it now; None where there is no weight to read (replicas: the
        replica ratio is the weight; none: no user traffic)."""
        ...

    def get_mirror(self, target: "Target") -> int | None:
        """The percent of requests the route mirrors to the canary now; None where there is no route to read."""
        ...

    def gateway_features(self, target: "Target") -> frozenset[str] | None:
        """status.supportedFeatures of the route's Gateway class; None when it cannot be read."""
        ...


@dataclass(frozen=True)
class Target:
    """What an analysis adapter needs to find one KVCalibration's baseline and canary."""

    namespace: str
    name: str
    spec: KVCalibrationSpec
    canary_deployment: str
    canary_service: str


class AnalysisBackends(Protocol):
    """Builds the MetricsSource, Probes and Router for one KVCalibration (they depend on its namespace and names)."""

    def metrics_source(self, target: Target) -> MetricsSource | None: ...

    def probes(self, target: Target) -> Probes | None: ...

    def router(self, target: Target) -> Router | None: ...


class WebhookPoster(Protocol):
    """HTTP POST to a notification receiver (services.notifier); an adapter that cannot connect raises."""

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> int:
        """The answer's HTTP status code; its body is never read into kvcal (it could echo anything)."""
        ...
