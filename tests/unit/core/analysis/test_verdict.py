"""Unit tests of the pure analysis core: strict PromQL rendering, measurement assessment, the counter model."""

import math
from datetime import UTC, datetime

import pytest

from kvcal.core.analysis import promql
from kvcal.core.analysis.schedule import query_window_seconds
from kvcal.core.analysis.verdict import (
    Reading,
    RequestCounts,
    RequestGate,
    assess_error_rate,
    assess_latency,
    assess_requests,
    assess_run,
    error_measurement,
    informational,
    interval_phase,
    quantile_from_buckets,
)
from kvcal.models.spec import AnalysisSpec, LatencyCheck
from kvcal.models.status import MAX_MEASUREMENTS, AnalysisStatus, Measurement

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
AT = "2026-12-02T10:00:00Z"
TTFT = LatencyCheck(metric="ttft", quantile=0.95, max_regression=0.10, noise_floor_seconds=0.005)
ENOUGH = RequestCounts(100, 100)


# --- PromQL rendering -------------------------------------------------------------------------------------------


def test_render_fails_on_a_missing_variable() -> None:
    with pytest.raises(promql.TemplateError, match="not given: window"):
        promql.render("rate(x{$selector}[$window])", {"selector": 'a="b"'})


def test_render_latency_query_shape() -> None:
    sel = promql.pod_label_selector("prod", "llm", {"app": "llm"}).for_role("canary")
    q = promql.render_latency("ttft", 0.95, sel, "60s")
    assert q == (
        'histogram_quantile(0.95, sum by (le) (rate({__name__=~"vllm[:_]time_to_first_token_seconds_bucket",'
        'namespace="prod",kvcal_dev_calibration="llm",role="canary"}[60s])))'
    )


def test_render_interval_buckets_is_a_subquery_of_the_step_less_one_interval() -> None:
    sel = promql.pod_label_selector("prod", "llm", {"app": "llm"}).for_role("canary")
    q = promql.render_interval_buckets("ttft", sel, "60s", "240s")
    assert q == (
        '(sum by (le) (increase({__name__=~"vllm[:_]time_to_first_token_seconds_bucket",namespace="prod",'
        'kvcal_dev_calibration="llm",role="canary"}[60s])))[240s:60s]'
    )
    with pytest.raises(promql.TemplateError, match="window"):
        promql.render_interval_buckets("ttft", sel, "60s", "4m]) or vector(1")


def test_vllm_series_matches_both_spellings() -> None:
    import re

    pattern = promql.vllm_series("request_success_total").split('"')[1]
    assert re.fullmatch(pattern, "vllm:request_success_total") and re.fullmatch(pattern, "vllm_request_success_total")


@pytest.mark.parametrize(
    ("metric", "quantile", "window", "error"),
    [("tpot", 0.95, "60s", "latency metric"), ("ttft", 1.5, "60s", "quantile"), ("ttft", 0.9, "1m; drop", "window")],
)
def test_render_latency_rejects_bad_values(metric: str, quantile: float, window: str, error: str) -> None:
    with pytest.raises(promql.TemplateError, match=error):
        promql.render_latency(metric, quantile, 'a="b"', window)


def test_label_values_are_escaped() -> None:
    sel = promql.pod_label_selector('ns"} or vector(1) #', "llm", {"app": 'x"}'}).for_role("baseline")
    assert sel == 'namespace="ns\\"} or vector(1) #",app="x\\"}",kvcal_dev_calibration=""'


def test_label_names_are_validated() -> None:
    with pytest.raises(promql.TemplateError, match="label name"):
        promql.Matcher("bad-name", "=", "x").render()


def test_pod_label_selector_tells_roles_apart_by_pod_labels_for_every_workload_kind() -> None:
    """Series labels as Prometheus's pod discovery + labelmap give them; StatefulSet pods (NAME-0) have no
    Deployment-style name, and a `replicas` canary carries the baseline's labels too."""
    sel = promql.pod_label_selector("ns", "llm", {"app.kubernetes.io/name": "llm", "tier": "serving"})

    def matches(matchers: tuple[promql.Matcher, ...], series: dict[str, str]) -> bool:
        return all(series.get(m.label, "") == m.value for m in matchers)

    baseline_pod = {"namespace": "ns", "pod": "llm-0", "app_kubernetes_io_name": "llm", "tier": "serving"}
    canary_pod = {**baseline_pod, "pod": "llm-canary-0", "role": "canary", "kvcal_dev_calibration": "llm"}
    other_canary = {**canary_pod, "kvcal_dev_calibration": "other"}
    elsewhere = {**baseline_pod, "namespace": "prod"}
    assert [matches(sel.baseline, s) for s in (baseline_pod, canary_pod, other_canary, elsewhere)] == [
        True, False, False, False,
    ]  # fmt: skip
    assert [matches(sel.canary, s) for s in (baseline_pod, canary_pod, other_canary, elsewhere)] == [
        False, True, False, False,
    ]  # fmt: skip


def test_pod_label_selector_needs_the_baselines_match_labels() -> None:
    with pytest.raises(promql.TemplateError, match="matchLabels"):
        promql.pod_label_selector("ns", "llm", {})


def test_error_rate_treats_no_5xx_series_as_zero() -> None:
    q = promql.render_named("error_rate", 'role="canary"', "30s")
    assert "or vector(0)" in q and 'status="5xx"' in q


def test_format_window() -> None:
    assert promql.format_window(59.6) == "60s"
    assert promql.format_window(0.2) == "1s"
    with pytest.raises(promql.TemplateError):
        promql.format_window(math.nan)


# --- assess_* -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("baseline", "canary", "phase"),
    [
        (0.200, 0.215, "Successful"),  # +7.5% < 10%
        (0.200, 0.230, "Failed"),  # +15%
        (0.001, 0.002, "Successful"),  # +100% but 1 ms: inside the 5 ms noise floor
        (0.001, 0.0075, "Failed"),  # 6.5 ms above: outside the floor
        (0.200, math.nan, "Inconclusive"),
        (None, 0.2, "Inconclusive"),
        (0.2, math.inf, "Inconclusive"),
    ],
)
def test_assess_latency(baseline: float | None, canary: float | None, phase: str) -> None:
    m = assess_latency(TTFT, Reading(baseline, canary, "q"), gate=RequestGate(ENOUGH, 50), at=AT)
    assert m.phase == phase
    assert m.metric == "ttft-p95" and m.query == "q"
    if phase != "Inconclusive":
        assert m.baseline == baseline and m.canary == canary and m.threshold is not None


def test_latency_below_min_requests_is_inconclusive_even_when_values_look_fine() -> None:
    m = assess_latency(TTFT, Reading(0.2, 0.2), gate=RequestGate(RequestCounts(500, 12), 50), at=AT)
    assert m.phase == "Inconclusive"
    assert m.message == "canary: 12 requests < minRequests 50"


def test_nan_values_are_not_stored_as_nan() -> None:
    m = assess_latency(TTFT, Reading(math.nan, 0.2), gate=RequestGate(ENOUGH, 50), at=AT)
    assert m.baseline is None and m.canary == 0.2
    assert "no data for baseline" in (m.message or "")


@pytest.mark.parametrize(
    ("baseline", "canary", "phase"),
    [(0.0, 0.005, "Successful"), (0.0, 0.05, "Failed"), (0.08, 0.05, "Successful"), (math.nan, 0.05, "Failed"),
     (0.0, math.nan, "Inconclusive")],
)  # fmt: skip
def test_assess_error_rate(baseline: float, canary: float, phase: str) -> None:
    m = assess_error_rate(0.01, Reading(baseline, canary), gate=RequestGate(ENOUGH, 50), at=AT)
    assert m.phase == phase


def test_assess_requests() -> None:
    assert assess_requests(RequestCounts(60, 50), min_requests=50, at=AT).phase == "Successful"
    low = assess_requests(RequestCounts(60, 0), min_requests=50, at=AT)
    assert low.phase == "Inconclusive" and low.threshold == 50
    assert assess_requests(RequestCounts(None, None), min_requests=50, at=AT).phase == "Inconclusive"


# --- interval + run ---------------------------------------------------------------------------------------------


def m(phase: str, metric: str = "ttft-p95", baseline: float = 0.2, canary: float = 0.21) -> Measurement:
    return Measurement(metric=metric, phase=phase, at=AT, baseline=baseline, canary=canary)  # type: ignore[arg-type]


def test_interval_phase_precedence_and_informational_metrics() -> None:
    assert interval_phase([m("Successful"), m("Inconclusive"), m("Error"), m("Failed")]) == "Failed"
    assert interval_phase([m("Successful"), m("Inconclusive"), m("Error")]) == "Error"
    assert interval_phase([m("Successful"), m("Inconclusive")]) == "Inconclusive"
    assert interval_phase([informational("preemptions", 1, 5, at=AT, query="q")]) is None
    assert interval_phase([]) is None


SPEC = AnalysisSpec(successful_intervals=3, failure_limit=1, inconclusive_limit=2, consecutive_error_limit=1)


def run(phases: list[str], spec: AnalysisSpec = SPEC) -> list[str]:
    status = AnalysisStatus()
    outcomes: list[str] = []
    for p in phases:
        verdict = assess_run(spec, status, [m(p)], NOW)
        status = verdict.status
        outcomes.append(verdict.outcome)
    return outcomes


@pytest.mark.parametrize(
    ("phases", "outcomes"),
    [
        (["Successful"] * 3, ["Running", "Running", "Passed"]),
        (["Failed", "Failed"], ["Running", "Failed"]),
        # flapping: never three successes in a row, and failures add up
        (["Successful", "Failed", "Successful", "Successful", "Failed"], ["Running"] * 4 + ["Failed"]),
        # no traffic: inconclusive never passes; the limit ends the run
        (["Inconclusive"] * 3, ["Running", "Running", "Failed"]),
        # an inconclusive interval breaks the success streak
        (["Successful", "Successful", "Inconclusive", "Successful"], ["Running"] * 4),
        # Prometheus down twice in a row
        (["Error", "Error"], ["Running", "Failed"]),
        # errors that are not consecutive do not end the run
        (["Error", "Successful", "Error", "Successful", "Successful", "Successful"], ["Running"] * 5 + ["Passed"]),
    ],
)
def test_counter_model(phases: list[str], outcomes: list[str]) -> None:
    assert run(phases) == outcomes


def test_failed_verdict_explains_with_the_failing_measurement() -> None:
    status = AnalysisStatus(failures=1)
    verdict = assess_run(SPEC, status, [m("Failed", canary=0.3), m("Successful", metric="itl-p95")], NOW)
    assert verdict.outcome == "Failed"
    assert verdict.reason.startswith("FailureLimit: 2 failed intervals")
    assert "ttft-p95" in verdict.reason and "itl-p95" not in verdict.reason


def test_counters_timestamps_delta_and_capped_history() -> None:
    status = AnalysisStatus()
    for i in range(MAX_MEASUREMENTS):
        verdict = assess_run(SPEC, status, [m("Successful", canary=0.2 + i / 1000), m("Successful", "itl-p95")], NOW)
        status = verdict.status.model_copy(update={"consecutive_successes": 0})
    assert len(status.measurements) == MAX_MEASUREMENTS
    assert status.measurements[-1].metric == "itl-p95"
    assert status.started_at == AT and status.last_measured_at == AT
    last_canary = 0.2 + (MAX_MEASUREMENTS - 1) / 1000
    assert status.ttft_p95_delta == f"{(last_canary / 0.2 - 1) * 100:+.1f}%"  # the last ttft-p95 vs baseline 0.2


def test_only_the_p95_sets_the_ttft_p95_delta() -> None:
    status = assess_run(SPEC, AnalysisStatus(), [m("Successful", "ttft-p50", canary=0.4)], NOW).status
    assert status.ttft_p95_delta is None
    both = [m("Successful", "ttft-p50", canary=0.4), m("Successful", canary=0.21)]
    status = assess_run(SPEC, status, both, NOW).status
    assert status.ttft_p95_delta == "+5.0%"


def test_no_new_measurements_changes_nothing() -> None:
    status = AnalysisStatus(consecutive_successes=1)
    verdict = assess_run(SPEC, status, [], NOW)
    assert verdict.status == status and verdict.outcome == "Running" and verdict.interval is None


def test_error_measurement_is_counted_as_error() -> None:
    e = error_measurement("prometheus", "Prometheus unreachable: ConnectionError", at=AT)
    verdict = assess_run(SPEC, AnalysisStatus(), [e], NOW)
    assert verdict.status.consecutive_errors == 1 and verdict.interval == "Error"


LIMITS = {"failure_limit": "Failed", "inconclusive_limit": "Inconclusive", "consecutive_error_limit": "Error"}


@pytest.mark.parametrize("limit", [0, 1, 3])
@pytest.mark.parametrize(("field", "phase"), LIMITS.items())
def test_a_limit_of_n_tolerates_n_intervals_and_the_next_rolls_back(field: str, phase: str, limit: int) -> None:
    """Argo Rollouts' meaning, as the CRD documents it: limit N tolerates N such intervals; N + 1 rolls back."""
    spec = AnalysisSpec(successful_intervals=100, **{field: limit})
    assert run([phase] * (limit + 1), spec) == ["Running"] * limit + ["Failed"]


# --- quantile estimate and query window ---------------------------------------------------------------------------


def lognormal_buckets(median: float, sigma: float, n: float = 1e6) -> list[tuple[float, float]]:
    from statistics import NormalDist

    bounds = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0]
    cdf = NormalDist(math.log(median), sigma).cdf
    return [*((b, n * cdf(math.log(b))) for b in bounds), (math.inf, n)]


def test_quantile_from_buckets_tracks_a_15_percent_shift_inside_wide_buckets() -> None:
    base = quantile_from_buckets(0.95, lognormal_buckets(0.2, 0.5))
    slow = quantile_from_buckets(0.95, lognormal_buckets(0.23, 0.5))
    assert base is not None and slow is not None
    assert base == pytest.approx(0.2 * math.exp(1.6449 * 0.5), rel=1e-3)
    assert slow / base == pytest.approx(1.15, rel=1e-3)


def test_quantile_from_buckets_edge_cases() -> None:
    assert quantile_from_buckets(0.95, [(0.1, 0), (math.inf, 0)]) is None
    assert quantile_from_buckets(0.5, [(0.1, 10), (0.2, 10), (math.inf, 10)]) == pytest.approx(0.05)  # first bucket
    assert quantile_from_buckets(0.99, [(0.1, 5), (0.2, 9), (math.inf, 10)]) == 0.2  # +Inf bucket: its lower bound
    # every sample at or below the bucket's upper bound: Prometheus' linear rule
    assert quantile_from_buckets(0.75, [(0.1, 5), (0.2, 10), (math.inf, 10)]) == pytest.approx(0.15)
    with pytest.raises(ValueError, match="le=\\+Inf"):
        quantile_from_buckets(0.95, [(0.1, 5)])


def test_query_window_grows_to_three_intervals_after_the_warmup() -> None:
    spec = AnalysisSpec(interval="60s", warmup="120s")
    assert query_window_seconds(spec, AnalysisStatus(), NOW) == 60

    def window(started: str) -> float:
        return query_window_seconds(spec, AnalysisStatus(started_at=started), NOW)

    assert window("2026-12-02T09:58:00Z") == 60  # first measurement, at the end of the warmup
    assert window("2026-12-02T09:57:00Z") == 120  # second
    assert window("2026-12-02T09:56:00Z") == 180  # third
    assert window("2026-12-02T09:00:00Z") == 180  # capped
