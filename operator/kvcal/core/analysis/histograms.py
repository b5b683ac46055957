"""Latency histograms as Prometheus returns their buckets, read for the rank test (kvcal.core.analysis.ranktest):
cumulative counts, the CDF between bucket bounds, a baseline moved by a tolerance, the grouped Mann-Whitney statistic
and its effect, and several pods' histograms pooled into one."""

import math
from bisect import bisect_left
from collections.abc import Sequence
from statistics import NormalDist
from typing import Literal

Buckets = Sequence[tuple[float, float]]  # (upper bound le, cumulative count), le=+Inf included
# How to read inside the first bucket when no neighbour gives its shape (nearly every request in it): linearly, or
# "upper": every one of its requests at or below the value, the reading that moves a baseline least (a promotion
# must not rest on a shape no histogram shows).
FirstBucket = Literal["linear", "upper"]
_NORMAL = NormalDist()


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


def cdf_at(points: list[tuple[float, float]], value: float, first_bucket: FirstBucket = "linear") -> float:
    """Share of requests at or below ``value`` (``points`` from ``cumulative_counts``): probit-log interpolation
    inside a bucket (exact for a lognormal); in the first bucket, which has no lower bound in log-latency, the
    next bucket's probit-log line extended down (exact for a lognormal too), and where it has no such neighbour as
    ``first_bucket`` says; linear where a bucket bound holds 0% or 100%; the +Inf bucket's requests lie above every
    finite value."""
    total = points[-1][1]
    index = bisect_left(points, value, key=lambda point: point[0])  # the bucket holding value: le >= value
    upper, count = points[index]
    lower, below = points[index - 1] if index > 0 else (0.0, 0.0)
    if math.isinf(upper):
        return below / total
    f_lo, f_hi = below / total, count / total
    if value <= 0 or f_hi == f_lo:
        return f_lo if value <= lower else f_hi
    if index == 0:
        share = _first_bucket_share(points, value, first_bucket)
        if share is not None:
            return share
    if lower <= 0 or f_lo <= 0 or f_hi >= 1:
        return f_lo + (f_hi - f_lo) * (value - lower) / (upper - lower)
    fraction = math.log(value / lower) / math.log(upper / lower)
    probit = _NORMAL.inv_cdf
    return _NORMAL.cdf(probit(f_lo) + (probit(f_hi) - probit(f_lo)) * fraction)


def _first_bucket_share(points: list[tuple[float, float]], value: float, first_bucket: FirstBucket) -> float | None:
    """The share at ``value`` inside the first (finite) bucket: the next bucket's probit-log line extended down, or
    as ``first_bucket`` says where no next bucket gives it (None: linear). vLLM's first ITL bucket (<= 10 ms) holds
    a fast GPU's typical token: read linearly, a 10% move at 12 ms read as about a quarter of what a lognormal moves,
    and the rank test could barely see a slower canary or promote a healthy one."""
    total = points[-1][1]
    (upper, count), (next_bound, next_count) = points[0], points[1]
    share, next_share = count / total, next_count / total
    if not math.isinf(next_bound) and 0 < share < next_share < 1:
        probit = _NORMAL.inv_cdf
        slope = (probit(next_share) - probit(share)) / math.log(next_bound / upper)
        return _NORMAL.cdf(probit(share) + slope * math.log(value / upper))
    return share if first_bucket == "upper" else None


def moved_baseline(
    points: list[tuple[float, float]],
    bounds: Sequence[float],
    tolerance: float,
    floor: float,
    first_bucket: FirstBucket = "linear",
) -> list[float]:
    """Cumulative counts, on ``bounds``, of the baseline (``points`` from ``cumulative_counts``) moved through
    g(x) = max(x (1 + tolerance), x + floor): a moved request is <= b exactly when the request is
    <= g^-1(b) = min(b / (1 + tolerance), b - floor) (read by ``cdf_at`` with ``first_bucket``)."""
    total = points[-1][1]
    out = []
    for bound in bounds:
        if math.isinf(bound):
            out.append(total)
            continue
        inverse = min(bound / (1 + tolerance), bound - floor)
        out.append(total * cdf_at(points, inverse, first_bucket) if inverse > 0 and total > 0 else 0.0)
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


def rank_effect(
    baseline: list[tuple[float, float]],
    canary: list[tuple[float, float]],
    tolerance: float,
    floor: float,
    first_bucket: FirstBucket = "linear",
) -> tuple[float, float]:
    """(effect, its request-level standard deviation) of the grouped Mann-Whitney test of the canary against the
    baseline moved through g, both as ``cumulative_counts`` returns them: effect = U / pairs - 1/2, the probability
    that a canary request is slower than a (moved) baseline one beyond even odds; 0 when either side is empty."""
    canary_cells = _cells([count for _, count in canary])
    bounds = [le for le, _ in canary]
    unmoved = tolerance == 0 and floor == 0 and [le for le, _ in baseline] == bounds
    # Unmoved on the same bounds the baseline's own counts are what moved_baseline reads at each bound.
    moved = (
        [count for _, count in baseline]
        if unmoved
        else moved_baseline(baseline, bounds, tolerance, floor, first_bucket)
    )
    baseline_cells = _cells(moved)
    u_statistic, _, deviation = grouped_mann_whitney(baseline_cells, canary_cells)
    pairs = sum(baseline_cells) * sum(canary_cells)
    if pairs <= 0:
        return 0.0, 0.0
    return u_statistic / pairs - 0.5, deviation / pairs


def on_bounds(pods: Sequence[list[tuple[float, float]]]) -> tuple[list[float], list[list[float]]]:
    """The union of several pods' bounds (each pod as ``cumulative_counts``) and each pod's cumulative counts read on
    it (a bound one pod lacks reads that pod's interpolated CDF)."""
    bounds = sorted({le for pod in pods for le, _ in pod})
    counts = []
    for pod in pods:
        own, total = dict(pod), pod[-1][1]
        counts.append(
            [own[bound] if bound in own else total * cdf_at(pod, bound) if total > 0 else 0.0 for bound in bounds]
        )
    return bounds, counts


def pool(pods: Sequence[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """One histogram of several pods' (as ``cumulative_counts``): their counts summed on the union of their bounds."""
    if len(pods) == 1:
        return pods[0]
    bounds, counts = on_bounds(pods)
    return list(zip(bounds, map(sum, zip(*counts, strict=True)), strict=True))


def _cells(cumulative: Sequence[float]) -> list[float]:
    return [max(0.0, high - low) for low, high in zip([0.0, *cumulative[:-1]], cumulative, strict=True)]
