"""A stand-in vLLM /metrics endpoint with controlled latency distributions, for analysis scenario tests.

It serves vLLM 0.32's metric names, labels and histogram buckets (copied from
/work/shared/fixtures/vllm-0.32-cpu/metrics-bf16.txt) so the same PromQL runs against it as against a real server.
A traffic thread records ``rate`` requests per second with lognormal TTFT / ITL around the medians of the current
``Profile``; tests switch profiles to stage a regression, an outage of traffic, or flapping.
"""

import random
import threading
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)  # fmt: skip
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
_LABELS = ("engine", "model_name")
TICK_SECONDS = 0.05


@dataclass(frozen=True)
class Profile:
    rate: float = 50.0  # requests per second
    ttft_median: float = 0.15
    itl_median: float = 0.03
    sigma: float = 0.25  # lognormal shape of both latencies
    output_tokens: int = 16
    error_rate: float = 0.0
    running: float = 0.0  # vllm:num_requests_running while the profile holds
    waiting: float = 0.0  # vllm:num_requests_waiting
    preemptions_per_request: float = 0.0


class VllmExporter:
    """One fake vLLM server's /metrics on 127.0.0.1:PORT; ``profile`` can be swapped at any time."""

    def __init__(self, profile: Profile, *, model_name: str = "/models/smollm2", seed: int = 0) -> None:
        self.profile = profile
        self._rng = random.Random(seed)
        self._labels = {"engine": "0", "model_name": model_name}
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT", _LABELS, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "ITL", _LABELS, buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "e2e", _LABELS, buckets=E2E_BUCKETS, registry=r)
        self.success = Counter("vllm:request_success", "done", (*_LABELS, "finished_reason"), registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "preemptions", _LABELS, registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage", _LABELS, registry=r)
        self.running = Gauge("vllm:num_requests_running", "running", _LABELS, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", _LABELS, registry=r)
        self.http = Counter("http_requests", "HTTP", ("handler", "method", "status"), registry=r)
        for reason in FINISHED_REASONS:  # vLLM pre-creates every finished_reason series at 0
            self.success.labels(**self._labels, finished_reason=reason)
        self.preemptions.labels(**self._labels)
        self.requests_recorded = 0
        self._stop = threading.Event()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def record(self, ttft: float, itl: float, tokens: int, *, failed: bool = False) -> None:
        if failed:
            self.http.labels("/v1/completions", "POST", "5xx").inc()
            return
        self.ttft.labels(**self._labels).observe(ttft)
        for _ in range(tokens - 1):
            self.itl.labels(**self._labels).observe(itl)
        self.e2e.labels(**self._labels).observe(ttft + itl * (tokens - 1))
        self.success.labels(**self._labels, finished_reason="length").inc()
        self.http.labels("/v1/completions", "POST", "2xx").inc()
        self.requests_recorded += 1

    def _tick(self, carry: float) -> float:
        p = self.profile
        carry += p.rate * TICK_SECONDS
        while carry >= 1:
            carry -= 1
            ttft = self._rng.lognormvariate(0, p.sigma) * p.ttft_median
            itl = self._rng.lognormvariate(0, p.sigma) * p.itl_median
            self.record(ttft, itl, p.output_tokens, failed=self._rng.random() < p.error_rate)
            self.preemptions.labels(**self._labels).inc(p.preemptions_per_request)
        self.kv_usage.labels(**self._labels).set(min(1.0, p.rate / 200))
        self.running.labels(**self._labels).set(p.running)
        self.waiting.labels(**self._labels).set(p.waiting)
        return carry

    def _traffic(self) -> None:
        carry = 0.0
        while not self._stop.wait(TICK_SECONDS):  # a load generator's pacing, not a wait for a condition
            carry = self._tick(carry)

    def start(self) -> "VllmExporter":
        self._server, _ = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._traffic, name=f"exporter-{self.port}", daemon=True)
        self._thread.start()
        return self

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self._server:
            self._server.shutdown()
            self._server.server_close()
