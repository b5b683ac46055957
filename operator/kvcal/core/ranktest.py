"""A sequential Mann-Whitney rank test on histogram bucket counts: is the canary slower than the baseline beyond
a tolerance? (docs/concepts.md, "The latency test", has the design and its reasons.)

- Data: vLLM's latency histograms as Prometheus' ``increase(..._bucket[window])`` returns them, pooled from the
  start of the analysis step. Requests in one bucket are tied; the test is the grouped (ordinal) Mann-Whitney U
  with mid-ranks and the tie-corrected variance.
- Tolerance: H0 "canary <= g(baseline)" with g(x) = max(x * (1 + tolerance), x + floor) is tested by moving the
  baseline's bucket bounds through g and reading the moved baseline on the canary's bounds (interpolated like
  ``quantile_from_buckets``: probit-log inside a bucket, exact for a lognormal).
- Two one-sided decisions: Failed when the canary is confidently slower than baseline x (1 + maxRegression/2),
  Successful when it is confidently faster than baseline x (1 + maxRegression), Undecided (more data) otherwise.
- Error over the looks of a step (at most 2 x successfulIntervals): the pooled statistic has nearly independent
  increments, so the boundaries are group-sequential ones designed for the counters (kvcal.core.sequential): a
  rollback needs failureLimit + 1 Failed looks, a promotion successfulIntervals Successful ones in a row, and each
  decision errs with probability alpha at its tolerance boundary over all the looks. The boundaries rise with the
  look (Wang-Tsiatis shape BOUNDARY_SHAPE), spending more of alpha where an early rollback saves the most.
"""

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from statistics import NormalDist
from typing import Literal

from kvcal.core.analysis import (
    Reading,
    RequestCounts,
    RequestGate,
    assess_latency,
    latency_metric_name,
    quantile_from_buckets,
    query_window_seconds,
    too_few_requests,
)
from kvcal.core.sequential import boundaries
from kvcal.models.spec import AnalysisSpec, LatencyCheck
from kvcal.models.status import AnalysisStatus, Measurement

# One-sided error of each decision over all the looks of one analysis step, at the tolerance boundary.
ALPHA = 0.10
# Looks per analysis step, as a multiple of successfulIntervals (the consecutive confident looks a promotion needs).
LOOKS_PER_SUCCESSFUL_INTERVAL = 2
# Both boundaries grow as (look / looks)^BOUNDARY_SHAPE (Wang and Tsiatis' family; 0 would be Pocock's constant
# boundary): more of alpha is spent on the first looks, where a slower canary is caught before it serves for long.
BOUNDARY_SHAPE = 0.25

Buckets = Sequence[tuple[float, float]]  # (upper bound le, cumulative count), le=+Inf included
RankVerdict = Literal["Failed", "Successful", "Undecided"]
_NORMAL = NormalDist()


@dataclass(frozen=True)
class Design:
    """The sequential test of one latency check: boundaries (ratios - 1) and per-look critical values."""

    looks: int
    rollback_tolerance: float  # H0 of the rollback decision: canary <= baseline x (1 + this)
    promote_tolerance: float  # H0 of the promote decision: canary >= baseline x (1 + this)
    floor: float  # seconds: a canary within this of the baseline is never confidently slower
    rollback_boundaries: tuple[float, ...]  # look k is Failed at z_slower >= [k - 1]
    promote_boundaries: tuple[float, ...]  # look k is Successful at z_within <= -[k - 1]

    def critical(self, look: int) -> tuple[float, float]:
        """(rollback, promote) critical values of ``look`` (1 = the step's first interval)."""
        return self.rollback_boundaries[look - 1], self.promote_boundaries[look - 1]


def design(check: LatencyCheck, spec: AnalysisSpec, alpha: float = ALPHA) -> Design:
    """maxRegression is the slowdown to catch: a canary that much slower is promoted with probability <= alpha,
    one slower by at most half of it rolled back with probability <= alpha (the indifference zone between)."""
    looks = LOOKS_PER_SUCCESSFUL_INTERVAL * spec.successful_intervals
    return Design(
        looks=looks,
        rollback_tolerance=check.max_regression / 2,
        promote_tolerance=check.max_regression,
        floor=check.noise_floor_seconds,
        rollback_boundaries=boundaries(alpha, looks, spec.failure_limit + 1, consecutive=False, shape=BOUNDARY_SHAPE),
        promote_boundaries=boundaries(alpha, looks, spec.successful_intervals, consecutive=True, shape=BOUNDARY_SHAPE),
    )


@dataclass(frozen=True)
class RankResult:
    verdict: RankVerdict
    z_slower: float  # >= rollback_critical: slower than the rollback boundary
    z_within: float  # <= -promote_critical: faster than the promote boundary
    baseline_requests: float
    canary_requests: float
    slower: float  # P(canary request slower than a baseline request), ties half: 0.5 = same distribution


def cumulative_counts(buckets: Buckets) -> list[tuple[float, float]]:
    """Sorted (le, cumulative) pairs made monotone (increase() can leave tiny float noise); +Inf required."""
    points = sorted((float(le), float(count)) for le, count in buckets)
    if not points or not math.isinf(points[-1][0]):
        raise ValueError("buckets: need the le=+Inf bucket (is the query 'sum by (le) (increase(..._bucket))'?)")
    out, running = [], 0.0
    for le, count in points:
        running = max(running, 0.0 if math.isnan(count) else count)
        out.append((le, running))
    return out


def cdf_at(points: list[tuple[float, float]], value: float) -> float:
    """Share of requests at or below ``value`` (``points`` from ``cumulative_counts``): probit-log interpolation
    inside a bucket (exact for a lognormal), linear in the first bucket and where a bucket bound holds 0% or 100%;
    the +Inf bucket's requests lie above every finite value."""
    total = points[-1][1]
    index = bisect_left(points, value, key=lambda point: point[0])  # the bucket holding value: le >= value
    upper, count = points[index]
    lower, below = points[index - 1] if index > 0 else (0.0, 0.0)
    if math.isinf(upper):
        return below / total
    f_lo, f_hi = below / total, count / total
    if value <= 0 or f_hi == f_lo:
        return f_lo if value <= lower else f_hi
    if lower <= 0 or f_lo <= 0 or f_hi >= 1:
        return f_lo + (f_hi - f_lo) * (value - lower) / (upper - lower)
    fraction = math.log(value / lower) / math.log(upper / lower)
    probit = _NORMAL.inv_cdf
    return _NORMAL.cdf(probit(f_lo) + (probit(f_hi) - probit(f_lo)) * fraction)


def moved_baseline(
    points: list[tuple[float, float]], bounds: Sequence[float], tolerance: float, floor: float
) -> list[float]:
    """Cumulative counts, on ``bounds``, of the baseline (``points`` from ``cumulative_counts``) moved through
    g(x) = max(x (1 + tolerance), x + floor): a moved request is <= b exactly when the request is
    <= g^-1(b) = min(b / (1 + tolerance), b - floor)."""
    total = points[-1][1]
    out = []
    for bound in bounds:
        if math.isinf(bound):
            out.append(total)
            continue
        inverse = min(bound / (1 + tolerance), bound - floor)
        out.append(total * cdf_at(points, inverse) if inverse > 0 and total > 0 else 0.0)
    return out


def grouped_mann_whitney(baseline: Sequence[float], canary: Sequence[float]) -> tuple[float, float, float]:
    """(U, its mean, its standard deviation) under H0 for per-category counts in ascending order; U counts the
    (canary, baseline) pairs where the canary is slower, ties (same category) as half. The variance is the
    permutation variance with the tie correction (ranks within a category are mid-ranks)."""
    n_baseline, n_canary = sum(baseline), sum(canary)
    total = n_baseline + n_canary
    u_statistic, below = 0.0, 0.0
    ties = 0.0
    for in_baseline, in_canary in zip(baseline, canary, strict=True):
        u_statistic += in_canary * (below + in_baseline / 2)
        below += in_baseline
        tied = in_baseline + in_canary
        ties += tied**3 - tied
    mean = n_baseline * n_canary / 2
    if total < 2:
        return u_statistic, mean, 0.0
    variance = n_baseline * n_canary / 12 * ((total + 1) - ties / (total * (total - 1)))
    return u_statistic, mean, math.sqrt(max(variance, 0.0))


def rank_z(
    baseline: list[tuple[float, float]], canary: list[tuple[float, float]], tolerance: float, floor: float
) -> tuple[float, float]:
    """(z, U / pairs) of the grouped Mann-Whitney test of the canary against the baseline moved through g; both as
    ``cumulative_counts`` returns them."""
    canary_cells = _cells([count for _, count in canary])
    baseline_cells = _cells(moved_baseline(baseline, [le for le, _ in canary], tolerance, floor))
    u_statistic, mean, deviation = grouped_mann_whitney(baseline_cells, canary_cells)
    pairs = sum(baseline_cells) * sum(canary_cells)
    z = (u_statistic - mean) / deviation if deviation > 0 else 0.0
    return z, u_statistic / pairs if pairs > 0 else math.nan


def rank_test(baseline: Buckets, canary: Buckets, plan: Design, look: int) -> RankResult:
    """Look ``look`` of the sequential test on pooled bucket counts (see the module's docstring)."""
    rollback_critical, promote_critical = plan.critical(look)
    baseline_points, canary_points = cumulative_counts(baseline), cumulative_counts(canary)
    z_slower, _ = rank_z(baseline_points, canary_points, plan.rollback_tolerance, plan.floor)
    z_within, _ = rank_z(baseline_points, canary_points, plan.promote_tolerance, plan.floor)
    _, slower = rank_z(baseline_points, canary_points, 0.0, 0.0)
    verdict: RankVerdict = (
        "Failed" if z_slower >= rollback_critical else "Successful" if z_within <= -promote_critical else "Undecided"
    )
    return RankResult(
        verdict=verdict,
        z_slower=z_slower,
        z_within=z_within,
        baseline_requests=baseline_points[-1][1],
        canary_requests=canary_points[-1][1],
        slower=slower,
    )


def _cells(cumulative: Sequence[float]) -> list[float]:
    return [max(0.0, high - low) for low, high in zip([0.0, *cumulative[:-1]], cumulative, strict=True)]


def assess_rank(
    check: LatencyCheck,
    spec: AnalysisSpec,
    interval: tuple[Buckets, Buckets],
    pooled: tuple[Buckets, Buckets],
    *,
    look: int,
    requests: RequestCounts | None,
    at: str,
    query: str | None = None,
) -> Measurement:
    """The rank test's verdict at ``look`` (1 = the step's first interval) on the ``pooled`` (baseline, canary)
    buckets since the step began; the ``interval``'s quantiles are recorded for people, as the quantile test does."""
    name = latency_metric_name(check)
    baseline_now, canary_now = (_quantile(check.quantile, buckets) for buckets in interval)
    plan = design(check, spec)
    why = too_few_requests(requests, spec.min_requests) or _empty(pooled)
    if why is None and look > plan.looks:
        why = f"the rank test made its {plan.looks} looks (2 x successfulIntervals) without showing the canary safe"
    if why:
        return Measurement(
            metric=name, phase="Inconclusive", at=at, baseline=baseline_now, canary=canary_now, query=query,
            message=why,
        )  # fmt: skip
    result = rank_test(pooled[0], pooled[1], plan, look)
    rollback_critical, promote_critical = plan.critical(look)
    outcome = {
        "Failed": f"slower than baseline x{1 + plan.rollback_tolerance:g}",
        "Successful": f"faster than baseline x{1 + plan.promote_tolerance:g}",
        "Undecided": "undecided, more data needed",
    }[result.verdict]
    message = (
        f"rank test look {look}/{plan.looks}, {result.canary_requests:,.0f} canary vs {result.baseline_requests:,.0f} "
        f"baseline requests: P(canary slower) {result.slower:.3f}; z {result.z_slower:+.2f} vs "
        f"+{rollback_critical:.2f} at x{1 + plan.rollback_tolerance:g}, z {result.z_within:+.2f} vs "
        f"-{promote_critical:.2f} at x{1 + plan.promote_tolerance:g}: {outcome}"
    )
    return Measurement(
        metric=name, phase=result.verdict, at=at, baseline=baseline_now, canary=canary_now, query=query,
        message=message,
    )  # fmt: skip


def _quantile(q: float, buckets: Buckets) -> float | None:
    return quantile_from_buckets(q, buckets) if buckets else None


def _empty(pooled: tuple[Buckets, Buckets]) -> str | None:
    empty = [role for role, buckets in zip(("baseline", "canary"), pooled, strict=True) if _total(buckets) <= 0]
    return f"no requests in the histogram of {' and '.join(empty)}" if empty else None


def _total(buckets: Buckets) -> float:
    return cumulative_counts(buckets)[-1][1] if buckets else 0.0


def assess_latency_check(
    check: LatencyCheck,
    spec: AnalysisSpec,
    interval: tuple[Buckets, Buckets],
    pooled: tuple[Buckets, Buckets] | None,
    *,
    look: int,
    requests: RequestCounts | None,
    at: str,
    query: str | None = None,
) -> Measurement:
    """One latency check as the operator judges it (the Prometheus adapter and benchmarks/bench_analysis.py both
    call this): the rank test on ``pooled`` buckets, or the quantile test on the ``interval``'s."""
    if check.test == "rank" and pooled is not None:
        return assess_rank(check, spec, interval, pooled, look=look, requests=requests, at=at, query=query)
    baseline, canary = (_quantile(check.quantile, buckets) for buckets in interval)
    gate = RequestGate(requests, spec.min_requests)
    return assess_latency(check, Reading(baseline, canary, query), gate=gate, at=at)


def look_number(spec: AnalysisSpec, step_seconds: float) -> int:
    """Which look of the step a measurement over ``step_seconds`` (since the step's first interval began) is."""
    return max(1, round(step_seconds / spec.interval_seconds))


def step_window_seconds(spec: AnalysisSpec, status: AnalysisStatus, now: datetime) -> float:
    """The rank test's window at ``now``: since the step's first interval began (one look past the last is enough
    to read as Inconclusive)."""
    return query_window_seconds(
        spec, status, now, intervals=LOOKS_PER_SUCCESSFUL_INTERVAL * spec.successful_intervals + 1
    )
