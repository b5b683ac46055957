"""The measurement plan (core/analysis/plan.py): which queries an interval asks, per role and look, which of them are
still needed as answers come, and how the answers become the Measurements the assess_* functions give."""

import random
from typing import TypeVar

import pytest

from kvcal.core.analysis import plan, promql
from kvcal.core.analysis.fleetnoise import FleetNoise
from kvcal.core.analysis.histograms import Buckets
from kvcal.core.analysis.plan import Answers, Failure, Plan, Query
from kvcal.core.analysis.ranktest import FEWEST_INTERVALS, assess_latency_check
from kvcal.core.analysis.saturation import Load, assess_saturation
from kvcal.core.analysis.verdict import (
    Reading,
    RequestCounts,
    RequestGate,
    assess_error_rate,
    assess_latency,
    assess_requests,
    quantile_from_buckets,
)
from kvcal.models.spec import AnalysisSpec, LatencyCheck, NoiseHistory

AT = "2026-01-02T03:04:05Z"
SELECTOR = promql.pod_label_selector("ns", "llm", {"app": "llm"})
RANK = LatencyCheck(metric="ttft", quantile=0.95, test="rank")
QUANTILE = LatencyCheck(metric="itl", quantile=0.99, test="quantile")
LES = (0.1, 0.25, 0.5, 1.0, float("inf"))
T = TypeVar("T")


def spec_with(*checks: LatencyCheck, saturation: str = "disabled") -> AnalysisSpec:
    return AnalysisSpec.model_validate(
        {"interval": "60s", "minRequests": 20, "saturation": {"mode": saturation}}
    ).model_copy(update={"latency": list(checks)})


def plan_at_look(spec: AnalysisSpec, look: int, estimator: plan.Estimator = "buckets") -> Plan:
    interval = spec.interval_seconds
    return plan.analysis_plan(spec, SELECTOR, plan.windows(spec, interval, look * interval), estimator)


def histogram(rng: random.Random, requests: int) -> Buckets:
    """Cumulative counts of ``requests`` spread at random over the buckets."""
    cuts = sorted(rng.randint(0, requests) for _ in LES[:-1])
    return list(zip(LES, [*cuts, requests], strict=True))


def answer_all(queries: Plan, rng: random.Random, pods: tuple[int, int] = (1, 1)) -> Answers:
    """Every needed query answered as a provider would parse it, with ``pods`` (baseline, canary) pods per role."""
    answers = Answers()
    for query in queries.queries:
        if not plan.needed(query, answers):
            continue
        if query.shape == "value":
            answers.values[query.name] = float(rng.randint(30, 300))
        elif query.shape == "buckets":
            answers.buckets[query.name] = histogram(rng, 200)
        elif query.shape == "pod_buckets":
            count = pods[0] if query.role == "baseline" else pods[1]
            answers.pod_buckets[query.name] = [histogram(rng, 100) for _ in range(count)]
        elif query.shape == "interval_buckets":  # the roles' samples overlap on two of their evaluation times
            start = 0.0 if query.role == "baseline" else 60.0
            answers.interval_buckets[query.name] = {start + 60 * i: histogram(rng, 50) for i in range(3)}
    return answers


def both(answered: dict[str, T], feeds: str, template: str) -> tuple[T, T]:
    """The baseline's and the canary's answer to ``feeds``'s ``template``."""
    return answered[plan.query_name(feeds, template, "baseline")], answered[plan.query_name(feeds, template, "canary")]


def the_query(queries: Plan, feeds: str, template: str, role: promql.Role) -> Query:
    (query,) = (q for q in queries.queries if q.name == plan.query_name(feeds, template, role))
    return query


def test_the_requests_come_first_then_each_check_then_the_informational_metrics() -> None:
    queries = plan_at_look(spec_with(RANK, QUANTILE, saturation="report"), look=1)
    feeds = list(dict.fromkeys(q.feeds for q in queries.queries))
    assert feeds == ["requests", "ttft-p95", "itl-p99", "errorRate", "preemptions", "kvCacheUsage", "saturation"]
    # Each template asked for the baseline, then for the canary.
    roles = [q.role for q in queries.queries]
    assert roles == ["baseline", "canary"] * (len(roles) // 2)
    assert len({q.name for q in queries.queries}) == len(queries.queries)


def test_saturation_is_asked_only_where_the_spec_enables_it() -> None:
    assert not plan_at_look(spec_with(), look=1).measures("saturation")
    for mode in ("report", "gate"):
        assert plan_at_look(spec_with(saturation=mode), look=1).measures("saturation")


def test_every_query_carries_its_roles_selector() -> None:
    spec = spec_with(RANK, QUANTILE, saturation="gate")
    for estimator in ("buckets", "histogram_quantile"):
        queries = plan_at_look(spec, look=FEWEST_INTERVALS + 1, estimator=estimator)
        for query in queries.queries:
            other: promql.Role = "canary" if query.role == "baseline" else "baseline"
            assert SELECTOR.for_role(query.role) in query.expression
            assert SELECTOR.for_role(other) not in query.expression


def test_the_windows_each_query_reads() -> None:
    spec = spec_with(RANK, QUANTILE)
    look = FEWEST_INTERVALS + 2
    windows = plan.windows(spec, spec.interval_seconds, look * spec.interval_seconds)
    assert (windows.look, windows.step_less_one) == (look, f"{(look - 1) * 60}s")
    queries = plan.analysis_plan(spec, SELECTOR, windows)
    assert f"[{windows.step}]" in the_query(queries, "ttft-p95", "latency_pod_counts", "canary").expression
    assert f"[{windows.interval}]" in the_query(queries, "ttft-p95", "latency_counts", "canary").expression
    subquery = the_query(queries, "ttft-p95", "latency_interval_counts", "canary").expression
    assert subquery.endswith(f"[{windows.step_less_one}:{windows.one_interval}]")
    assert f"[{windows.interval}]" in the_query(queries, "itl-p99", "latency_buckets", "canary").expression


@pytest.mark.parametrize("look", range(1, FEWEST_INTERVALS + 4))
def test_the_step_intervals_are_asked_only_after_the_first_looks(look: int) -> None:
    queries = plan_at_look(spec_with(RANK, QUANTILE), look)
    assert queries.look == look
    assert queries.measures("ttft-p95", "latency_interval_counts") == (look > FEWEST_INTERVALS)
    assert not queries.measures("itl-p99", "latency_interval_counts")  # the quantile test pools nothing


def test_the_estimator_picks_the_quantile_tests_query() -> None:
    spec = spec_with(RANK, QUANTILE)
    estimated, asked = plan_at_look(spec, 1, "buckets"), plan_at_look(spec, 1, "histogram_quantile")
    assert estimated.measures("itl-p99", "latency_buckets") and not estimated.measures("itl-p99", "latency")
    assert asked.measures("itl-p99", "latency") and not asked.measures("itl-p99", "latency_buckets")
    assert "histogram_quantile(0.99," in the_query(asked, "itl-p99", "latency", "canary").expression
    # The rank test reads counts whatever the estimator.
    assert [q.name for q in estimated.queries if q.feeds == "ttft-p95"] == [
        q.name for q in asked.queries if q.feeds == "ttft-p95"
    ]


@pytest.mark.parametrize(("pods", "intervals_needed"), [((1, 1), True), ((3, 1), False), ((1, 2), False)])
def test_the_step_intervals_are_needed_only_where_no_role_has_two_pods(
    pods: tuple[int, int], intervals_needed: bool
) -> None:
    queries = plan_at_look(spec_with(RANK), look=FEWEST_INTERVALS + 1)
    answers = answer_all(queries, random.Random(1), pods)
    interval_queries = [q for q in queries.queries if q.template == "latency_interval_counts"]
    assert len(interval_queries) == 2
    assert [q.name in answers.interval_buckets for q in interval_queries] == [intervals_needed] * 2


@pytest.mark.parametrize(("pods", "look"), [((1, 1), 1), ((1, 1), FEWEST_INTERVALS + 2), ((2, 1), 4)])
def test_the_answers_become_what_the_assess_functions_give(pods: tuple[int, int], look: int) -> None:
    spec = spec_with(RANK, QUANTILE, saturation="gate")
    queries = plan_at_look(spec, look)
    answers = answer_all(queries, random.Random(look), pods)
    measured = {m.metric: m for m in plan.measurements(spec, queries, answers, AT)}

    def canary(feeds: str, template: str) -> str:
        return the_query(queries, feeds, template, "canary").expression

    counts = RequestCounts(*both(answers.values, "requests", "requests"))
    gate = RequestGate(counts, spec.min_requests)
    assert measured["requests"] == assess_requests(counts, min_requests=20, at=AT, query=canary("requests", "requests"))
    pooled = both(answers.pod_buckets, "ttft-p95", "latency_pod_counts")
    intervals = None
    if pods == (1, 1):  # paired by evaluation time: only the times both roles have
        baseline, canary_intervals = (
            answers.interval_buckets.get(plan.query_name("ttft-p95", "latency_interval_counts", role), {})
            for role in plan.ROLES
        )
        both_times = sorted(baseline.keys() & canary_intervals.keys())
        assert len(both_times) == (2 if look > FEWEST_INTERVALS else 0)
        intervals = ([baseline[t] for t in both_times], [canary_intervals[t] for t in both_times])
    assert measured["ttft-p95"] == assess_latency_check(
        RANK, spec, both(answers.buckets, "ttft-p95", "latency_counts"), pooled,
        look=look, requests=counts, at=AT, query=canary("ttft-p95", "latency_pod_counts"), intervals=intervals,
    )  # fmt: skip
    quantiles = (quantile_from_buckets(0.99, b) for b in both(answers.buckets, "itl-p99", "latency_buckets"))
    reading = Reading(*quantiles, canary("itl-p99", "latency_buckets"))
    assert measured["itl-p99"] == assess_latency(QUANTILE, reading, gate=gate, at=AT)
    errors = Reading(*both(answers.values, "errorRate", "error_rate"), canary("errorRate", "error_rate"))
    assert measured["errorRate"] == assess_error_rate(spec.max_error_rate, errors, gate=gate, at=AT)
    assert (measured["preemptions"].baseline, measured["preemptions"].canary) == both(
        answers.values, "preemptions", "preemptions"
    )
    inputs = {key: both(answers.values, "saturation", template) for key, template in plan.SATURATION_INPUTS}
    loads = (
        Load(inputs["running"][role], inputs["waiting"][role], inputs["preemptions"][role], requests)
        for role, requests in enumerate((counts.baseline, counts.canary))
    )
    saturation = assess_saturation(
        spec.saturation, *loads, min_requests=20, at=AT,
        queries={key: canary("saturation", template) for key, template in plan.SATURATION_INPUTS},
    )  # fmt: skip
    assert [measured[m.metric] for m in saturation] == saturation


@pytest.mark.parametrize(("unusable", "metric"), [(True, "prometheus"), (False, "requests")])
def test_a_failed_gate_stops_the_interval_with_one_error(unusable: bool, metric: str) -> None:
    spec = spec_with(RANK, QUANTILE, saturation="gate")
    queries = plan_at_look(spec, look=1)
    answers = Answers()
    first = queries.queries[0]
    answers.failures[first.feeds] = Failure(first.expression, "no answer", unusable=unusable)
    assert not any(plan.needed(query, answers) for query in queries.queries)
    (error,) = plan.measurements(spec, queries, answers, AT)
    assert (error.metric, error.phase, error.message) == (metric, "Error", "no answer")


def test_a_failed_query_errors_its_own_measurement_in_its_place() -> None:
    spec = spec_with(RANK, QUANTILE)
    queries = plan_at_look(spec, look=1)
    answers = Answers()
    first = the_query(queries, "ttft-p95", "latency_pod_counts", "baseline")
    answers.failures[first.feeds] = Failure(first.expression, "refused", unusable=False)
    # The rest of the rank test is not asked; every other measurement is.
    assert [q.feeds for q in queries.queries if not plan.needed(q, answers)] == ["ttft-p95"] * 4
    answered = answer_all(queries, random.Random(7))
    answered.failures.update(answers.failures)
    measured = plan.measurements(spec, queries, answered, AT)
    assert [m.metric for m in measured] == [
        "requests",
        "ttft-p95",
        "itl-p99",
        "errorRate",
        "preemptions",
        "kvCacheUsage",
    ]
    assert [(m.metric, m.message) for m in measured if m.phase == "Error"] == [("ttft-p95", "refused")]


def test_the_kv_cache_plan_reads_each_roles_configurations() -> None:
    queries = plan.kv_cache_plan(SELECTOR)
    assert [q.role for q in queries.queries] == ["baseline", "canary"]
    answers = Answers()
    sizes = {"baseline": "8000", "canary": "16000"}
    for query in queries.queries:
        answers.labels[query.name] = [{"cache_dtype": "auto", "kv_cache_size_tokens": sizes[query.role]}]
    readings = plan.kv_cache_readings(queries, answers)
    assert readings.query == queries.queries[1].expression and readings.error is None
    assert [config.tokens for config in readings.baseline + readings.canary] == [int(sizes[r]) for r in plan.ROLES]
    answers.failures["kvCapacity"] = Failure(queries.queries[0].expression, "refused", unusable=True)
    failed = plan.kv_cache_readings(queries, answers)
    assert (failed.query, failed.error) == (queries.queries[0].expression, "refused")


NOISE = FleetNoise(node=1e-4, own=8e-4, node_degrees=8, own_degrees=760, pods=9, intervals=96, requests=300,
                   slowdown=0.047)  # fmt: skip


def test_with_learned_noise_the_step_intervals_are_always_asked_for_its_guard() -> None:
    spec = spec_with(RANK)
    queries = plan.analysis_plan(spec, SELECTOR, plan.windows(spec, 60, 180), learned={"ttft": NOISE})
    assert queries.learned == frozenset({"ttft-p95"})
    subquery, _ = (query for query in queries.queries if query.template == "latency_interval_counts")
    answers = Answers()
    pods = [histogram(random.Random(1), 100) for _ in range(9)]
    answers.pod_buckets[plan.query_name("ttft-p95", "latency_pod_counts", "baseline")] = pods
    answers.pod_buckets[plan.query_name("ttft-p95", "latency_pod_counts", "canary")] = pods[:1]
    assert not plan.needed(subquery, answers)  # 9 baseline pods: no replicates needed without learned noise
    assert plan.needed(subquery, answers, queries.learned)


def test_the_history_plan_samples_the_baselines_pods_over_the_lookback() -> None:
    spec = spec_with(RANK, QUANTILE).model_copy(
        update={"history": NoiseHistory(lookback="24h", samples=96)}
    )  # the quantile test learns nothing
    (query,) = plan.history_plan(spec, SELECTOR).queries
    assert (query.feeds, query.role, query.shape) == ("ttft", "baseline", "history")
    assert query.expression.startswith("(sum by (pod, instance, le) (increase({")
    assert query.expression.endswith("[60s])))[86400s:900s]")
    assert SELECTOR.for_role("baseline") in query.expression


def test_the_history_answers_become_each_metrics_noise_or_its_reason() -> None:
    spec = spec_with(RANK, LatencyCheck(metric="itl", test="rank"))
    answers = Answers()
    answers.failures["itl"] = Failure("q", "Prometheus 'default' answered HTTP 422: bad query", unusable=False)
    answers.history[plan.query_name("ttft", "latency_history", "baseline")] = [
        {"pod-a": histogram(random.Random(seed), 300)} for seed in range(20)
    ]
    itl, ttft = plan.learned_noise(spec, answers, AT)
    assert (ttft.metric, ttft.source) == ("ttft", "estimated") and "two pods answering" in (ttft.message or "")
    assert (itl.metric, itl.source) == ("itl", "estimated") and "the query failed" in (itl.message or "")
