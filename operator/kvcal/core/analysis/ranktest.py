"""A sequential Mann-Whitney rank test on histogram bucket counts: is the canary slower than the baseline beyond
a tolerance? (docs/concepts.md, "The latency test", has the design and its reasons.)

- Data: vLLM's latency histograms as Prometheus' ``increase(..._bucket[window])`` returns them per pod, pooled from
  the start of the analysis step. Requests in one bucket are tied; the test is the grouped (ordinal) Mann-Whitney U
  with mid-ranks and the tie-corrected variance.
- Tolerance: H0 "canary <= g(baseline)" with g(x) = max(x * (1 + tolerance), x + floor) is tested by moving the
  baseline's bucket bounds through g and reading the moved baseline on the canary's bounds (interpolated like
  ``quantile_from_buckets``: probit-log inside a bucket, exact for a lognormal).
- Pods: each pod's own noise (its node, its queue) is not the requests'. The spread of each role's pods beyond their
  requests' noise widens the verdict's variance, read as Student's t (``pod_spread``, ``spread_z``). Where no role
  has two pods, the step's full intervals are the replicates (``interval_spread``): they show a pod's own load, not
  its node, and before FEWEST_INTERVALS of them nothing is decided.
- Two one-sided decisions, each tested twice: Failed when the canary is confidently slower than baseline x (1 +
  rollbackAbove) and than one indifference zone below that; Successful when it is confidently within baseline x
  (1 + maxRegression) and one zone above that; Undecided (more data) otherwise, and past the last look the run's
  own outcome (spec.analysis.onUndecided). The floor widens every tolerance but the one below rollbackAbove. A
  first bucket whose inside no histogram shows (nearly every request in it) gives a promotion no evidence.
- Error over the looks of a step (at most 2 x successfulIntervals): the pooled statistic has nearly independent
  increments, so the boundaries are group-sequential ones designed for the counters (kvcal.core.analysis.sequential): a
  rollback needs failureLimit + 1 Failed looks, a promotion successfulIntervals Successful ones in a row, and each
  test errs with its alpha over all the looks. The boundaries rise with the look (Wang-Tsiatis shape
  BOUNDARY_SHAPE), spending more of alpha where an early rollback saves the most.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kvcal.core.analysis.fleetnoise import FleetNoise, canary_noisier, canary_z, learned_z
from kvcal.core.analysis.histograms import Buckets, cumulative_counts, pool, rank_effect
from kvcal.core.analysis.podspread import NO_SPREAD, interval_spread, pod_spread, pod_weights, spread_z
from kvcal.core.analysis.schedule import LOOKS_PER_SUCCESSFUL_INTERVAL
from kvcal.core.analysis.sequential import boundaries
from kvcal.core.analysis.verdict import (
    Reading,
    RequestCounts,
    RequestGate,
    assess_latency,
    latency_metric_name,
    quantile_from_buckets,
    too_few_requests,
)
from kvcal.models.spec import AnalysisSpec, LatencyCheck
from kvcal.models.status import Measurement

# One-sided errors over all the looks of one analysis step. Each decision passes two tests: at its tolerance
# (rollbackAbove, maxRegression) it errs with BOUNDARY_ALPHA; one indifference zone (maxRegression - rollbackAbove)
# beyond it, with BEYOND_ALPHA: a rollback for a canary that much faster than rollbackAbove (by default: no slower
# than the baseline), a promotion for one that much slower than maxRegression (by default: +15%). Where requests
# dominate the noise the boundary tests bind; where the pods' own noise does (the zone is within one pod's spread),
# the tests beyond keep healthy canaries from rollbacks and slow ones from promotions.
# noiseFloorSeconds keeps its promise (a canary within it of the baseline is never confidently slower, and can be
# promoted) in every test but the one below rollbackAbove: that test only guards healthy canaries from rollbacks,
# which a floor cannot make safer, and a floor there hid regressions (5 ms on a 0.2 s TTFT made "no slower" read as
# about +2.5%: benchmarks/bench_analysis.py caught 64% of 15% regressions within 3 intervals instead of 82%).
BOUNDARY_ALPHA = 0.10
BEYOND_ALPHA = 0.005
# Both boundaries grow as (look / looks)^BOUNDARY_SHAPE (Wang and Tsiatis' family; 0 would be Pocock's constant
# boundary): more of alpha is spent on the first looks, where a slower canary is caught before it serves for long.
BOUNDARY_SHAPE = 0.25

PodBuckets = Sequence[Buckets]  # one role's buckets, one histogram per pod (``sum by (pod, le)``)
IntervalBuckets = tuple[Sequence[Buckets], Sequence[Buckets]]  # (baseline, canary): each interval of the step
RankVerdict = Literal["Failed", "Successful", "Undecided"]
# What the verdict's variance learns the pods' own noise from: the baseline's history (kvcal.core.analysis.fleetnoise);
# the nodes' from that history and the canary's own load from the step's intervals (a canary noisier than the history
# allows); other pods of a role; the step's intervals (no role with two pods); or nothing (no intervals given:
# requests alone; the operator always gives them).
Reference = Literal["learned", "canary", "pods", "intervals", "requests"]
# No role with two pods that answered: the intervals of the step are the replicates, and the messages say what that
# cannot see (a pod's node stays with it for the whole step).
NO_POD_REFERENCE = "1 baseline pod and 1 canary pod: node offsets not measured (run 2+ baseline pods)"
# Before the step's intervals can test the assumption that the canary pod is as quiet as a baseline pod (its first two
# looks), a rollback counts this many times the learned own-load variance for the canary pods: most rollbacks of a
# healthy canary noisier than its baseline came at the second look, and with it the benchmark's noisier-canary rows
# roll back no more healthy canaries than the step's own estimate did; regressions are caught as often within 10
# intervals, later within 3.
EARLY_CANARY_ALLOWANCE = 2.0
# Two intervals are the fewest that show how the canary's effect varies: before them no decision.
FEWEST_INTERVALS = 2


@dataclass(frozen=True)
class Design:
    """The sequential test of one latency check: boundaries (ratios - 1) and per-look critical values."""

    looks: int
    rollback_tolerance: float  # H0 of the rollback decision: canary <= baseline x (1 + this)
    promote_tolerance: float  # H0 of the promote decision: canary >= baseline x (1 + this)
    floor: float  # seconds: a canary within this is never confidently slower (the healthy test takes no floor)
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
    pod_degrees: int  # the pods' spread's degrees of freedom: 0 when no role has two pods with requests
    pod_deviation: float  # the pods' own spread beyond their requests' (standard deviation on the effect scale)
    degrees: float  # the verdict's degrees of freedom (inf: nothing estimated)
    reference: Reference = "pods"
    intervals: int = 0  # the step's intervals with requests on both roles (reference "intervals")
    noise: FleetNoise | None = None  # the learned noise used (reference "learned")
    unlearned: str | None = None  # why the learned noise given was not used (the canary is noisier than it allows)


def rank_test(
    baseline: PodBuckets,
    canary: PodBuckets,
    plan: Design,
    look: int,
    intervals: IntervalBuckets | None = None,
    noise: FleetNoise | None = None,
) -> RankResult:
    """Look ``look`` of the sequential test on each pod's buckets pooled since the step began (see the module's
    docstring): the rank effect of the roles' pools, its variance widened by the pods' own noise as the baseline's
    history taught it (``noise``, unless the step's ``intervals`` show the canary noisier), or else by the pods' own
    spread, or where no role has two pods, by the spread of the step's ``intervals``."""
    rollback_critical, healthy_critical, promote_critical, regressed_critical = plan.critical(look)
    baseline_pods = [cumulative_counts(buckets) for buckets in baseline]
    canary_pods = [cumulative_counts(buckets) for buckets in canary]
    baseline_points, canary_points = pool(baseline_pods), pool(canary_pods)
    spread = pod_spread([baseline_pods, canary_pods])
    pod_share = pod_weights(baseline_pods) + pod_weights(canary_pods)
    weights = pod_share
    reference: Reference = "pods" if spread.degrees else "requests"
    # The step's intervals, read once: the replicates where no role has two pods, and the learned noise's guard.
    own, interval_weights, replicates = NO_SPREAD, 1.0, 0
    if intervals is not None and (reference == "requests" or noise is not None):
        own, interval_weights, replicates = interval_spread(
            *([cumulative_counts(each) for each in role] for role in intervals)
        )
    if reference == "requests" and intervals is not None:
        reference, spread, weights = "intervals", own, interval_weights
    unlearned = None
    if noise is not None:
        weights = pod_share
        unlearned = canary_noisier(noise, own, pod_weights(baseline_pods))
        reference = "learned" if unlearned is None else "canary"
    slower_effect = rank_effect(baseline_points, canary_points, plan.rollback_tolerance, plan.floor)
    within_effect = rank_effect(baseline_points, canary_points, plan.promote_tolerance, plan.floor, "upper")
    healthy_effect = rank_effect(baseline_points, canary_points, plan.healthy_tolerance, 0.0)  # no floor: above
    regressed_effect = rank_effect(baseline_points, canary_points, plan.regressed_tolerance, plan.floor, "upper")
    effects = (slower_effect, within_effect, healthy_effect, regressed_effect)
    if reference == "learned" and noise is not None:
        # Before any interval could test it, a rollback allows the canary pods more own load than the baseline's.
        allowance = (EARLY_CANARY_ALLOWANCE - 1) * pod_weights(canary_pods) if own.degrees < 1 else 0.0
        (z_slower, degrees), (z_healthy, _) = (
            learned_z(*effect, noise, weights, look, allowance) for effect in (slower_effect, healthy_effect)
        )
        z_within, _ = learned_z(*within_effect, noise, weights, look)
        z_regressed, _ = learned_z(*regressed_effect, noise, weights, look)
    elif reference == "canary" and noise is not None:
        (z_slower, degrees), (z_within, _), (z_healthy, _), (z_regressed, _) = (
            canary_z(*effect, noise, weights, own, interval_weights) for effect in effects
        )
    else:
        z_slower, degrees = spread_z(*slower_effect, spread, weights)
        z_within, _ = spread_z(*within_effect, spread, weights)
        z_healthy, _ = spread_z(*healthy_effect, spread, weights)
        z_regressed, _ = spread_z(*regressed_effect, spread, weights)
    slower, _ = rank_effect(baseline_points, canary_points, 0.0, 0.0)
    verdict: RankVerdict = (
        "Undecided" if reference == "intervals" and replicates < FEWEST_INTERVALS
        else "Failed" if z_slower >= rollback_critical and z_healthy >= healthy_critical
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
        pod_degrees=spread.degrees,
        pod_deviation=math.sqrt(spread.excess),
        degrees=degrees,
        reference=reference,
        intervals=replicates,
        noise=noise if reference in ("learned", "canary") else None,
        unlearned=unlearned,
    )


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
    intervals: IntervalBuckets | None = None,
    noise: FleetNoise | None = None,
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
    result = rank_test(pooled[0], pooled[1], plan, look, intervals, noise)
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
    degrees = f"df {min(result.degrees, 999):.1f}"
    if result.noise is not None and result.reference == "canary":
        return f"pods {baseline}+{canary}, {result.unlearned}; node offsets {result.noise.describe()}; {degrees}"
    if result.noise is not None:
        return f"pods {baseline}+{canary}, {result.noise.describe()}; {degrees}"
    return _estimated(result)


def _estimated(result: RankResult) -> str:
    baseline, canary = result.pods
    if result.reference == "requests":
        return f"{NO_POD_REFERENCE}, requests alone"
    if result.reference == "intervals" and result.intervals < FEWEST_INTERVALS:
        return (
            f"{NO_POD_REFERENCE}; {result.intervals} full interval(s) of the step, {FEWEST_INTERVALS} needed to "
            "measure the pods' own noise"
        )
    spread = f"pod spread {result.pod_deviation:.3f} (df {min(result.degrees, 999):.1f})"
    if result.reference == "intervals":
        return f"{NO_POD_REFERENCE}; {spread} over {result.intervals} intervals"
    return f"pods {baseline}+{canary}, {spread}"


def has_pod_reference(baseline: PodBuckets, canary: PodBuckets) -> bool:
    """Whether a role has two pods with requests (as ``pod_spread`` counts them): else the verdict needs the step's
    intervals (``assess_latency_check``'s ``intervals``)."""
    return any(sum(1 for buckets in role if _total([buckets]) > 0) >= 2 for role in (baseline, canary))


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
    intervals: IntervalBuckets | None = None,
    noise: FleetNoise | None = None,
) -> Measurement:
    """One latency check as the operator judges it (the Prometheus adapter and benchmarks/bench_analysis.py both
    call this): the rank test on each pod's ``pooled`` buckets, or the quantile test on the ``interval``'s."""
    if check.test == "rank" and pooled is not None:
        return assess_rank(
            check,
            spec,
            interval,
            pooled,
            look=look,
            requests=requests,
            at=at,
            query=query,
            intervals=intervals,
            noise=noise,
        )
    baseline, canary = (_quantile(check.quantile, buckets) for buckets in interval)
    gate = RequestGate(requests, spec.min_requests)
    return assess_latency(check, Reading(baseline, canary, query), gate=gate, at=at)
