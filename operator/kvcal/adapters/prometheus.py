"""Metrics from Prometheus (prometheus-api-client): canary vs baseline over one window, assessed by the core.

Implements ``kvcal.ports.Metrics``. Each query is rendered from ``kvcal.core.promql`` for each role; the canary's
query is stored with its measurement (the baseline's differs only in its label matchers). An unreachable
Prometheus gives one Error measurement (it counts toward consecutiveErrorLimit); a query that fails gives an Error
measurement for that metric; an empty or NaN result is Inconclusive (decided by the core).
"""

from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal, Protocol

import requests
from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from kvcal.core import promql
from kvcal.core.analysis import (
    RequestCounts,
    assess_error_rate,
    assess_latency,
    assess_requests,
    error_measurement,
    informational,
    latency_metric_name,
    quantile_from_buckets,
)
from kvcal.core.capacity import KVCacheConfig, KVCacheReadings, parse_cache_config
from kvcal.core.ranktest import assess_latency_check, look_number
from kvcal.core.saturation import Load, assess_saturation
from kvcal.core.timestamps import rfc3339
from kvcal.models.spec import AnalysisSpec, LatencyCheck
from kvcal.models.status import Measurement


class QueryClient(Protocol):
    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]: ...


class QueryError(RuntimeError):
    """A query Prometheus answered with an error or an unexpected shape."""


class Unreachable(RuntimeError):
    """Prometheus did not answer at all."""


def connect(address: str, timeout_seconds: int = 10) -> QueryClient:
    # One quick retry: a reconcile must not stall on a dead Prometheus (the default retries back off for ~7 s).
    retry = Retry(total=1, backoff_factor=0.1, status_forcelist=(502, 503, 504))
    client: QueryClient = PrometheusConnect(url=address, disable_ssl=True, timeout=timeout_seconds, retry=retry)
    return client


def run_query(client: QueryClient, expression: str) -> list[dict[str, Any]]:
    """An instant query's series; Unreachable when Prometheus cannot be reached, QueryError when it refuses."""
    try:
        return client.custom_query(expression)
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise Unreachable(f"Prometheus unreachable: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # prometheus-api-client raises its own exception types for HTTP errors
        raise QueryError(f"{type(exc).__name__}: {exc}") from exc


def scalar(client: QueryClient, query: str) -> float | None:
    """The single value of an instant query; None when the result is empty."""
    result = run_query(client, query)
    if not result:
        return None
    if len(result) > 1:
        raise QueryError(f"expected one series, got {len(result)}: the query must aggregate (sum/max)")
    return float(result[0]["value"][1])


def series_labels(client: QueryClient, query: str) -> list[dict[str, str]]:
    """The label sets of an instant vector query's series (empty when there is none)."""
    result = run_query(client, query)
    return [dict(series.get("metric") or {}) for series in result]


def buckets(client: QueryClient, query: str) -> list[tuple[float, float]]:
    """(le, cumulative rate) pairs of a ``sum by (le)`` bucket query; empty when there is no data."""
    result = run_query(client, query)
    try:
        return [(float(r["metric"]["le"]), float(r["value"][1])) for r in result]
    except (KeyError, ValueError) as exc:
        raise QueryError(f"bucket query returned series without a numeric 'le' label: {exc}") from exc


def estimate(client: QueryClient, query: str, quantile: float) -> float | None:
    points = buckets(client, query)
    return quantile_from_buckets(quantile, points) if points else None


Estimator = Literal["buckets", "histogram_quantile"]


class PrometheusMetrics:
    """Measures one KVCalibration's baseline and canary; ``selector`` ties series to roles (see core.promql).

    ``estimator="buckets"`` (default) reads the per-bucket rates and estimates quantiles with
    ``quantile_from_buckets`` (unbiased ratios on vLLM's wide buckets); ``"histogram_quantile"`` asks Prometheus
    for the quantile, as a Grafana panel would.
    """

    def __init__(
        self,
        selector: promql.Selector,
        *,
        estimator: Estimator = "buckets",
        connect: Callable[[str], QueryClient] = connect,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._selector = selector
        self._estimator = estimator
        self._connect = connect
        self._clock = clock

    def _pair(
        self,
        client: QueryClient,
        build: Callable[[str], str],
        read: Callable[[QueryClient, str], float | None] = scalar,
    ) -> tuple[float | None, float | None, str]:
        baseline_query = build(self._selector.for_role("baseline"))
        canary_query = build(self._selector.for_role("canary"))
        return read(client, baseline_query), read(client, canary_query), canary_query

    def _latency(
        self, client: QueryClient, metric: str, quantile: float, window: str
    ) -> tuple[float | None, float | None, str]:
        if self._estimator == "histogram_quantile":
            return self._pair(client, lambda s: promql.render_latency(metric, quantile, s, window))
        return self._pair(
            client,
            lambda s: promql.render_latency_buckets(metric, s, window),
            lambda c, q: estimate(c, q, quantile),
        )

    def _rank(
        self,
        client: QueryClient,
        spec: AnalysisSpec,
        check: LatencyCheck,
        windows: tuple[str, str],
        look: int,
        counts: RequestCounts,
        at: str,
    ) -> Measurement:
        """The rank test: bucket counts of this interval (its quantiles, for people) and of the step (the test)."""
        interval_window, step_window = windows

        def counts_of(role: promql.Role, window: str) -> list[tuple[float, float]]:
            selector = self._selector.for_role(role)
            return buckets(client, promql.render_latency_buckets(check.metric, selector, window, "latency_counts"))

        query = promql.render_latency_buckets(
            check.metric, self._selector.for_role("canary"), step_window, "latency_counts"
        )
        return assess_latency_check(
            check, spec,
            (counts_of("baseline", interval_window), counts_of("canary", interval_window)),
            (counts_of("baseline", step_window), counts_of("canary", step_window)),
            look=look, requests=counts, at=at, query=query,
        )  # fmt: skip

    def measure(
        self, spec: AnalysisSpec, window_seconds: float, step_seconds: float | None = None
    ) -> list[Measurement]:
        at = rfc3339(self._clock())
        window = promql.format_window(window_seconds)
        step_seconds = window_seconds if step_seconds is None else max(window_seconds, step_seconds)
        step_window, look = promql.format_window(step_seconds), look_number(spec, step_seconds)
        client = self._connect(spec.prometheus.address)
        out: list[Measurement] = []
        try:
            b, c, q = self._pair(client, lambda s: promql.render_named("requests", s, window))
        except Unreachable as exc:
            return [error_measurement("prometheus", str(exc), at=at)]
        except QueryError as exc:
            return [error_measurement("requests", str(exc), at=at)]
        counts = RequestCounts(b, c)
        out.append(assess_requests(counts, min_requests=spec.min_requests, at=at, query=q))
        for check in spec.latency:
            name = latency_metric_name(check)
            try:
                if check.test == "rank":
                    out.append(self._rank(client, spec, check, (window, step_window), look, counts, at))
                    continue
                b, c, q = self._latency(client, check.metric, check.quantile, window)
            except (Unreachable, QueryError) as exc:
                out.append(error_measurement(name, str(exc), at=at))
                continue
            out.append(assess_latency(check, b, c, requests=counts, min_requests=spec.min_requests, at=at, query=q))
        named = (("errorRate", "error_rate"), ("preemptions", "preemptions"), ("kvCacheUsage", "kv_cache_usage"))
        for metric, template in named:
            try:
                b, c, q = self._pair(client, partial(promql.render_named, template, window=window))
            except (Unreachable, QueryError) as exc:
                out.append(error_measurement(metric, str(exc), at=at))
                continue
            if metric == "errorRate":
                out.append(
                    assess_error_rate(
                        spec.max_error_rate, b, c, requests=counts, min_requests=spec.min_requests, at=at, query=q
                    )
                )
            else:
                out.append(informational(metric, b, c, at=at, query=q))
        if spec.saturation.mode != "disabled":
            out += self._saturation(client, spec, window, counts, at)
        return out

    def _saturation(
        self, client: QueryClient, spec: AnalysisSpec, window: str, counts: RequestCounts, at: str
    ) -> list[Measurement]:
        values: dict[str, tuple[float | None, float | None]] = {}
        queries: dict[str, str] = {}
        templates = {"running": "requests_running", "waiting": "requests_waiting", "preemptions": "preemptions"}
        for key, template in templates.items():
            try:
                b, c, queries[key] = self._pair(client, partial(promql.render_named, template, window=window))
            except (Unreachable, QueryError) as exc:
                return [error_measurement("saturation", str(exc), at=at)]
            values[key] = (b, c)

        def load(role: int, requests: float | None) -> Load:
            return Load(values["running"][role], values["waiting"][role], values["preemptions"][role], requests)

        baseline, canary = load(0, counts.baseline), load(1, counts.canary)
        return assess_saturation(
            spec.saturation, baseline, canary, min_requests=spec.min_requests, at=at, queries=queries
        )

    def kv_cache(self, spec: AnalysisSpec) -> KVCacheReadings:
        """The KV cache configuration each role's pods report (vllm:cache_config_info)."""
        client = self._connect(spec.prometheus.address)
        configs: list[tuple[KVCacheConfig, ...]] = []
        query = ""
        roles: tuple[promql.Role, ...] = ("baseline", "canary")
        try:
            for role in roles:
                query = promql.render_kv_cache_config(self._selector.for_role(role))
                parsed = (parse_cache_config(labels) for labels in series_labels(client, query))
                configs.append(tuple(config for config in parsed if config is not None))
        except (Unreachable, QueryError) as exc:
            return KVCacheReadings(query=query, error=str(exc))
        return KVCacheReadings(baseline=configs[0], canary=configs[1], query=query)
