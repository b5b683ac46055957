"""The sequential rank test (kvcal.core.analysis.ranktest): the statistic against brute force, the error at its
boundaries over all the looks of a step, power, ties, and empty intervals."""

import itertools
import math
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from statistics import NormalDist

import numpy as np
import pytest

from kvcal.core.analysis.histograms import Buckets, cdf_at, cumulative_counts, grouped_mann_whitney, moved_baseline
from kvcal.core.analysis.podspread import chi_square_quantile, normal_equivalent, pod_spread
from kvcal.core.analysis.ranktest import (
    BEYOND_ALPHA,
    BOUNDARY_ALPHA,
    BOUNDARY_SHAPE,
    NO_POD_REFERENCE,
    assess_latency_check,
    design,
    has_pod_reference,
    rank_test,
)
from kvcal.core.analysis.schedule import look_number, step_window_seconds
from kvcal.core.analysis.sequential import decision_probability
from kvcal.core.analysis.verdict import RequestCounts, assess_run
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
    result = rank_test([buckets], [[(0.1, 0.0), (0.25, 7.0), (math.inf, 7.0)]], design(CHECK, SPEC), look=1)
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


def test_first_bucket_of_a_lognormal_is_read_exactly() -> None:
    """A GPU's inter-token latency (~12 ms) puts a quarter of its tokens in vLLM's first ITL bucket (<= 10 ms), which
    has no lower bound to interpolate from: the next bucket's probit-log line, extended down, reads a lognormal's
    CDF there exactly (read linearly, moving it by 10% moved a quarter as much)."""
    normal = NormalDist()
    bounds = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15]

    def cdf(x: float) -> float:
        return normal.cdf(math.log(x / 0.012) / 0.3)

    points = cumulative_counts([*((b, 1e6 * cdf(b)) for b in bounds), (math.inf, 1e6)])
    for value in (0.002, 0.005, 0.01 / 1.1, 0.0099):
        assert cdf_at(points, value) == pytest.approx(cdf(value), abs=1e-9)
    moved = moved_baseline(points, bounds, 0.10, 0.0)
    assert moved[0] == pytest.approx(1e6 * cdf(0.01 / 1.1), abs=1e-3)
    # No neighbour to extend (all requests in the first bucket): linear, as before.
    alone = cumulative_counts([(0.01, 10.0), (0.025, 10.0), (math.inf, 10.0)])
    assert cdf_at(alone, 0.005) == pytest.approx(0.5)


def test_a_promotion_never_rests_on_the_inside_of_the_first_bucket() -> None:
    """Every token of both roles in vLLM's first ITL bucket (<= 10 ms, a fast GPU): the histograms cannot tell the
    canary within +10% of the baseline from 15% slower, so the promote side finds no evidence (read linearly, the
    first bucket moved as if uniform, and such a canary was promoted); the rollback side, tested exactly, finds the
    canary no slower either."""
    first: Buckets = [(0.01, 3000.0), (0.025, 3000.0), (0.05, 3000.0), (math.inf, 3000.0)]
    points = cumulative_counts(first)
    assert cdf_at(points, 0.005) == pytest.approx(0.5)  # linear, for the tests that may roll back
    assert cdf_at(points, 0.005, "upper") == 1.0  # the baseline moved least, for the tests that may promote
    result = rank_test([first] * 9, [first], design(LatencyCheck(metric="itl"), SPEC), look=5)
    assert result.verdict == "Undecided"
    assert result.z_within == pytest.approx(0.0) and result.z_healthy == pytest.approx(0.0)


def test_design_spends_alpha_over_the_looks_the_counters_need() -> None:
    """failureLimit 1: the second Failed look rolls back; successfulIntervals 5: five Successful looks in a row
    promote. Each boundary is designed so that over the step's 10 looks its decision errs with its alpha (10% at
    the tolerance, 0.5% one indifference zone beyond it), and it rises as (look / looks)^0.25."""
    plan = design(CHECK, SPEC)
    assert (plan.looks, plan.rollback_tolerance, plan.promote_tolerance) == (10, 0.05, 0.10)
    assert (plan.healthy_tolerance, plan.regressed_tolerance) == pytest.approx((0.0, 0.15))
    cases = (
        (plan.rollback_boundaries, 2, False, BOUNDARY_ALPHA), (plan.healthy_boundaries, 2, False, BEYOND_ALPHA),
        (plan.promote_boundaries, 5, True, BOUNDARY_ALPHA), (plan.regressed_boundaries, 5, True, BEYOND_ALPHA),
    )  # fmt: skip
    for bounds, needed, consecutive, alpha in cases:
        assert len(bounds) == 10
        assert [b / bounds[-1] for b in bounds] == pytest.approx([(k / 10) ** BOUNDARY_SHAPE for k in range(1, 11)])
        assert decision_probability(bounds, needed, consecutive=consecutive) == pytest.approx(alpha, abs=1e-4)
    # Markov's bound (the design before) tested every look at 2.05 and 1.64: the exact design asks less of look 3.
    markov = [NormalDist().inv_cdf(1 - BOUNDARY_ALPHA * needed / 10) for needed in (2, 5)]
    rollback, _, promote, _ = plan.critical(3)
    assert (rollback, promote) == pytest.approx((1.556, 0.918), abs=2e-3)
    assert rollback < markov[0] and promote < markov[1]


def test_rollback_above_moves_the_rollback_boundary_and_the_zone() -> None:
    check = LatencyCheck(metric="ttft", max_regression=0.20, rollback_above=0.15)
    plan = design(check, SPEC)
    assert (plan.rollback_tolerance, plan.promote_tolerance) == (0.15, 0.20)
    assert (plan.healthy_tolerance, plan.regressed_tolerance) == pytest.approx((0.10, 0.25))
    with pytest.raises(ValueError, match="rollbackAbove must be at most maxRegression"):
        LatencyCheck(metric="ttft", max_regression=0.10, rollback_above=0.2)


@pytest.mark.parametrize(
    ("t_statistic", "degrees", "normal"), [(3.182, 3, 1.960), (2.015, 5, 1.645), (2.764, 10, 2.326)]
)
def test_normal_equivalent_reads_student_t_tails(t_statistic: float, degrees: float, normal: float) -> None:
    """Student's t quantiles (two-sided 5%, one-sided 5% and 1%) map to the normal's, slightly low (conservative)."""
    assert normal - 0.03 <= normal_equivalent(t_statistic, degrees) <= normal + 0.005
    assert normal_equivalent(-t_statistic, degrees) == -normal_equivalent(t_statistic, degrees)
    assert normal_equivalent(1.7, math.inf) == 1.7


def pods_of(
    rng: np.random.Generator, count: int, per_pod: int, scale: float, own: float, offsets: np.ndarray
) -> list[np.ndarray]:
    return [np.exp(rng.normal(0, 0.5, per_pod)) * 0.2 * scale * offsets[pod] * math.exp(rng.normal(0, own))
            for pod in range(count)]  # fmt: skip


def roll_out(
    rng: np.random.Generator,
    ratio: float,
    per_interval: int,
    spec: AnalysisSpec = SPEC,
    *,
    baseline_pods: int = 9,
    own: float = 0.0,
    node: float = 0.02,
) -> tuple[str, int]:
    """One analysis step through the operator's functions: lognormal TTFT with load drift shared by every pod, each
    pod on its own node (offset sigma ``node``) with its own per-interval load (sigma ``own``); the baseline has 9x
    the canary's requests over ``baseline_pods`` pods, the canary one pod."""
    status = AnalysisStatus()
    baseline_offsets = np.exp(rng.normal(0, node, baseline_pods))
    canary_offset = np.exp(rng.normal(0, node, 1))
    baseline_samples: list[list[np.ndarray]] = [[] for _ in range(baseline_pods)]
    canary_samples: list[np.ndarray] = []
    per_pod = 9 * per_interval // baseline_pods
    for look in range(1, 16):
        load = math.exp(rng.normal(0, 0.15))
        now = pods_of(rng, baseline_pods, per_pod, load, own, baseline_offsets)
        for pod, samples in enumerate(now):
            baseline_samples[pod].append(samples)
        canary_samples.append(pods_of(rng, 1, per_interval, load * ratio, own, canary_offset)[0])
        interval = (histogram(np.concatenate(now)), histogram(canary_samples[-1]))
        pooled = (
            [histogram(np.concatenate(pod)) for pod in baseline_samples],
            [histogram(np.concatenate(canary_samples))],
        )
        requests = RequestCounts(float(per_pod * baseline_pods), float(per_interval))
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
    promoted, in at most alpha (10%) of steps, counting every look and the counters (200 seeded steps; pods alike,
    so that the canary is exactly at the boundary)."""
    rng = np.random.default_rng(7)
    runs = 200
    wrong = sum(roll_out(rng, ratio, 300, node=0.0)[0] == outcome for _ in range(runs))
    assert wrong / runs <= BOUNDARY_ALPHA


def test_power_and_promotion_at_300_requests_per_interval() -> None:
    """A 15% slower canary is rolled back within 3 intervals, an unchanged one promoted (no false rollback)."""
    rng = np.random.default_rng(11)
    regressed = [roll_out(rng, 1.15, 300) for _ in range(60)]
    healthy = [roll_out(rng, 1.0, 300)[0] for _ in range(60)]
    assert sum(outcome == "Failed" and looks <= 3 for outcome, looks in regressed) >= 0.65 * 60
    assert healthy.count("Passed") >= 58 and "Failed" not in healthy


def test_the_floor_widens_every_tolerance_but_the_healthy_one() -> None:
    """noiseFloorSeconds widens the rollback and promote tolerances and the one beyond maxRegression (a canary within
    it of the baseline is never confidently slower, and can be promoted), not the 0.5% test below rollbackAbove,
    which only guards healthy canaries: at a 0.2 s TTFT a 5 ms floor made "no slower" read as about +2.5% there
    (tests/unit/core/analysis/test_ranktest_goal.py has what that cost)."""
    rng = np.random.default_rng(3)
    baseline = [histogram(np.exp(rng.normal(0, 0.5, 900)) * 0.2) for _ in range(9)]
    canary = [histogram(np.exp(rng.normal(0, 0.5, 900)) * 0.2 * 1.15)]
    floored = design(LatencyCheck(metric="ttft", noise_floor_seconds=0.02), SPEC)
    bare = design(LatencyCheck(metric="ttft", noise_floor_seconds=0.0), SPEC)
    with_floor, without = (rank_test(baseline, canary, plan, 3) for plan in (floored, bare))
    assert with_floor.z_healthy == without.z_healthy
    assert with_floor.z_slower < without.z_slower - 0.2  # the floor still widens the rollback tolerance
    assert with_floor.z_within < without.z_within - 0.2  # and the promote one (closer to promoting)
    assert with_floor.z_regressed < without.z_regressed - 0.2  # and the one beyond it


def test_a_noisy_canary_pod_is_not_rolled_back_for_its_own_noise() -> None:
    """The canary pod's own per-interval load (sigma 0.20) and node (sigma 0.05) with 4 baseline pods: counted
    request by request, such a healthy canary reads as slower in many steps; the pods' spread keeps it in."""
    rng = np.random.default_rng(5)
    outcomes = [roll_out(rng, 1.0, 300, baseline_pods=4, own=0.20, node=0.05)[0] for _ in range(100)]
    assert outcomes.count("Failed") <= 2
    assert outcomes.count("Undecided") > 50  # what no test can decide in 10 looks: its own outcome


def test_pod_spread_estimates_what_pods_differ_by_beyond_their_requests() -> None:
    """Pods drawn alike: no excess beyond their requests' noise (on average); pods on nodes 10% apart: an excess."""
    rng = np.random.default_rng(2)
    same, apart = [], []
    for _ in range(40):
        alike = [cumulative_counts(histogram(np.exp(rng.normal(0, 0.5, 500)) * 0.2)) for _ in range(6)]
        offsets = np.exp(rng.normal(0, 0.10, 6))
        spread = [cumulative_counts(histogram(np.exp(rng.normal(0, 0.5, 500)) * 0.2 * k)) for k in offsets]
        same.append(pod_spread([alike]).excess)
        apart.append(pod_spread([spread]).excess)
        assert pod_spread([alike, alike[:2]]).degrees == 6
    assert np.mean(same) < 0.2 * np.mean(apart)
    # 10% in log-latency at sigma 0.5 moves P(slower) by about 0.564 x 0.10: the excess's square root reads it.
    assert math.sqrt(np.mean(apart)) == pytest.approx(0.0564, rel=0.35)


def test_one_pod_per_role_says_its_verdict_counts_requests_alone() -> None:
    rng = np.random.default_rng(4)
    buckets = histogram(np.exp(rng.normal(0, 0.5, 2000)) * 0.2)
    counts = RequestCounts(2000.0, 2000.0)
    one = assess_latency_check(CHECK, SPEC, (buckets, buckets), ([buckets], [buckets]), look=1, requests=counts, at="t")
    assert one.message is not None and NO_POD_REFERENCE in one.message
    two = assess_latency_check(
        CHECK, SPEC, (buckets, buckets), ([buckets, buckets], [buckets]), look=1, requests=counts, at="t"
    )
    assert two.message is not None and "pods 2+1" in two.message and NO_POD_REFERENCE not in two.message


def test_no_requests_is_inconclusive_never_a_pass() -> None:
    empty: Buckets = [(0.1, 0.0), (math.inf, 0.0)]
    busy: Buckets = [(0.1, 50.0), (math.inf, 100.0)]
    for requests in (RequestCounts(0.0, 0.0), None):
        measured = assess_latency_check(
            CHECK, SPEC, (busy, empty), ([busy], [empty]), look=1, requests=requests, at="t"
        )
        assert measured.phase == "Inconclusive"
        assert measured.message


def test_after_the_last_look_the_run_is_undecided() -> None:
    """Past its last look the rank test is exhausted: the run's outcome is Undecided (onUndecided acts on it),
    never a latency failure and never Inconclusive."""
    rng = random.Random(3)
    samples = np.array([rng.lognormvariate(math.log(0.2), 0.5) for _ in range(2000)])
    buckets = histogram(samples)
    counts = RequestCounts(2000.0, 2000.0)
    pooled = ([buckets], [buckets])
    within = assess_latency_check(CHECK, SPEC, (buckets, buckets), pooled, look=10, requests=counts, at="t")
    past = assess_latency_check(CHECK, SPEC, (buckets, buckets), pooled, look=11, requests=counts, at="t")
    assert within.phase == "Successful" and not within.exhausted
    assert past.phase == "Undecided" and past.exhausted
    assert past.message is not None and "10 looks" in past.message and "undecided" in past.message
    verdict = assess_run(SPEC, AnalysisStatus(), [past], NOW)
    assert verdict.outcome == "Undecided"
    assert verdict.reason.startswith("Undecided: ttft-p95: undecided")


def test_undecided_resets_the_streak_and_counts_nothing_else() -> None:
    spec = SPEC.model_copy(update={"min_requests": 1})
    status = AnalysisStatus(consecutive_successes=3, failures=1, inconclusive=1)
    same: Buckets = [(0.25, 5.0), (0.5, 10.0), (math.inf, 10.0)]
    counts = RequestCounts(10.0, 10.0)
    measured = assess_latency_check(CHECK, spec, (same, same), ([same], [same]), look=1, requests=counts, at="t")
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


@pytest.mark.parametrize(("probability", "degrees", "quantile"), [(0.10, 3, 0.584), (0.10, 8, 3.490), (0.90, 5, 9.236)])
def test_chi_square_quantile_within_two_percent(probability: float, degrees: int, quantile: float) -> None:
    assert chi_square_quantile(probability, degrees) == pytest.approx(quantile, rel=0.02)


def step_of(rng: np.random.Generator, loads: Sequence[float], requests: int) -> list[Buckets]:
    """One histogram per interval of a pod whose own load moves its latency by ``loads`` (one factor per interval)."""
    return [histogram(np.exp(rng.normal(0, 0.5, requests)) * 0.2 * load) for load in loads]


def pooled_of(intervals: Sequence[Buckets]) -> Buckets:
    return [(le, sum(each[index][1] for each in intervals)) for index, (le, _) in enumerate(intervals[0])]


def one_pod_each(baseline: list[Buckets], canary: list[Buckets], *, intervals: bool) -> tuple[str, str]:
    """(phase, message) of look len(intervals) + 1 for 1 baseline and 1 canary pod: the intervals given as the
    operator fetches them (the step's full intervals), or none (requests alone)."""
    counts = RequestCounts(pooled_of(baseline)[-1][1], pooled_of(canary)[-1][1])
    measured = assess_latency_check(
        CHECK, SPEC, (baseline[-1], canary[-1]), ([pooled_of(baseline)], [pooled_of(canary)]),
        look=len(baseline) + 1, requests=counts, at="t", intervals=(baseline, canary) if intervals else None,
    )  # fmt: skip
    assert measured.message is not None
    return measured.phase, measured.message


def test_one_pod_per_role_learns_its_own_noise_from_the_steps_intervals() -> None:
    """Issue 24's one baseline pod: no other pod shows what a pod's own load does, but the step's intervals do. A
    healthy canary pod whose own load moves it by up to 30% from interval to interval (11% slower over the step)
    reads as confidently slower when requests alone count; with the intervals as replicates it is undecided."""
    rng = np.random.default_rng(11)
    baseline = step_of(rng, [1.0] * 6, 1000)
    canary = step_of(rng, [1.3, 0.85, 1.25, 0.9, 1.3, 1.1], 300)
    alone, _ = one_pod_each(baseline, canary, intervals=False)
    replicated, message = one_pod_each(baseline, canary, intervals=True)
    assert alone == "Failed"
    assert replicated == "Undecided", message
    assert NO_POD_REFERENCE in message and "over 6 intervals" in message, message


def test_one_pod_per_role_still_decides_when_its_intervals_agree() -> None:
    rng = np.random.default_rng(12)
    baseline = step_of(rng, [1.0] * 5, 1000)
    slower, healthy = step_of(rng, [1.5] * 5, 300), step_of(rng, [1.0] * 5, 300)
    assert one_pod_each(baseline, slower, intervals=True)[0] == "Failed"
    assert one_pod_each(baseline, healthy, intervals=True)[0] == "Successful"


def test_one_pod_per_role_needs_two_full_intervals_before_any_decision() -> None:
    rng = np.random.default_rng(13)
    baseline, slower = step_of(rng, [1.0], 1000), step_of(rng, [2.0], 300)
    assert one_pod_each(baseline, slower, intervals=False)[0] == "Failed"
    phase, message = one_pod_each(baseline, slower, intervals=True)
    assert phase == "Undecided" and "1 full interval(s) of the step, 2 needed" in message, message


def test_a_role_of_two_pods_is_a_reference_only_when_both_answered() -> None:
    busy: Buckets = [(0.1, 50.0), (math.inf, 100.0)]
    empty: Buckets = [(0.1, 0.0), (math.inf, 0.0)]
    assert has_pod_reference([busy, busy], [busy])
    assert has_pod_reference([busy], [busy, busy])
    assert not has_pod_reference([busy, empty], [busy])
    assert not has_pod_reference([busy], [busy])
