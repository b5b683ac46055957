"""The sequential rank test (kvcal.core.ranktest): the statistic against brute force, the error at its boundaries
over all the looks of a step, power, ties, and empty intervals."""

import itertools
import math
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from statistics import NormalDist

import numpy as np
import pytest

from kvcal.core.analysis import RequestCounts, assess_run
from kvcal.core.ranktest import (
    ALPHA,
    BOUNDARY_SHAPE,
    Buckets,
    assess_latency_check,
    cdf_at,
    cumulative_counts,
    design,
    grouped_mann_whitney,
    look_number,
    moved_baseline,
    rank_test,
    step_window_seconds,
)
from kvcal.core.sequential import decision_probability
from kvcal.models.spec import AnalysisSpec, LatencyCheck
from kvcal.models.status import AnalysisStatus

# vLLM 0.32's TTFT buckets (benchmarks/bench_analysis.py)
BOUNDS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0]
NOW = datetime(2026, 1, 1, tzinfo=UTC)
SPEC = AnalysisSpec(latency=[LatencyCheck(metric="ttft")])
CHECK = SPEC.latency[0]


def histogram(samples: np.ndarray) -> Buckets:
    cumulative = [float((samples <= bound).sum()) for bound in BOUNDS]
    return [*zip(BOUNDS, cumulative, strict=True), (math.inf, float(len(samples)))]


def brute_force(baseline: Sequence[int], canary: Sequence[int]) -> tuple[float, float, float]:
    """U by counting pairs, and its exact mean and variance over every split of the pooled categories."""
    labels = [i for i, n in enumerate(baseline) for _ in range(n)] + [i for i, n in enumerate(canary) for _ in range(n)]

    def u_of(canary_labels: list[int], baseline_labels: list[int]) -> float:
        return sum(1.0 if c > b else 0.5 if c == b else 0.0 for c in canary_labels for b in baseline_labels)

    n_baseline = sum(baseline)
    observed = u_of(labels[n_baseline:], labels[:n_baseline])
    values = []
    for chosen in itertools.combinations(range(len(labels)), sum(canary)):
        canary_labels = [labels[i] for i in chosen]
        baseline_labels = [labels[i] for i in range(len(labels)) if i not in chosen]
        values.append(u_of(canary_labels, baseline_labels))
    mean = sum(values) / len(values)
    return observed, mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


@pytest.mark.parametrize(
    ("baseline", "canary"),
    [([2, 1, 0, 1], [0, 1, 2, 1]), ([3, 0, 2], [1, 2, 0]), ([1, 1, 1, 1, 1], [1, 0, 2, 0, 1]), ([4, 0], [0, 3])],
)
def test_grouped_statistic_equals_brute_force_with_ties(baseline: list[int], canary: list[int]) -> None:
    """U counts slower pairs with ties as half; mean and tie-corrected variance are the exact permutation moments."""
    u_statistic, mean, deviation = grouped_mann_whitney([float(n) for n in baseline], [float(n) for n in canary])
    expected = brute_force(baseline, canary)
    assert u_statistic == pytest.approx(expected[0])
    assert mean == pytest.approx(expected[1])
    assert deviation == pytest.approx(expected[2])


def test_all_requests_in_one_bucket_are_all_ties() -> None:
    u_statistic, mean, deviation = grouped_mann_whitney([0.0, 40.0, 0.0], [0.0, 7.0, 0.0])
    assert (u_statistic, mean, deviation) == (140.0, 140.0, 0.0)
    buckets = [(0.1, 0.0), (0.25, 40.0), (math.inf, 40.0)]
    result = rank_test(buckets, [(0.1, 0.0), (0.25, 7.0), (math.inf, 7.0)], design(CHECK, SPEC), look=1)
    assert result.slower == 0.5
    assert result.verdict != "Failed"  # nothing shows the canary slower


def test_moved_baseline_of_a_lognormal_is_exact() -> None:
    """Interpolating inside a bucket on a probit-log scale reads a lognormal's moved CDF exactly."""
    normal = NormalDist()

    def cdf(x: float) -> float:
        return normal.cdf(math.log(x / 0.2) / 0.5)

    buckets = [*((b, 1e6 * cdf(b)) for b in BOUNDS), (math.inf, 1e6)]
    moved = moved_baseline(cumulative_counts(buckets), BOUNDS, 0.05, 0.0)
    for bound, count in zip(BOUNDS, moved, strict=True):
        assert count == pytest.approx(1e6 * cdf(bound / 1.05), abs=1e-3)
    assert cdf_at(cumulative_counts(buckets), 0.3) == pytest.approx(cdf(0.3))


def test_design_spends_alpha_over_the_looks_the_counters_need() -> None:
    """failureLimit 1: the second Failed look rolls back; successfulIntervals 5: five Successful looks in a row
    promote. Each boundary is designed so that over the step's 10 looks either decision errs with probability
    alpha at its tolerance boundary, and it rises as (look / looks)^0.25."""
    plan = design(CHECK, SPEC)
    assert (plan.looks, plan.rollback_tolerance, plan.promote_tolerance) == (10, 0.05, 0.10)
    for bounds, needed, consecutive in ((plan.rollback_boundaries, 2, False), (plan.promote_boundaries, 5, True)):
        assert len(bounds) == 10
        assert [b / bounds[-1] for b in bounds] == pytest.approx([(k / 10) ** BOUNDARY_SHAPE for k in range(1, 11)])
        assert decision_probability(bounds, needed, consecutive=consecutive) == pytest.approx(ALPHA, abs=1e-4)
    # Markov's bound (the design before) tested every look at 2.05 and 1.64: the exact design asks less of look 3.
    markov = [NormalDist().inv_cdf(1 - ALPHA * needed / 10) for needed in (2, 5)]
    assert plan.critical(3) == pytest.approx((1.556, 0.918), abs=2e-3)
    assert plan.critical(3)[0] < markov[0] and plan.critical(3)[1] < markov[1]


def roll_out(rng: np.random.Generator, ratio: float, per_interval: int, spec: AnalysisSpec = SPEC) -> tuple[str, int]:
    """One analysis step through the operator's functions: lognormal TTFT with load drift shared by both sides."""
    status = AnalysisStatus()
    baseline_samples: list[np.ndarray] = []
    canary_samples: list[np.ndarray] = []
    for look in range(1, 16):
        load = math.exp(rng.normal(0, 0.15))
        baseline_samples.append(np.exp(rng.normal(0, 0.5, 9 * per_interval)) * 0.2 * load)
        canary_samples.append(np.exp(rng.normal(0, 0.5, per_interval)) * 0.2 * load * ratio)
        interval = (histogram(baseline_samples[-1]), histogram(canary_samples[-1]))
        pooled = (histogram(np.concatenate(baseline_samples)), histogram(np.concatenate(canary_samples)))
        requests = RequestCounts(9.0 * per_interval, float(per_interval))
        measured = assess_latency_check(
            spec.latency[0], spec, interval, pooled, look=look, requests=requests, at=f"t{look}"
        )
        verdict = assess_run(spec, status, [measured], NOW)
        status = verdict.status
        if verdict.outcome != "Running":
            return verdict.outcome, look
    return "Running", 15


@pytest.mark.parametrize(("ratio", "outcome"), [(1.05, "Failed"), (1.10, "Passed")])
def test_error_at_each_boundary_stays_within_alpha_over_all_looks(ratio: float, outcome: str) -> None:
    """A canary exactly at the rollback boundary (x1.05) is rolled back, one at the promote boundary (x1.10)
    promoted, in at most alpha (10%) of steps, counting every look and the counters (200 seeded steps)."""
    rng = np.random.default_rng(7)
    runs = 200
    wrong = sum(roll_out(rng, ratio, 300)[0] == outcome for _ in range(runs))
    assert wrong / runs <= 0.10


def test_power_and_promotion_at_300_requests_per_interval() -> None:
    """A 15% slower canary is rolled back within 3 intervals, an unchanged one promoted (no false rollback)."""
    rng = np.random.default_rng(11)
    regressed = [roll_out(rng, 1.15, 300) for _ in range(60)]
    healthy = [roll_out(rng, 1.0, 300)[0] for _ in range(60)]
    assert sum(outcome == "Failed" and looks <= 3 for outcome, looks in regressed) >= 0.8 * 60
    assert healthy.count("Passed") == 60


def test_no_requests_is_inconclusive_never_a_pass() -> None:
    empty: Buckets = [(0.1, 0.0), (math.inf, 0.0)]
    busy: Buckets = [(0.1, 50.0), (math.inf, 100.0)]
    for requests in (RequestCounts(0.0, 0.0), None):
        measured = assess_latency_check(CHECK, SPEC, (busy, empty), (busy, empty), look=1, requests=requests, at="t")
        assert measured.phase == "Inconclusive"
        assert measured.message


def test_after_the_last_look_the_step_is_inconclusive() -> None:
    rng = random.Random(3)
    samples = np.array([rng.lognormvariate(math.log(0.2), 0.5) for _ in range(2000)])
    buckets = histogram(samples)
    counts = RequestCounts(2000.0, 2000.0)
    within = assess_latency_check(CHECK, SPEC, (buckets, buckets), (buckets, buckets), look=10, requests=counts, at="t")
    past = assess_latency_check(CHECK, SPEC, (buckets, buckets), (buckets, buckets), look=11, requests=counts, at="t")
    assert within.phase == "Successful"
    assert past.phase == "Inconclusive"
    assert past.message is not None and "10 looks" in past.message


def test_undecided_resets_the_streak_and_counts_nothing_else() -> None:
    spec = SPEC.model_copy(update={"min_requests": 1})
    status = AnalysisStatus(consecutive_successes=3, failures=1, inconclusive=1)
    same: Buckets = [(0.25, 5.0), (0.5, 10.0), (math.inf, 10.0)]
    counts = RequestCounts(10.0, 10.0)
    measured = assess_latency_check(CHECK, spec, (same, same), (same, same), look=1, requests=counts, at="t")
    assert measured.phase == "Undecided"
    verdict = assess_run(spec, status, [measured], NOW)
    assert verdict.outcome == "Running"
    counters = verdict.status
    assert (counters.consecutive_successes, counters.failures, counters.inconclusive) == (0, 1, 1)


def test_quantile_test_is_today_s_check() -> None:
    spec = AnalysisSpec(latency=[LatencyCheck(metric="ttft", test="quantile")])
    slow: Buckets = [(0.25, 0.0), (0.5, 100.0), (math.inf, 100.0)]
    fast: Buckets = [(0.25, 100.0), (0.5, 100.0), (math.inf, 100.0)]
    counts = RequestCounts(100.0, 100.0)
    measured = assess_latency_check(spec.latency[0], spec, (fast, slow), None, look=1, requests=counts, at="t")
    assert measured.phase == "Failed"
    assert measured.message is not None and "limit" in measured.message


def test_the_step_window_grows_one_interval_per_look() -> None:
    """The reconciler's step window (since the step's first interval began) and the look it stands for."""
    status = AnalysisStatus(started_at="2026-01-01T00:00:00Z")  # default warmup 120 s, interval 60 s
    first = datetime(2026, 1, 1, 0, 2, tzinfo=UTC)
    windows = [step_window_seconds(SPEC, status, first + timedelta(minutes=k)) for k in (0, 2, 30)]
    assert windows == [60.0, 180.0, 660.0]  # capped one look past the last
    assert [look_number(SPEC, window) for window in windows] == [1, 3, 11]
