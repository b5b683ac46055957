"""The baseline fleet's own noise learned from its history, for the rank test (docs/concepts.md, "Noise learned from
the baseline's history").

A pod's latency moves with its node (an offset that stays with the pod) and with its own load (its queue and batch
mix, new each interval), beyond what its requests alone would show. The rank test must count both for the one canary
pod; estimated from a few pods over a few intervals they cost most of its power. Every baseline pod has been scraped
for hours before the canary exists: ``learn_noise`` reads their histograms over sampled past intervals, compares each
pod with its siblings in each interval (``pod_deviations``, the leave-one-out rank effect), and splits the spread as
a two-way analysis of variance does:

- own load: the spread of a pod's deviations from interval to interval about its own mean, beyond the requests'
  variance (degrees of freedom: about (pods - 1) x (intervals - 1), hundreds);
- node offsets: the spread of the pods' mean deviations, less what own load and requests leave in a mean of that many
  intervals (degrees of freedom: pods - 1; the history sees each pod's node once, however long it is).

A pod's effect pooled over the k intervals of a step then varies by node + own / k (``pooled_variance``), and the
test's degrees of freedom are Satterthwaite's from the two estimates' (``learned_z``). The canary pod is assumed to be
like a baseline pod: ``canary_noisier`` tests that assumption on the step's intervals, and where it fails the rank
test falls back to the step's own estimate.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvcal.core.analysis.histograms import Buckets, cumulative_counts, pool, rank_effect
from kvcal.core.analysis.podspread import (
    SPREAD_BOUND,
    PodSpread,
    chi_square_quantile,
    normal_equivalent,
    pod_deviations,
)
from kvcal.models.spec import LatencyMetric
from kvcal.models.status import NoiseStatus

# Fewer sampled intervals with two pods or more than this and the history is not used (its own-load estimate would
# rest on too little: the step's own estimate is as good).
FEWEST_HISTORY_INTERVALS = 12
# The guard's false-alarm rate per look: a canary as quiet as its baseline still falls back this often (it costs
# power, never a wrong verdict); a noisier one falls back sooner the lower the boundary.
GUARD_ALPHA = 0.05

# The slowdown whose effect the status keeps: sizing scales it to the regression it asks about.
SLOWDOWN = 0.10

# One sampled interval of the history: each baseline pod's bucket counts over one analysis interval, by pod.
HistoryInterval = Mapping[str, Buckets]


@dataclass(frozen=True)
class FleetNoise:
    """The baseline pods' own noise on the rank test's effect scale (variances of P(slower) - 1/2 per pod)."""

    node: float  # a pod's fixed offset (its node): variance, >= 0
    own: float  # a pod's own load in one interval: variance, >= 0
    node_degrees: int  # pods - 1
    own_degrees: int
    pods: int  # distinct baseline pods in the history
    intervals: int  # sampled intervals with two pods or more
    requests: float = 0.0  # a baseline pod's mean requests per interval (for sizing)
    slowdown: float = 0.0  # the effect of a canary 10% slower than this fleet's latencies (for sizing)

    def pooled_variance(self, intervals: int) -> float:
        """The variance of one pod's effect pooled over ``intervals`` intervals of a step (its node's and its own
        load's, averaged over the intervals)."""
        return self.node + self.own / max(intervals, 1)

    def describe(self) -> str:
        return (
            f"noise learned from {self.intervals} intervals of {self.pods} baseline pods: node sd "
            f"{math.sqrt(self.node):.4f} (df {self.node_degrees}), own load sd {math.sqrt(self.own):.4f} "
            f"(df {self.own_degrees})"
        )


def learn_noise(history: Sequence[HistoryInterval]) -> FleetNoise | str:
    """The fleet's noise from ``history`` (each sampled interval's buckets per baseline pod, ``increase()`` over one
    analysis interval), or why it cannot be learned (a sentence)."""
    deviations: dict[str, list[tuple[float, float]]] = {}  # pod -> (deviation, its request variance) per interval
    used = 0
    whole: list[list[tuple[float, float]]] = []  # every answering pod's histogram of every interval
    for interval in history:
        names = sorted(name for name, buckets in interval.items() if buckets)
        histograms = [cumulative_counts(interval[name]) for name in names]
        answered = [(name, pod) for name, pod in zip(names, histograms, strict=True) if pod[-1][1] > 0]
        if len(answered) < 2:
            continue
        used += 1
        whole += [pod for _, pod in answered]
        effects, variances = pod_deviations([pod for _, pod in answered])
        for (name, _), effect, variance in zip(answered, effects, variances, strict=True):
            deviations.setdefault(name, []).append((effect, variance))
    repeated = {name: cells for name, cells in deviations.items() if len(cells) >= 2}
    if len(repeated) < 2:
        seen = len({name for interval in history for name in interval})
        return (
            f"history: {seen} baseline pod(s) seen in {len(history)} sampled intervals; two pods answering in two "
            "intervals or more are needed to tell a pod's own noise from the fleet's load"
        )
    if used < FEWEST_HISTORY_INTERVALS:
        return f"history: {used} sampled intervals with two pods answering, {FEWEST_HISTORY_INTERVALS} needed"
    pods = len(repeated)
    within = within_degrees = 0.0
    request_part = 0.0
    means, mean_variances, counts = [], [], []
    for cells in repeated.values():
        values = [effect for effect, _ in cells]
        mean = sum(values) / len(values)
        mean_variance = sum(variance for _, variance in cells) / len(cells)
        within += sum((value - mean) ** 2 for value in values)
        within_degrees += len(values) - 1
        request_part += (len(values) - 1) * mean_variance
        means.append(mean)
        mean_variances.append(mean_variance)
        counts.append(len(values))
    # The deviations are taken about each interval's pool, which removes one pod's worth of degrees of freedom from
    # every interval: (pods - 1) / pods of the within-pod ones measure own load (a two-way layout's residual).
    own_degrees = max(1, round(within_degrees * (pods - 1) / pods))
    own = max(0.0, (within - request_part) / own_degrees)
    grand = sum(means) / pods
    between = sum((mean - grand) ** 2 for mean in means)
    node_degrees = pods - 1
    # What own load and requests leave in a pod's mean of its intervals (the requests' variance read about the whole
    # pool, as the deviations are: pods / (pods - 1) times the leave-one-out one).
    leftover = sum((own + variance * pods / (pods - 1)) / count for variance, count in
                   zip(mean_variances, counts, strict=True)) / pods  # fmt: skip
    node = max(0.0, between / node_degrees - leftover)
    fleet = pool(whole)
    return FleetNoise(
        node=node, own=own, node_degrees=node_degrees, own_degrees=own_degrees, pods=pods, intervals=used,
        requests=sum(pod[-1][1] for pod in whole) / len(whole),
        slowdown=-rank_effect(fleet, fleet, SLOWDOWN, 0.0)[0],
    )  # fmt: skip


def learned_z(
    effect: float,
    request_deviation: float,
    noise: FleetNoise,
    weights: float,
    intervals: int,
    canary_allowance: float = 0.0,
) -> tuple[float, float]:
    """(z, degrees of freedom) of an effect whose variance is its requests' plus ``weights`` x one pod's pooled
    variance over ``intervals`` (``FleetNoise.pooled_variance``), read as Student's t at Satterthwaite's degrees and
    put on the normal scale. The degrees are computed from the estimates themselves: the history's are free of the
    requests' noise (unlike a step's few pods, whose spread ``spread_z`` bounds from above). ``canary_allowance``:
    more own-load variance counted (in units of the canary pods' share of it) where nothing has tested the canary."""
    own_weights = weights + canary_allowance
    variance = request_deviation**2 + weights * noise.node + own_weights * noise.own / max(intervals, 1)
    if variance <= 0:
        return 0.0, math.inf
    node, own = weights * noise.node, own_weights * noise.own / max(intervals, 1)
    spread = (node**2 / noise.node_degrees if noise.node_degrees else 0.0) + own**2 / max(noise.own_degrees, 1)
    degrees = variance**2 / spread if spread > 0 else math.inf
    return normal_equivalent(effect / math.sqrt(variance), degrees), degrees


def canary_noisier(noise: FleetNoise, own: PodSpread, baseline_weights: float) -> str | None:
    """Why the canary's effect varies from interval to interval more than the learned own load allows (a variance
    ratio test at GUARD_ALPHA on the step's full intervals: ``own`` as ``interval_spread`` reads them), or None.
    Were the canary one more baseline pod, its effect in an interval would vary by own load x (1 +
    ``baseline_weights``: the baseline pool's share of it) plus the interval's requests' variance."""
    if own.degrees < 1:
        return None
    expected = noise.own * (1 + baseline_weights) + own.request_variance / own.degrees
    if expected <= 0:
        return None
    ratio = own.squares / own.degrees / expected
    limit = chi_square_quantile(1 - GUARD_ALPHA, own.degrees) / own.degrees
    if ratio <= limit:
        return None
    return (
        f"the canary varies {ratio:.1f}x from interval to interval what its baseline's learned noise allows "
        f"(limit {limit:.1f}x over {own.degrees + 1} intervals): its own intervals measure it"
    )


def canary_z(
    effect: float,
    request_deviation: float,
    noise: FleetNoise,
    pod_weights: float,
    own: PodSpread,
    interval_weights: float,
) -> tuple[float, float]:
    """(z, degrees of freedom) where the canary is noisier than its baseline's history allows: the nodes' variance
    as learned (``pod_weights`` x node: a node offset stays with a pod, no interval shows it), the pods' own load as
    the step's intervals show it (``own``, ``interval_spread``'s: the canary's own and the baseline pool's share,
    ``interval_weights`` of it in the pooled effect), read as Student's t at Satterthwaite's degrees with the step's
    part at its upper bound (a few intervals, read through their requests' noise)."""
    variance = request_deviation**2 + pod_weights * noise.node + interval_weights * own.excess
    if variance <= 0:
        return 0.0, math.inf
    node = pod_weights * noise.node
    spread = node**2 / noise.node_degrees if noise.node_degrees else 0.0
    upper_own = 0.0
    if own.degrees:
        upper_mean_square = own.squares / chi_square_quantile(1 - SPREAD_BOUND, own.degrees)
        upper_own = interval_weights * max(0.0, upper_mean_square - own.request_variance / own.degrees)
        spread += upper_own**2 / own.degrees
    upper = request_deviation**2 + node + upper_own
    degrees = upper**2 / spread if spread > 0 else math.inf
    return normal_equivalent(effect / math.sqrt(variance), degrees), degrees


def noise_status(metric: LatencyMetric, learned: FleetNoise | str, at: str) -> NoiseStatus:
    """What the status shows for ``metric``'s noise (ttft, itl, e2e): the learned one, or why there is none."""
    if isinstance(learned, str):
        return NoiseStatus(
            metric=metric, source="estimated", learned_at=at,
            message=f"{learned}: the rank test estimates the pods' noise in each step",
        )  # fmt: skip
    return NoiseStatus(
        metric=metric, source="learned", learned_at=at, message=learned.describe(), pods=learned.pods,
        intervals=learned.intervals, node_variance=learned.node, node_degrees=learned.node_degrees,
        own_variance=learned.own, own_degrees=learned.own_degrees, requests_per_pod=learned.requests,
        slowdown_effect=learned.slowdown,
    )  # fmt: skip


def from_status(noise: Sequence[NoiseStatus]) -> dict[str, FleetNoise]:
    """The learned noise of each metric in the status (``noise_status`` read back)."""
    out: dict[str, FleetNoise] = {}
    for each in noise:
        numbers = (each.node_variance, each.own_variance, each.node_degrees, each.own_degrees)
        if each.source != "learned" or any(number is None for number in numbers) or each.pods is None:
            continue
        out[each.metric] = FleetNoise(
            node=each.node_variance or 0.0, own=each.own_variance or 0.0, node_degrees=each.node_degrees or 0,
            own_degrees=each.own_degrees or 0, pods=each.pods, intervals=each.intervals or 0,
            requests=each.requests_per_pod or 0.0, slowdown=each.slowdown_effect or 0.0,
        )  # fmt: skip
    return out
