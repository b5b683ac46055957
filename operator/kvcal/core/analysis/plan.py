"""What one analysis interval asks Prometheus, and how the answers become Measurements.

The core decides the plan, the metrics provider only runs it (Flagger's split): ``analysis_plan`` names each query,
per role, with the measurement its answer feeds and the window it reads; ``adapters.prometheus`` runs the queries in
order, asking ``needed`` before each, and parses each answer into plain values of the query's ``shape``
(``Answers``); ``measurements`` turns those into the interval's Measurements with the assess_* functions.

A failed query makes its measurement an Error, and the rest of that measurement's queries are not run. The requests
run first and gate the interval: when they fail nothing else is asked, and when Prometheus cannot be used at all the
interval is one Error measurement (it counts toward consecutiveErrorLimit).
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Literal, TypeVar

from kvcal.core.analysis import promql
from kvcal.core.analysis.capacity import METRIC as KV_CAPACITY
from kvcal.core.analysis.capacity import KVCacheConfig, KVCacheReadings, parse_cache_config
from kvcal.core.analysis.fleetnoise import FleetNoise, HistoryInterval, learn_noise, noise_status
from kvcal.core.analysis.histograms import Buckets
from kvcal.core.analysis.ranktest import FEWEST_INTERVALS, assess_latency_check, has_pod_reference
from kvcal.core.analysis.saturation import METRIC as SATURATION
from kvcal.core.analysis.saturation import Load, assess_saturation
from kvcal.core.analysis.schedule import look_number
from kvcal.core.analysis.verdict import (
    Reading,
    RequestCounts,
    RequestGate,
    assess_error_rate,
    assess_latency,
    assess_requests,
    error_measurement,
    informational,
    latency_metric_name,
    quantile_from_buckets,
)
from kvcal.models.spec import AnalysisSpec, LatencyCheck, LatencyMetric
from kvcal.models.status import Measurement, NoiseStatus

# kvcal's estimate from the per-bucket rates (unbiased on vLLM's wide buckets), or Prometheus' histogram_quantile.
Estimator = Literal["buckets", "histogram_quantile"]
# How the provider parses an answer: one value, (le, value) pairs, such pairs per pod or per evaluation time, labels.
Shape = Literal["value", "buckets", "pod_buckets", "interval_buckets", "history", "labels"]

# The metric of the one Error measurement an interval gets when Prometheus cannot be used at all.
UNUSABLE = "prometheus"
REQUESTS = "requests"
ROLES: tuple[promql.Role, promql.Role] = ("baseline", "canary")
_SHAPES: dict[str, Shape] = {
    "latency_buckets": "buckets",
    "latency_counts": "buckets",
    "latency_pod_counts": "pod_buckets",
    "latency_interval_counts": "interval_buckets",
    "latency_history": "history",
    "kv_cache_config": "labels",
}
# The metrics measured after the latency checks, each with its template, in their order in the status.
_NAMED = (("errorRate", "error_rate"), ("preemptions", "preemptions"), ("kvCacheUsage", "kv_cache_usage"))
# The saturation check's inputs (as assess_saturation names them) and their templates.
SATURATION_INPUTS = (("running", "requests_running"), ("waiting", "requests_waiting"), ("preemptions", "preemptions"))

T = TypeVar("T")


@dataclass(frozen=True)
class Windows:
    """The ranges one measurement reads: this interval, the step since its first interval began (the rank test pools
    it), and the per-interval subquery's window (one interval) and range (the step less one interval: look k has
    k - 1 full intervals; None when under a second); ``look``: which look of the step this is."""

    interval: str
    step: str
    one_interval: str
    step_less_one: str | None
    look: int


def windows(spec: AnalysisSpec, window_seconds: float, step_seconds: float | None = None) -> Windows:
    """The windows of a measurement over ``window_seconds`` in a step of ``step_seconds`` (schedule.py picks both)."""
    step = window_seconds if step_seconds is None else max(window_seconds, step_seconds)
    less_one = step - spec.interval_seconds
    return Windows(
        interval=promql.format_window(window_seconds),
        step=promql.format_window(step),
        one_interval=promql.format_window(spec.interval_seconds),
        step_less_one=promql.format_window(less_one) if less_one >= 1 else None,
        look=look_number(spec, step),
    )


def query_name(feeds: str, template: str, role: promql.Role) -> str:
    return f"{feeds}/{template}/{role}"


@dataclass(frozen=True)
class Query:
    """One role's query: its answer feeds the measurement ``feeds``, as the ``promql`` template ``template`` says."""

    feeds: str  # requests, a latency check's metric (ttft-p95), errorRate, ..., saturation, kvCapacity
    template: str
    role: promql.Role
    expression: str  # the PromQL, rendered

    @property
    def name(self) -> str:
        return query_name(self.feeds, self.template, self.role)

    @property
    def shape(self) -> Shape:
        return _SHAPES.get(self.template, "value")


@dataclass(frozen=True)
class Plan:
    """The queries of one measurement, in the order they run, and the look of the step it is."""

    queries: tuple[Query, ...]
    look: int = 1  # which look of the step (read by the rank test only)
    learned: frozenset[str] = frozenset()  # the latency checks (ttft-p95) whose pods' noise was learned

    def measures(self, feeds: str, template: str | None = None) -> bool:
        return any(q.feeds == feeds and template in (None, q.template) for q in self.queries)

    def canary_query(self, feeds: str, template: str) -> str:
        """The text a measurement keeps for people (the baseline's query differs only in its label matchers)."""
        return next(q.expression for q in self.queries if q.name == query_name(feeds, template, "canary"))


def _both(feeds: str, template: str, selector: promql.Selector, render: Callable[[str], str]) -> list[Query]:
    return [Query(feeds, template, role, render(selector.for_role(role))) for role in ROLES]


def _named(feeds: str, template: str, selector: promql.Selector, window: str) -> list[Query]:
    return _both(feeds, template, selector, partial(promql.render_named, template, window=window))


def _latency(check: LatencyCheck, selector: promql.Selector, windows: Windows, estimator: Estimator) -> list[Query]:
    feeds, metric = latency_metric_name(check), check.metric
    if check.test != "rank" and estimator == "histogram_quantile":
        render = partial(promql.render_latency, metric, check.quantile, window=windows.interval)
        return _both(feeds, "latency", selector, render)

    def counts(template: str, window: str) -> list[Query]:
        render = partial(promql.render_latency_buckets, metric, window=window, template=template)
        return _both(feeds, template, selector, render)

    if check.test != "rank":
        return counts("latency_buckets", windows.interval)
    # Each pod's counts over the step (the test); where no role has two pods (``needed``), the step's full intervals
    # (the replicates, from the third look: the first looks have too few); this interval's counts (for people).
    queries = counts("latency_pod_counts", windows.step)
    if windows.look > FEWEST_INTERVALS and windows.step_less_one is not None:
        render = partial(
            promql.render_interval_buckets, metric, window=windows.one_interval, range_=windows.step_less_one
        )
        queries += _both(feeds, "latency_interval_counts", selector, render)
    return queries + counts("latency_counts", windows.interval)


def analysis_plan(
    spec: AnalysisSpec,
    selector: promql.Selector,
    windows: Windows,
    estimator: Estimator = "buckets",
    learned: Mapping[str, FleetNoise] | None = None,
) -> Plan:
    """The queries of one measurement: the requests (the gate), each latency check, the error rate, preemptions and
    KV cache usage, and the saturation check's inputs where it is enabled; each for the baseline, then the canary.
    ``learned``: the pods' noise learned per metric (ttft): those checks' step intervals are asked for its guard."""
    queries = _named(REQUESTS, "requests", selector, windows.interval)
    for check in spec.latency:
        queries += _latency(check, selector, windows, estimator)
    for feeds, template in _NAMED:
        queries += _named(feeds, template, selector, windows.interval)
    if spec.saturation.mode != "disabled":
        for _, template in SATURATION_INPUTS:
            queries += _named(SATURATION, template, selector, windows.interval)
    checks = frozenset(latency_metric_name(check) for check in spec.latency if check.metric in (learned or {}))
    return Plan(tuple(queries), windows.look, checks)


def history_plan(spec: AnalysisSpec, selector: promql.Selector) -> Plan:
    """The baseline pods' history of each rank test's metric (``spec.history``: samples over the lookback, each one
    analysis interval long), for ``learned_noise``."""
    history = spec.history
    metrics = _history_metrics(spec)
    window = promql.format_window(spec.interval_seconds)
    range_ = promql.format_window(history.lookback_seconds)
    resolution = promql.format_window(max(spec.interval_seconds, history.lookback_seconds / history.samples))
    return Plan(
        tuple(
            Query(metric, "latency_history", "baseline",
                  promql.render_history(metric, selector.for_role("baseline"), window, range_, resolution))
            for metric in metrics
        )
    )  # fmt: skip


def _history_metrics(spec: AnalysisSpec) -> list[LatencyMetric]:
    return sorted({check.metric for check in spec.latency if check.test == "rank"})


def learned_noise(spec: AnalysisSpec, answers: "Answers", at: str) -> list[NoiseStatus]:
    """Each metric's noise as ``history_plan``'s answers show it (or why not: a failed query, too short a history)."""
    out = []
    for metric in _history_metrics(spec):
        failed = answers.failures.get(metric)
        if failed is not None:
            out.append(noise_status(metric, f"history: the query failed ({failed.message})", at))
            continue
        history = answers.history.get(query_name(metric, "latency_history", "baseline"), [])
        out.append(noise_status(metric, learn_noise(history), at))
    return out


def kv_cache_plan(selector: promql.Selector) -> Plan:
    """The KV cache configuration each role's pods report (an instant query: the info series is constant)."""
    return Plan(tuple(_both(KV_CAPACITY, "kv_cache_config", selector, promql.render_kv_cache_config)))


@dataclass(frozen=True)
class Failure:
    query: str  # the PromQL that failed
    message: str  # no answer's body: the provider's fixed description
    unusable: bool  # Prometheus could not be used at all (no answer, TLS, credentials), not only this query


@dataclass
class Answers:
    """What the provider parsed from each query's answer (by query name, one map per shape), and the first failure
    of each measurement (by ``feeds``): filled as the plan runs, read by ``needed`` and ``measurements``."""

    values: dict[str, float | None] = field(default_factory=dict)  # None: no series
    buckets: dict[str, Buckets] = field(default_factory=dict)  # (le, value) pairs of a sum by (le); empty: no series
    pod_buckets: dict[str, Sequence[Buckets]] = field(default_factory=dict)  # one per pod, in a stable order
    interval_buckets: dict[str, Mapping[float, Buckets]] = field(default_factory=dict)  # one per evaluation time
    history: dict[str, Sequence[HistoryInterval]] = field(default_factory=dict)  # per sampled time: each pod's
    labels: dict[str, Sequence[Mapping[str, str]]] = field(default_factory=dict)  # each series' label set
    failures: dict[str, Failure] = field(default_factory=dict)


def needed(query: Query, answers: Answers, learned: frozenset[str] = frozenset()) -> bool:
    """Whether the provider runs ``query`` now, given the answers so far (``learned``: ``Plan.learned``)."""
    if query.template == "latency_history":  # a plan of its own: no requests gate it
        return query.feeds not in answers.failures
    if REQUESTS in answers.failures or query.feeds in answers.failures:
        return False
    if query.template == "latency_interval_counts":  # the replicates where the pods cannot be, and the guard's data
        pods = _roles(answers.pod_buckets, query.feeds, "latency_pod_counts", [])
        return query.feeds in learned or not has_pod_reference(*pods)
    return True


def _roles(answered: Mapping[str, T], feeds: str, template: str, missing: T) -> tuple[T, T]:
    baseline, canary = (answered.get(query_name(feeds, template, role), missing) for role in ROLES)
    return baseline, canary


def measurements(
    spec: AnalysisSpec, plan: Plan, answers: Answers, at: str, learned: Mapping[str, FleetNoise] | None = None
) -> list[Measurement]:
    """The interval's Measurements, in the plan's order; a failed measurement is an Error in its place. ``learned``:
    the pods' noise learned per metric (ttft), for the rank test."""
    failed = answers.failures.get(REQUESTS)
    if failed is not None:
        return [error_measurement(UNUSABLE if failed.unusable else REQUESTS, failed.message, at=at)]
    counts = RequestCounts(*_roles(answers.values, REQUESTS, "requests", None))
    query = plan.canary_query(REQUESTS, "requests")
    out = [assess_requests(counts, min_requests=spec.min_requests, at=at, query=query)]
    gate = RequestGate(counts, spec.min_requests)
    for check in spec.latency:
        failed = answers.failures.get(latency_metric_name(check))
        if failed is not None:
            out.append(error_measurement(latency_metric_name(check), failed.message, at=at))
        elif check.test == "rank":
            out.append(_rank(spec, check, plan, answers, counts, at, (learned or {}).get(check.metric)))
        else:
            out.append(assess_latency(check, _quantiles(check, plan, answers), gate=gate, at=at))
    for metric, template in _NAMED:
        failed = answers.failures.get(metric)
        if failed is not None:
            out.append(error_measurement(metric, failed.message, at=at))
            continue
        reading = Reading(*_roles(answers.values, metric, template, None), plan.canary_query(metric, template))
        if metric == "errorRate":
            out.append(assess_error_rate(spec.max_error_rate, reading, gate=gate, at=at))
        else:
            out.append(informational(metric, reading.baseline, reading.canary, at=at, query=reading.query))
    if plan.measures(SATURATION):
        out += _saturation(spec, plan, answers, counts, at)
    return out


def _quantiles(check: LatencyCheck, plan: Plan, answers: Answers) -> Reading:
    feeds = latency_metric_name(check)
    if plan.measures(feeds, "latency"):  # Prometheus' histogram_quantile
        return Reading(*_roles(answers.values, feeds, "latency", None), plan.canary_query(feeds, "latency"))
    baseline, canary = (
        quantile_from_buckets(check.quantile, points) if points else None
        for points in _roles(answers.buckets, feeds, "latency_buckets", [])
    )
    return Reading(baseline, canary, plan.canary_query(feeds, "latency_buckets"))


def _rank(
    spec: AnalysisSpec,
    check: LatencyCheck,
    plan: Plan,
    answers: Answers,
    counts: RequestCounts,
    at: str,
    noise: FleetNoise | None,
) -> Measurement:
    feeds = latency_metric_name(check)
    pooled = _roles(answers.pod_buckets, feeds, "latency_pod_counts", [])
    intervals = None
    if noise is not None or not has_pod_reference(*pooled):  # the replicates, or the guard's data (from look 3)
        baseline, canary = _roles(answers.interval_buckets, feeds, "latency_interval_counts", {})
        both = sorted(baseline.keys() & canary.keys())
        intervals = ([baseline[moment] for moment in both], [canary[moment] for moment in both])
    return assess_latency_check(
        check, spec, _roles(answers.buckets, feeds, "latency_counts", []), pooled,
        look=plan.look, requests=counts, at=at, query=plan.canary_query(feeds, "latency_pod_counts"),
        intervals=intervals, noise=noise,
    )  # fmt: skip


def _saturation(spec: AnalysisSpec, plan: Plan, answers: Answers, counts: RequestCounts, at: str) -> list[Measurement]:
    failed = answers.failures.get(SATURATION)
    if failed is not None:
        return [error_measurement(SATURATION, failed.message, at=at)]
    values = {key: _roles(answers.values, SATURATION, template, None) for key, template in SATURATION_INPUTS}
    queries: dict[str, str | None] = {
        key: plan.canary_query(SATURATION, template) for key, template in SATURATION_INPUTS
    }

    def load(role: int, requests: float | None) -> Load:
        return Load(values["running"][role], values["waiting"][role], values["preemptions"][role], requests)

    baseline, canary = load(0, counts.baseline), load(1, counts.canary)
    return assess_saturation(spec.saturation, baseline, canary, min_requests=spec.min_requests, at=at, queries=queries)


def kv_cache_readings(plan: Plan, answers: Answers) -> KVCacheReadings:
    """Each role's distinct KV cache configurations (``kv_cache_plan``'s answers)."""
    failed = answers.failures.get(KV_CAPACITY)
    if failed is not None:
        return KVCacheReadings(query=failed.query, error=failed.message)

    def configs(series: Sequence[Mapping[str, str]]) -> tuple[KVCacheConfig, ...]:
        parsed = (parse_cache_config(labels) for labels in series)
        return tuple(config for config in parsed if config is not None)

    baseline, canary = _roles(answers.labels, KV_CAPACITY, "kv_cache_config", [])
    query = plan.canary_query(KV_CAPACITY, "kv_cache_config")
    return KVCacheReadings(baseline=configs(baseline), canary=configs(canary), query=query)
