"""The operator's own Prometheus metrics (not the canary analysis): reconciles, failed reconciles and Warning events by
reason, objects by phase, phase durations, and the KV capacity of each object's baseline and canary (status.capacity).

One registry per OperatorMetrics instance (no module-level collectors), served by `serve(port)`.
"""

import contextlib
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from kvcal.models.status import CapacityStatus, Phase

_DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, float("inf"))


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.reconciles = Counter(
            "kvcal_reconciles", "Reconcile passes by result (ok, conflict, error)", ["result"], registry=self.registry
        )
        self.reconcile_seconds = Histogram(
            "kvcal_reconcile_duration_seconds", "Wall time of one reconcile pass", registry=self.registry
        )
        self.reconcile_errors = Counter(
            "kvcal_reconcile_errors",
            "Reconcile passes that raised, by exception class (see the ReconcileError condition and events)",
            ["reason"],
            registry=self.registry,
        )
        self.warnings = Counter(
            "kvcal_warning_events",
            "Warning events the operator emitted, by reason (problems a user must look at)",
            ["reason"],
            registry=self.registry,
        )
        self.objects = Gauge("kvcal_objects", "KVCalibrations by phase", ["phase"], registry=self.registry)
        self.phase_seconds = Histogram(
            "kvcal_phase_duration_seconds",
            "Time a KVCalibration spent in a phase, observed when it leaves the phase",
            ["phase"],
            buckets=_DURATION_BUCKETS,
            registry=self.registry,
        )
        self.kv_tokens = Gauge(
            "kvcal_kv_cache_tokens",
            "KV cache capacity in tokens that vLLM reports, by KVCalibration and role (status.capacity)",
            ["namespace", "name", "role"],
            registry=self.registry,
        )
        self.kv_bytes_per_token = Gauge(
            "kvcal_kv_cache_bytes_per_token",
            "KV cache bytes per token that vLLM reports, by KVCalibration and role (status.capacity)",
            ["namespace", "name", "role"],
            registry=self.registry,
        )
        self.promotion_reverted = Gauge(
            "kvcal_promotion_reverted",
            "1 while a Succeeded KVCalibration's baseline no longer serves the promoted checkpoint (Promoted=False, "
            "reason Reverted: a sync or a person put the old config back)",
            ["namespace", "name"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "kvcal_leader",
            "1 while this replica holds the leader-election Lease (--leader-elect)",
            registry=self.registry,
        )
        self._phases: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        for phase in Phase:  # every CRD phase has a series from the start, at 0
            self.objects.labels(phase=str(phase)).set(0)

    def reconciled(self, result: str, seconds: float) -> None:
        self.reconciles.labels(result=result).inc()
        self.reconcile_seconds.observe(seconds)

    def reconcile_failed(self, reason: str) -> None:
        self.reconcile_errors.labels(reason=reason).inc()

    def warned(self, reason: str) -> None:
        self.warnings.labels(reason=reason).inc()

    def phase_left(self, phase: str, seconds: float) -> None:
        self.phase_seconds.labels(phase=str(phase)).observe(max(0.0, seconds))

    def set_reverted(self, namespace: str, name: str, reverted: bool) -> None:
        if reverted:
            self.promotion_reverted.labels(namespace=namespace, name=name).set(1)
        else:
            with contextlib.suppress(KeyError):  # no series: it was never reverted
                self.promotion_reverted.remove(namespace, name)

    def set_leader(self, leading: bool) -> None:
        self.leader.set(1 if leading else 0)

    def set_phase(self, namespace: str, name: str, phase: str | None) -> None:
        """Record the phase of one object (None: it is gone) and update the per-phase gauge (O(1): every pass calls
        this, and recounting every object made a pass O(objects))."""
        if phase is None:
            self.set_reverted(namespace, name, False)
        with self._lock:
            before = self._phases.pop((namespace, name), None)
            if phase is not None:
                self._phases[(namespace, name)] = phase
            if before == phase:
                return
            if before is not None:
                self.objects.labels(phase=str(before)).dec()
            if phase is not None:
                self.objects.labels(phase=str(phase)).inc()

    def set_capacity(self, namespace: str, name: str, capacity: CapacityStatus | None) -> None:
        """The KV capacity of one object's roles (None: the object is gone); a role without a value has no series."""
        for role in ("baseline", "canary"):
            kv = getattr(capacity, role) if capacity is not None else None
            values = ((self.kv_tokens, kv and kv.kv_tokens), (self.kv_bytes_per_token, kv and kv.bytes_per_token))
            for gauge, value in values:
                if value is not None:
                    gauge.labels(namespace=namespace, name=name, role=role).set(value)
                else:
                    with contextlib.suppress(KeyError):  # never set
                        gauge.remove(namespace, name, role)

    def serve(self, port: int, addr: str = "0.0.0.0") -> Callable[[], None]:
        """Serve /metrics on `port` (all interfaces: Prometheus scrapes the pod); returns a function that stops it."""
        server, thread = start_http_server(port, addr=addr, registry=self.registry)

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(5)

        return stop
