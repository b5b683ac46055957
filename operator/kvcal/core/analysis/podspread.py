"""A pod is not the average of its role: the spread of each role's pods beyond their requests' noise, and the rank
test's z with that spread in its variance (docs/concepts.md, "The latency test")."""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from kvcal.core.analysis.histograms import on_bounds, rank_effect

# The confidence of the pods' spread's upper bound that sets the verdict's degrees of freedom (spread_z).
SPREAD_BOUND = 0.90
_NORMAL = NormalDist()


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


NO_SPREAD = PodSpread(squares=0.0, request_variance=0.0, degrees=0)  # nothing to measure a spread with


def pod_spread(roles: Sequence[Sequence[list[tuple[float, float]]]]) -> PodSpread:
    """The between-pod spread of each role's pods (each as ``cumulative_counts``), pooled over roles: each pod is
    compared with the rest of its role (``pod_deviations``)."""
    deviations_by_role = [pod_deviations(pods) for pods in roles]
    return spread_of([role for role in deviations_by_role if len(role[0]) >= 2])


def pod_deviations(pods: Sequence[list[tuple[float, float]]]) -> tuple[list[float], list[float]]:
    """(each pod's deviation from its role's pool, that deviation's request-level variance) for the pods with
    requests, where there are two or more (none otherwise): a leave-one-out rank effect of the pod against the rest,
    scaled by 1 - its share of the role's requests to read as its deviation from the role's pool, its variance with
    it."""
    pods = [pod for pod in pods if pod[-1][1] > 0]
    if len(pods) < 2:
        return [], []
    bounds, counts = on_bounds(pods)
    role = [sum(column) for column in zip(*counts, strict=True)]  # the role's pool, once: each rest is it - a pod
    deviations, variances = [], []
    for own in counts:
        rest = [whole - mine for whole, mine in zip(role, own, strict=True)]
        rest_points, own_points = (list(zip(bounds, each, strict=True)) for each in (rest, own))
        effect, deviation = rank_effect(rest_points, own_points, 0.0, 0.0)
        outside = 1 - own[-1] / role[-1]
        deviations.append(effect * outside)
        variances.append((deviation * outside) ** 2)
    return deviations, variances


def spread_of(roles: Sequence[tuple[Sequence[float], Sequence[float]]]) -> PodSpread:
    """The spread of each role's pods from (their deviations from the role's pool, those deviations' request-level
    variances), for roles of 2 or more pods: the squares about each role's mean deviation, and the requests' share
    of them (pods - 1 times the mean variance)."""
    squares = request_variance = 0.0
    degrees = 0
    for deviations, variances in roles:
        mean = sum(deviations) / len(deviations)
        squares += sum((each - mean) ** 2 for each in deviations)
        request_variance += (len(deviations) - 1) * sum(variances) / len(variances)
        degrees += len(deviations) - 1
    return PodSpread(squares=squares, request_variance=request_variance, degrees=degrees)


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


def interval_spread(
    baseline: Sequence[list[tuple[float, float]]], canary: Sequence[list[tuple[float, float]]]
) -> tuple[PodSpread, float, int]:
    """(the spread of the canary's effect from interval to interval beyond its requests' noise, that spread's weight
    in the effect pooled over the step, the intervals counted): each full interval of the step is a replicate (both
    roles' buckets per interval, ``cumulative_counts``). What varies between intervals (each pod's own load, its
    queue) is in it; what stays with a pod for the whole step (its node) is not: only other pods show that."""
    pairs = [(base, own) for base, own in zip(baseline, canary, strict=True) if base[-1][1] > 0 and own[-1][1] > 0]
    if len(pairs) < 2:
        return NO_SPREAD, 1.0, len(pairs)
    effects, variances = [], []
    for base, own in pairs:
        bounds, (base_counts, own_counts) = on_bounds([base, own])
        effect, deviation = rank_effect(
            list(zip(bounds, base_counts, strict=True)), list(zip(bounds, own_counts, strict=True)), 0.0, 0.0
        )
        effects.append(effect)
        variances.append(deviation**2)
    weights = pod_weights([own for _, own in pairs])  # each interval's share of the canary's requests, squared
    return spread_of([(effects, variances)]), weights, len(pairs)
