"""A sequential Mann-Whitney rank test on histogram bucket counts: is the canary slower than the baseline beyond
a tolerance? (docs/concepts.md, "The latency test", has the design and its reasons.)

- Data: vLLM's latency histograms as Prometheus' ``increase(..._bucket[window])`` returns them per pod, pooled from
  the start of the analysis step. Requests in one bucket are tied; the test is the grouped (ordinal) Mann-Whitney U
  with mid-ranks and the tie-corrected variance.
- Tolerance: H0 "canary <= g(baseline)" with g(x) = max(x * (1 + tolerance), x + floor) is tested by moving the
  baseline's bucket bounds through g and reading the moved baseline on the canary's bounds (interpolated like
  ``quantile_from_buckets``: probit-log inside a bucket, exact for a lognormal).
- Pods: each pod's own noise (its node, its queue) is not the requests'. The spread of each role's pods beyond their
  requests' noise widens the verdict's variance, read as Student's t (``pod_spread``, ``spread_z``).
- Two one-sided decisions, each tested twice: Failed when the canary is confidently slower than baseline x (1 +
  rollbackAbove) and than one indifference zone below that; Successful when it is confidently within baseline x
  (1 + maxRegression) and one zone above that; Undecided (more data) otherwise, and past the last look the run's
  own outcome (spec.analysis.onUndecided).
- Error over the looks of a step (at most 2 x successfulIntervals): the pooled statistic has nearly independent
  increments, so the boundaries are group-sequential ones designed for the counters (kvcal.core.sequential): a
  rollback needs failureLimit + 1 Failed looks, a promotion successfulIntervals Successful ones in a row, and each
  test errs with its alpha over all the looks. The boundaries rise with the look (Wang-Tsiatis shape
  BOUNDARY_SHAPE), spending more of alpha where an early rollback saves the most.
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

# One-sided errors over all the looks of one analysis step. Each decision passes two tests: at its tolerance
# (rollbackAbove, maxRegression) it errs with BOUNDARY_ALPHA; one indifference zone (maxRegression - rollbackAbove)
# beyond it, with BEYOND_ALPHA: a rollback for a canary that much faster than rollbackAbove (by default: no slower
# than the baseline), a promotion for one that much slower than maxRegression (by default: +15%). Where requests
# dominate the noise the boundary tests bind; where the pods' own noise does (the zone is within one pod's spread),
# the tests beyond keep healthy canaries from rollbacks and slow ones from promotions.
BOUNDARY_ALPHA = 0.10
BEYOND_ALPHA = 0.005
# Looks per analysis step, as a multiple of successfulIntervals (the consecutive confident looks a promotion needs).
LOOKS_PER_SUCCESSFUL_INTERVAL = 2
# The confidence of the pods' spread's upper bound that sets the verdict's degrees of freedom (spread_z).
SPREAD_BOUND = 0.90
# Both boundaries grow as (look / looks)^BOUNDARY_SHAPE (Wang and Tsiatis' family; 0 would be Pocock's constant
# boundary): more of alpha is spent on the first looks, where a slower canary is caught before it serves for long.
BOUNDARY_SHAPE = 0.25

Buckets = Sequence[tuple[float, float]]  # (upper bound le, cumulative count), le=+Inf included
PodBuckets = Sequence[Buckets]  # one role's buckets, one histogram per pod (``sum by (pod, le)``)
RankVerdict = Literal["Failed", "Successful", "Undecided"]
_NORMAL = NormalDist()
# One pod per role: no pod's own spread to measure; the verdict counts requests alone and says so.
NO_POD_REFERENCE = "1 baseline pod and 1 canary pod: pod-to-pod noise not measured (run 2+ baseline pods)"


@dataclass(frozen=True)
class Design:
    """The sequential test of one latency check: boundaries (ratios - 1) and per-look critical values."""

    looks: int
    rollback_tolerance: float  # H0 of the rollback decision: canary <= baseline x (1 + this)
    promote_tolerance: float  # H0 of the promote decision: canary >= baseline x (1 + this)
    floor: float  # seconds: a canary within this of the baseline is never confidently slower
    rollback_boundaries: tuple[float, ...]  # look k is Failed at z_slower >= [k - 1] (and z_healthy >= ...)
    healthy_boundaries: tuple[float, ...]  # ... z_healthy >= [k - 1], against healthy_tolerance
    promote_boundaries: tuple[float, ...]  # look k is Successful at z_within <= -[k - 1] (and z_regressed <= ...)
    regressed_boundaries: tuple[float, ...]  # ... z_regressed <= -[k - 1], against regressed_tolerance

    @property
    def zone(self) -> float:
        """The indifference zone's width: between the tolerances the test needs more data."""
        return self.promote_tolerance - self.rollback_tolerance

    @property
    def healthy_tolerance(self) -> float:
        """A canary this much slower (>= 0) is rolled back with probability <= BEYOND_ALPHA."""
        return max(0.0, self.rollback_tolerance - self.zone)

    @property
    def regressed_tolerance(self) -> float:
        """A canary this much slower is promoted with probability <= BEYOND_ALPHA."""
        return self.promote_tolerance + self.zone

    def critical(self, look: int) -> tuple[float, float, float, float]:
        """(rollback, healthy, promote, regressed) critical values of ``look`` (1 = the step's first interval)."""
        index = look - 1
        return (
            self.rollback_boundaries[index], self.healthy_boundaries[index],
            self.promote_boundaries[index], self.regressed_boundaries[index],
        )  # fmt: skip


def design(check: LatencyCheck, spec: AnalysisSpec) -> Design:
    """maxRegression is the slowdown never to promote: a canary that much slower is promoted with probability
    <= BOUNDARY_ALPHA, one a zone slower with <= BEYOND_ALPHA; rollbackAbove the slowdown that rolls back: a canary
    slower by at most it is rolled back with probability <= BOUNDARY_ALPHA, one a zone faster with <= BEYOND_ALPHA
    (the indifference zone between the two tolerances: more data)."""
    looks = LOOKS_PER_SUCCESSFUL_INTERVAL * spec.successful_intervals
    failed, successful = spec.failure_limit + 1, spec.successful_intervals
    return Design(
        looks=looks,
        rollback_tolerance=check.rollback_tolerance,
        promote_tolerance=check.max_regression,
        floor=check.noise_floor_seconds,
        rollback_boundaries=boundaries(BOUNDARY_ALPHA, looks, failed, consecutive=False, shape=BOUNDARY_SHAPE),
        healthy_boundaries=boundaries(BEYOND_ALPHA, looks, failed, consecutive=False, shape=BOUNDARY_SHAPE),
        promote_boundaries=boundaries(BOUNDARY_ALPHA, looks, successful, consecutive=True, shape=BOUNDARY_SHAPE),
        regressed_boundaries=boundaries(BEYOND_ALPHA, looks, successful, consecutive=True, shape=BOUNDARY_SHAPE),
    )


@dataclass(frozen=True)
class RankResult:
    verdict: RankVerdict
    z_slower: float  # >= rollback_critical: slower than the rollback boundary
    z_within: float  # <= -promote_critical: faster than the promote boundary
    z_healthy: float  # >= healthy_critical (with z_slower): slower than the healthy tolerance
    z_regressed: float  # <= -regressed_critical (with z_within): faster than the regressed tolerance
    baseline_requests: float
    canary_requests: float
    slower: float  # P(canary request slower than a baseline request), ties half: 0.5 = same distribution
    pods: tuple[int, int]  # (baseline, canary) pods with a histogram
    pod_deviation: float  # the pods' own spread beyond their requests' (standard deviation on the effect scale)
    degrees: float  # the verdict's degrees of freedom (inf: nothing estimated, e.g. one pod per role)


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


def rank_effect(
    baseline: list[tuple[float, float]], canary: list[tuple[float, float]], tolerance: float, floor: float
) -> tuple[float, float]:
    """(effect, its request-level standard deviation) of the grouped Mann-Whitney test of the canary against the
    baseline moved through g, both as ``cumulative_counts`` returns them: effect = U / pairs - 1/2, the probability
    that a canary request is slower than a (moved) baseline one beyond even odds; 0 when either side is empty."""
    canary_cells = _cells([count for _, count in canary])
    baseline_cells = _cells(moved_baseline(baseline, [le for le, _ in canary], tolerance, floor))
    u_statistic, _, deviation = grouped_mann_whitney(baseline_cells, canary_cells)
    pairs = sum(baseline_cells) * sum(canary_cells)
    if pairs <= 0:
        return 0.0, 0.0
    return u_statistic / pairs - 0.5, deviation / pairs


@dataclass(frozen=True)
class PodSpread:
    """How much one pod's pooled histogram differs from its role's beyond its requests' own noise, on the effect
    scale (the pods of a role are replicates of one another under the same traffic: their spread holds the node
    offsets and each pod's own load that a canary pod also has, and that request counting alone cannot see)."""

    squares: float  # sum over roles of the squared deviations of pod effects from their role's mean
    request_variance: float  # sum over roles of (pods - 1) x the mean request-level variance of those deviations
    degrees: int  # sum over roles of (pods - 1): the estimate's degrees of freedom

    @property
    def excess(self) -> float:
        """The between-pod variance beyond the requests' (>= 0): what a canary pod adds to the verdict's variance."""
        return max(0.0, (self.squares - self.request_variance) / self.degrees) if self.degrees else 0.0


def pod_spread(roles: Sequence[Sequence[list[tuple[float, float]]]]) -> PodSpread:
    """The between-pod spread of each role's pods (each as ``cumulative_counts``), pooled over roles: each pod is
    compared with the rest of its role (a leave-one-out rank effect, scaled by 1 - its share of the role's requests
    to read as its deviation from the role's pool, and its variance with it)."""
    squares = request_variance = 0.0
    degrees = 0
    for pods in roles:
        pods = [pod for pod in pods if pod[-1][1] > 0]
        if len(pods) < 2:
            continue
        total = sum(pod[-1][1] for pod in pods)
        deviations, variances = [], []
        for index, pod in enumerate(pods):
            rest = pool([other for position, other in enumerate(pods) if position != index])
            effect, deviation = rank_effect(rest, pod, 0.0, 0.0)
            outside = 1 - pod[-1][1] / total
            deviations.append(effect * outside)
            variances.append((deviation * outside) ** 2)
        mean = sum(deviations) / len(deviations)
        squares += sum((each - mean) ** 2 for each in deviations)
        request_variance += (len(pods) - 1) * sum(variances) / len(variances)
        degrees += len(pods) - 1
    return PodSpread(squares=squares, request_variance=request_variance, degrees=degrees)


def pool(pods: Sequence[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """One histogram of several pods' (as ``cumulative_counts``): counts summed on the union of their bounds (a
    bound one pod lacks reads that pod's interpolated CDF)."""
    if len(pods) == 1:
        return pods[0]
    bounds = sorted({le for pod in pods for le, _ in pod})
    totals = [0.0] * len(bounds)
    for pod in pods:
        own = dict(pod)
        pod_total = pod[-1][1]
        for index, bound in enumerate(bounds):
            totals[index] += own[bound] if bound in own else pod_total * cdf_at(pod, bound) if pod_total > 0 else 0.0
    return list(zip(bounds, totals, strict=True))


def pod_weights(pods: Sequence[list[tuple[float, float]]]) -> float:
    """Sum of the squared request shares of a role's pods: how much of one pod's own spread reaches the role's
    pooled histogram (1 for one pod, 1/m for m pods with equal traffic)."""
    totals = [pod[-1][1] for pod in pods]
    whole = sum(totals)
    return sum((each / whole) ** 2 for each in totals) if whole > 0 else 1.0


def normal_equivalent(t_statistic: float, degrees: float) -> float:
    """The standard normal quantile with the tail probability of Student's t at ``degrees`` (Wallace 1959: within
    0.03 of the exact value from 2 degrees on, and on the low side: a verdict reads slightly less certain)."""
    if math.isinf(degrees) or t_statistic == 0:
        return t_statistic
    degrees = max(degrees, 1.0)
    magnitude = math.sqrt(degrees * math.log1p(t_statistic * t_statistic / degrees))
    return math.copysign((8 * degrees + 1) / (8 * degrees + 3) * magnitude, t_statistic)


def spread_z(effect: float, request_deviation: float, spread: PodSpread, weights: float) -> tuple[float, float]:
    """(z, degrees of freedom) of an effect whose variance is its requests' plus ``weights`` x the pods' excess
    variance, read as Student's t and put on the normal scale. The degrees are Satterthwaite's, computed with the
    pods' mean square at its upper SPREAD_BOUND confidence bound and never below the pods' own degrees: computed
    from the estimate itself they grow exactly when the spread reads low by chance, which let 2% of healthy noisy
    canaries roll back in benchmarks/bench_analysis.py."""
    variance = request_deviation**2 + weights * spread.excess
    if variance <= 0:
        return 0.0, math.inf
    if not spread.degrees:
        return effect / math.sqrt(variance), math.inf
    pods = spread.degrees
    upper = spread.squares / chi_square_quantile(1 - SPREAD_BOUND, pods)  # the mean square's upper bound
    upper_variance = request_deviation**2 + weights * max(0.0, upper - spread.request_variance / pods)
    degrees = max(float(pods), upper_variance**2 / ((weights * upper) ** 2 / pods)) if upper > 0 else math.inf
    return normal_equivalent(effect / math.sqrt(variance), degrees), degrees


def chi_square_quantile(probability: float, degrees: int) -> float:
    """The chi-square distribution's quantile (Wilson and Hilferty 1931: within 2% from 3 degrees on, low at
    the lower tail: the upper bound it gives reads a little high)."""
    shrink = 2 / (9 * degrees)
    return degrees * max(1e-9, 1 - shrink + _NORMAL.inv_cdf(probability) * math.sqrt(shrink)) ** 3


def rank_test(baseline: PodBuckets, canary: PodBuckets, plan: Design, look: int) -> RankResult:
    """Look ``look`` of the sequential test on each pod's buckets pooled since the step began (see the module's
    docstring): the rank effect of the roles' pools, its variance widened by the pods' own spread."""
    rollback_critical, healthy_critical, promote_critical, regressed_critical = plan.critical(look)
    baseline_pods = [cumulative_counts(buckets) for buckets in baseline]
    canary_pods = [cumulative_counts(buckets) for buckets in canary]
    baseline_points, canary_points = pool(baseline_pods), pool(canary_pods)
    spread = pod_spread([baseline_pods, canary_pods])
    weights = pod_weights(baseline_pods) + pod_weights(canary_pods)
    slower_effect = rank_effect(baseline_points, canary_points, plan.rollback_tolerance, plan.floor)
    within_effect = rank_effect(baseline_points, canary_points, plan.promote_tolerance, plan.floor)
    healthy_effect = rank_effect(baseline_points, canary_points, plan.healthy_tolerance, plan.floor)
    regressed_effect = rank_effect(baseline_points, canary_points, plan.regressed_tolerance, plan.floor)
    z_slower, degrees = spread_z(*slower_effect, spread, weights)
    z_within, _ = spread_z(*within_effect, spread, weights)
    z_healthy, _ = spread_z(*healthy_effect, spread, weights)
    z_regressed, _ = spread_z(*regressed_effect, spread, weights)
    slower, _ = rank_effect(baseline_points, canary_points, 0.0, 0.0)
    verdict: RankVerdict = (
        "Failed" if z_slower >= rollback_critical and z_healthy >= healthy_critical
        else "Successful" if z_within <= -promote_critical and z_regressed <= -regressed_critical
        else "Undecided"
    )  # fmt: skip
    return RankResult(
        verdict=verdict,
        z_slower=z_slower,
        z_within=z_within,
        z_healthy=z_healthy,
        z_regressed=z_regressed,
        baseline_requests=baseline_points[-1][1],
        canary_requests=canary_points[-1][1],
        slower=slower + 0.5,
        pods=(len(baseline_pods), len(canary_pods)),
        pod_deviation=math.sqrt(spread.excess),
        degrees=degrees,
    )


def _cells(cumulative: Sequence[float]) -> list[float]:
    return [max(0.0, high - low) for low, high in zip([0.0, *cumulative[:-1]], cumulative, strict=True)]


def assess_rank(
    check: LatencyCheck,
    spec: AnalysisSpec,
    interval: tuple[Buckets, Buckets],
    pooled: tuple[PodBuckets, PodBuckets],
    *,
    look: int,
    requests: RequestCounts | None,
    at: str,
    query: str | None = None,
) -> Measurement:
    """The rank test's verdict at ``look`` (1 = the step's first interval) on the ``pooled`` (baseline, canary)
    buckets of each pod since the step began; the ``interval``'s quantiles are recorded for people, as the quantile
    test does. Past its last look the measurement is Undecided and ``exhausted``: the run's own outcome."""
    name = latency_metric_name(check)
    baseline_now, canary_now = (_quantile(check.quantile, buckets) for buckets in interval)
    plan = design(check, spec)
    why = too_few_requests(requests, spec.min_requests) or _empty(pooled)
    if why:
        return Measurement(
            metric=name, phase="Inconclusive", at=at, baseline=baseline_now, canary=canary_now, query=query,
            message=why,
        )  # fmt: skip
    if look > plan.looks:
        return Measurement(
            metric=name, phase="Undecided", at=at, baseline=baseline_now, canary=canary_now, query=query,
            exhausted=True,
            message=(
                f"undecided: {plan.looks} looks (2 x successfulIntervals) showed the canary neither slower than "
                f"baseline x{1 + plan.rollback_tolerance:g} nor within x{1 + plan.promote_tolerance:g}"
            ),
        )  # fmt: skip
    result = rank_test(pooled[0], pooled[1], plan, look)
    rollback_critical, healthy_critical, promote_critical, regressed_critical = plan.critical(look)
    outcome = {
        "Failed": f"slower than baseline x{1 + plan.rollback_tolerance:g}",
        "Successful": f"within baseline x{1 + plan.promote_tolerance:g}",
        "Undecided": "undecided, more data needed",
    }[result.verdict]
    message = (
        f"rank test look {look}/{plan.looks}, {result.canary_requests:,.0f} canary vs {result.baseline_requests:,.0f} "
        f"baseline requests, {_pods(result)}: P(canary slower) {result.slower:.3f}; z {result.z_slower:+.2f} vs "
        f"+{rollback_critical:.2f} at x{1 + plan.rollback_tolerance:g} and {result.z_healthy:+.2f} vs "
        f"+{healthy_critical:.2f} at x{1 + plan.healthy_tolerance:g}; z {result.z_within:+.2f} vs "
        f"-{promote_critical:.2f} at x{1 + plan.promote_tolerance:g} and {result.z_regressed:+.2f} vs "
        f"-{regressed_critical:.2f} at x{1 + plan.regressed_tolerance:g}: {outcome}"
    )
    return Measurement(
        metric=name, phase=result.verdict, at=at, baseline=baseline_now, canary=canary_now, query=query,
        message=message,
    )  # fmt: skip


def _pods(result: RankResult) -> str:
    baseline, canary = result.pods
    if math.isinf(result.degrees) and baseline < 2 and canary < 2:
        return NO_POD_REFERENCE
    return f"pods {baseline}+{canary}, pod spread {result.pod_deviation:.3f} (df {min(result.degrees, 999):.1f})"


def _quantile(q: float, buckets: Buckets) -> float | None:
    return quantile_from_buckets(q, buckets) if buckets else None


def _empty(pooled: tuple[PodBuckets, PodBuckets]) -> str | None:
    empty = [role for role, pods in zip(("baseline", "canary"), pooled, strict=True) if _total(pods) <= 0]
    return f"no requests in the histogram of {' and '.join(empty)}" if empty else None


def _total(pods: PodBuckets) -> float:
    return sum(cumulative_counts(buckets)[-1][1] for buckets in pods if buckets)


def assess_latency_check(
    check: LatencyCheck,
    spec: AnalysisSpec,
    interval: tuple[Buckets, Buckets],
    pooled: tuple[PodBuckets, PodBuckets] | None,
    *,
    look: int,
    requests: RequestCounts | None,
    at: str,
    query: str | None = None,
) -> Measurement:
    """One latency check as the operator judges it (the Prometheus adapter and benchmarks/bench_analysis.py both
    call this): the rank test on each pod's ``pooled`` buckets, or the quantile test on the ``interval``'s."""
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
