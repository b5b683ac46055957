"""Detection and false-rollback rates of the canary latency verdict, as the operator runs it (seeded simulation).

Each simulated rollout is one analysis step of 60 s intervals run until it passes, fails, or MAX_INTERVALS pass:
- pods: the baseline's pods (9 by default: the replicas router's 10% is 1 canary pod beside 9 baseline pods) and the
  canary's; the canary gets ``canary`` requests per interval on average (Poisson), the baseline nine times as many,
  each role's split evenly over its pods;
- TTFT per request from a scenario's distribution, times a per-interval load factor shared by every pod (lognormal
  sigma 0.15: load spikes move both roles), times each pod's node offset (fixed per rollout, lognormal sigma
  ``node``, 0.02 by default) and each pod's own per-interval load (its queue and batch mix, lognormal sigma ``own``,
  0 by default); a regression multiplies the canary's TTFT by 1.15 (or, in ``p99-only``, its slowest 1%);
- the operator's view: vLLM's TTFT histogram bucket counts of this interval per role, and of each pod since the
  step's first interval began, as ``increase(..._bucket[...])`` returns them; with one pod per role, also each
  role's counts of the step's full intervals but the first (the operator's subquery: one fewer than the looks);
- then inter-token latency at a GPU's speed (~12 ms and ~6 ms, ~3,000 tokens per canary interval, vLLM's ITL
  buckets) with the default noiseFloorSeconds and the 5 ms one before it;
- last, one baseline pod and one canary pod, and the efficiency goals against more baseline and canary pods.

Rows, all on the same simulated rollouts:
- ``kvcal rank (operator)``: the default spec (or the one named); each interval goes through the operator's own
  functions (kvcal.core.analysis.ranktest.assess_latency_check with the interval's and each pod's buckets,
  assess_requests, then assess_run with the spec's limits and status counters), exactly what PrometheusSource.measure +
  decide do;
- ``kvcal quantile``: the same with ``test: quantile`` (one interval's p95 vs baseline x 1.10);
- ``Flagger-like``: the canary's p95 alone vs a fixed maximum (nominal baseline p95 x 1.10); rolls back after 2
  failed checks, promotes after 5 passed ones;
- ``oracle``: the rank test's sequential design (same tolerances, per-look boundaries, looks, alpha, counters) on a
  Welch t-test of the raw log latencies that counts requests alone (no pod's own noise), which Prometheus never
  sees: the ceiling where requests are the only noise;
- ``oracle, the pods' noise estimated`` (every row): the same with the pods' noise estimated from each pod's raw
  mean by the rank test's own estimator (kvcal.core.analysis.podspread): what histograms cost, against the rank test's
  row;
- ``oracle, the pods' noise known`` (every row): the same with the variance the pods' node offsets and own load add,
  as the simulation drew them, known instead of estimated: what estimating it from a few pods costs, against the
  row above (a price any verdict pays that must hold for pods whose noise nobody stated).
- ``kvcal rank, noise learned`` (the last rows): the operator's rank test with the noise its ``learn_noise`` reads
  from a history of HISTORY_INTERVALS sampled past intervals of the same baseline pods (their node offsets, the
  shared load, their own load; bucket counts drawn from the scenario's distribution), the guard on the step's
  intervals from the third look as the operator fetches them.

Run: .venv/bin/python benchmarks/bench_analysis.py [--runs 300] [--seed 0] [--quick | --recheck | --learned]
"""

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

import numpy as np

from kvcal.core.analysis.fleetnoise import FleetNoise, learn_noise
from kvcal.core.analysis.histograms import Buckets
from kvcal.core.analysis.podspread import spread_of, spread_z
from kvcal.core.analysis.ranktest import FEWEST_INTERVALS, IntervalBuckets, design
from kvcal.core.analysis.ranktest import assess_latency_check as operator_check
from kvcal.core.analysis.verdict import AnalysisVerdict, RequestCounts, assess_requests, assess_run
from kvcal.models.spec import AnalysisSpec, LatencyCheck
from kvcal.models.status import AnalysisStatus, Measurement

# vLLM 0.32's time_to_first_token_seconds buckets (tests/data/vllm-0.32-metrics.txt).
TTFT_BUCKETS = np.array([0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                         20.0, 40.0, 80.0, 160.0, 640.0, 2560.0])  # fmt: skip
# vLLM 0.32's inter_token_latency_seconds buckets (tests/data/vllm-0.32-cpu/metrics-bf16.txt).
ITL_BUCKETS = np.array([0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                        40.0, 80.0])  # fmt: skip
LOAD_SIGMA, NODE_SIGMA = 0.15, 0.02
REGRESSION = 1.15
QUANTILE = 0.95
BASELINE_SHARE = 9  # baseline requests per canary request (10% canary weight)
MAX_INTERVALS = 15
NOW = datetime(2026, 1, 1, tzinfo=UTC)
RANK = AnalysisSpec(latency=[LatencyCheck(metric="ttft")])
RANK_SEVEN = AnalysisSpec(latency=[LatencyCheck(metric="ttft")], successful_intervals=7)
QUANTILE_TEST = AnalysisSpec(latency=[LatencyCheck(metric="ttft", test="quantile")])
RANK_ITL = AnalysisSpec(latency=[LatencyCheck(metric="itl")])
RANK_ITL_5MS = AnalysisSpec(latency=[LatencyCheck(metric="itl", noise_floor_seconds=0.005)])  # the default before


@dataclass(frozen=True)
class Scenario:
    name: str
    draw: Callable[[np.random.Generator, int], np.ndarray]
    tail_only: bool = False  # the regression slows only the slowest 1% (x1.5) instead of every request (x1.15)
    bounds: np.ndarray = field(default_factory=lambda: TTFT_BUCKETS)  # the histogram's buckets


def lognormal(rng: np.random.Generator, size: int) -> np.ndarray:
    return np.exp(rng.normal(0.0, 0.5, size)) * 0.2


def heavy_tail(rng: np.random.Generator, size: int) -> np.ndarray:
    # A queue: 10% of requests wait an exponential 0.3 s more.
    return lognormal(rng, size) + (rng.random(size) < 0.1) * rng.exponential(0.3, size)


def bimodal(rng: np.random.Generator, size: int) -> np.ndarray:
    # Prefix-cache hits (40%, ~50 ms) and misses (~300 ms).
    hit = rng.random(size) < 0.4
    return np.where(hit, np.exp(rng.normal(0.0, 0.3, size)) * 0.05, np.exp(rng.normal(0.0, 0.4, size)) * 0.3)


def gpu_itl(rng: np.random.Generator, size: int) -> np.ndarray:
    # Inter-token latency on a GPU: ~12 ms a token, the decode step FP8 KV's attention moves.
    return np.exp(rng.normal(0.0, 0.3, size)) * 0.012


def fast_itl(rng: np.random.Generator, size: int) -> np.ndarray:
    # ~6 ms a token: 95% of tokens in vLLM's first ITL bucket (<= 10 ms), whose inside no histogram shows.
    return np.exp(rng.normal(0.0, 0.3, size)) * 0.006


SCENARIOS = {
    "lognormal": Scenario("lognormal", lognormal),
    "heavy tail": Scenario("heavy tail", heavy_tail),
    "bimodal": Scenario("bimodal", bimodal),
    "p99-only": Scenario("p99-only x1.5", lognormal, tail_only=True),
    "itl": Scenario("ITL ~12 ms", gpu_itl, bounds=ITL_BUCKETS),
    "fast itl": Scenario("ITL ~6 ms", fast_itl, bounds=ITL_BUCKETS),
}


@dataclass(frozen=True)
class Pods:
    """Where the requests run: pods per role, and what moves one pod on its own."""

    baseline: int = 9  # the replicas router at 10%: 1 canary pod beside 9 baseline pods
    canary: int = 1
    own: float = 0.0  # lognormal sigma of each pod's own per-interval load (its queue, its batch mix)
    node: float = NODE_SIGMA  # lognormal sigma of each pod's fixed offset (its node)
    canary_own: float | None = None  # the canary pods' own load where it differs from the baseline's (a noisier one)

    @property
    def canary_load(self) -> float:
        return self.own if self.canary_own is None else self.canary_own


TODAY = Pods()


@dataclass
class Side:
    counts: np.ndarray  # runs x intervals x buckets (+Inf last), per interval, the role's pods summed
    pods: np.ndarray  # runs x intervals x pods x buckets, per pod, summed since the step's first interval
    log_sum: np.ndarray  # runs x intervals x pods, since the step began: sum, sum of squares and count of log
    log_squares: np.ndarray  # latencies (the oracles)
    n: np.ndarray
    bounds: np.ndarray  # the histogram's buckets (+Inf implied)

    @property
    def pooled(self) -> np.ndarray:
        return self.pods.sum(axis=2)


@dataclass
class Simulation:
    baseline: Side
    canary: Side
    baseline_nodes: np.ndarray  # runs x 1 x pods: each baseline pod's node offset (its history shares it)
    noise: list[FleetNoise | str] = field(default_factory=list)  # per run: the noise learned from its history


def side(rng: np.random.Generator, scenario: Scenario, n: np.ndarray, scale: np.ndarray, tail: float) -> Side:
    """``n`` and ``scale``: runs x intervals x pods."""
    runs, intervals, pods = n.shape
    cells = runs * intervals * pods
    owner = np.repeat(np.arange(cells), n.ravel())
    samples = scenario.draw(rng, int(n.sum()))
    if tail != 1.0:
        samples = np.where(samples > np.quantile(scenario.draw(np.random.default_rng(1), 200_000), 0.99),
                           samples * tail, samples)  # fmt: skip
    samples = samples * scale.ravel()[owner]
    index = np.searchsorted(scenario.bounds, samples, side="left")  # le: value <= bound
    counts = np.zeros((cells, len(scenario.bounds) + 1), dtype=np.int64)
    np.add.at(counts, (owner, index), 1)
    logs = np.log(samples)
    log_sum = np.bincount(owner, logs, cells).reshape(runs, intervals, pods)
    log_squares = np.bincount(owner, logs * logs, cells).reshape(runs, intervals, pods)
    counts = counts.reshape(runs, intervals, pods, -1)
    return Side(
        counts=counts.sum(axis=2),
        pods=counts.cumsum(axis=1),
        log_sum=log_sum.cumsum(axis=1),
        log_squares=log_squares.cumsum(axis=1),
        n=n.cumsum(axis=1),
        bounds=scenario.bounds,
    )


def simulate(
    rng: np.random.Generator, scenario: Scenario, runs: int, canary: float, regressed: bool, pods: Pods = TODAY
) -> Simulation:
    load = np.exp(rng.normal(0.0, LOAD_SIGMA, (runs, MAX_INTERVALS, 1)))  # shared by every pod of both roles
    uniform = REGRESSION if regressed and not scenario.tail_only else 1.0
    tail = 1.5 if regressed and scenario.tail_only else 1.0
    roles, nodes = [], []
    for count, requests, factor, sigma in ((pods.baseline, canary * BASELINE_SHARE, 1.0, pods.own),
                                           (pods.canary, canary, uniform, pods.canary_load)):  # fmt: skip
        n = rng.poisson(requests / count, (runs, MAX_INTERVALS, count))
        node = np.exp(rng.normal(0.0, pods.node, (runs, 1, count)))
        own = np.exp(rng.normal(0.0, sigma, (runs, MAX_INTERVALS, count)))
        roles.append((n, load * node * own * factor))
        nodes.append(node)
    (n_baseline, baseline_scale), (n_canary, canary_scale) = roles
    return Simulation(
        baseline=side(rng, scenario, n_baseline, baseline_scale, 1.0),
        canary=side(rng, scenario, n_canary, canary_scale, tail),
        baseline_nodes=nodes[0],
    )


def learn_history(
    rng: np.random.Generator, scenario: Scenario, sim: Simulation, canary: float, pods: Pods, intervals: int
) -> None:
    """``intervals`` sampled past intervals of the baseline's pods (their node offsets, shared load and own load
    drawn as in the rollout, bucket counts drawn from the scenario's distribution), and the noise the operator's
    ``learn_noise`` reads from them, one per run into ``sim.noise``."""
    runs, count = sim.baseline_nodes.shape[0], pods.baseline
    load = np.exp(rng.normal(0.0, LOAD_SIGMA, (runs, intervals, 1)))
    own = np.exp(rng.normal(0.0, pods.own, (runs, intervals, count)))
    factor = (load * own * sim.baseline_nodes).ravel()
    n = rng.poisson(canary * BASELINE_SHARE / count, factor.shape)
    reference = np.sort(scenario.draw(np.random.default_rng(2), 200_000))
    below = np.searchsorted(reference, scenario.bounds[None, :] / factor[:, None], side="right") / len(reference)
    probabilities = np.diff(np.concatenate([np.zeros((len(factor), 1)), below, np.ones((len(factor), 1))], axis=1))
    counts = rng.multinomial(n, probabilities).reshape(runs, intervals, count, -1)
    names = [f"pod-{pod}" for pod in range(count)]
    sim.noise = [
        learn_noise([
            {name: as_buckets(counts[run, past, pod], scenario.bounds) for pod, name in enumerate(names)}
            for past in range(intervals)
        ])
        for run in range(runs)
    ]  # fmt: skip


def as_buckets(counts: np.ndarray, bounds: np.ndarray) -> Buckets:
    """Prometheus' shape: (le, cumulative count) with +Inf."""
    cumulative = np.cumsum(counts).tolist()
    return [*zip(bounds.tolist(), cumulative[:-1], strict=True), (math.inf, cumulative[-1])]


Decider = Callable[[Simulation, int], tuple[str, int]]  # -> (outcome, intervals used)


def ended(verdict: AnalysisVerdict) -> str:
    """The run's outcome; a rollback for too few requests (InconclusiveLimit) is told apart from one for latency."""
    inconclusive = verdict.outcome == "Failed" and verdict.reason.startswith("InconclusiveLimit")
    return "Inconclusive" if inconclusive else verdict.outcome


def full_intervals(sim: Simulation, run: int, interval: int, learned: bool = False) -> IntervalBuckets | None:
    """What the operator fetches where no role has two pods, or the noise was learned (the guard reads them): the
    step's full intervals before the last (Prometheus' aligned windows inside the step: one fewer than the looks)."""
    if max(sim.baseline.pods.shape[2], sim.canary.pods.shape[2]) > 1 and not learned:
        return None
    baseline, canary = (
        [as_buckets(each, role.bounds) for each in role.counts[run, 1 : interval + 1]]
        for role in (sim.baseline, sim.canary)
    )
    return baseline, canary


def operator_decider(spec: AnalysisSpec, learned: bool = False) -> Decider:
    """Every interval as the operator judges it: requests + the latency check, then assess_run's counters; with
    ``learned``, the noise learned from each run's history (``learn_history``) where it could be."""
    check = spec.latency[0]

    def roll_out(sim: Simulation, run: int) -> tuple[str, int]:
        status = AnalysisStatus()
        base, canary = sim.baseline, sim.canary
        noise = sim.noise[run] if learned else None
        for interval in range(MAX_INTERVALS):
            at = f"t{interval}"
            requests = RequestCounts(float(base.counts[run, interval].sum()), float(canary.counts[run, interval].sum()))
            measured = [
                assess_requests(requests, min_requests=spec.min_requests, at=at),
                operator_check(
                    check, spec,
                    (as_buckets(base.counts[run, interval], base.bounds),
                     as_buckets(canary.counts[run, interval], base.bounds)),
                    ([as_buckets(pod, base.bounds) for pod in base.pods[run, interval]],
                     [as_buckets(pod, base.bounds) for pod in canary.pods[run, interval]]),
                    look=interval + 1, requests=requests, at=at,
                    intervals=full_intervals(sim, run, interval, learned and interval + 1 > FEWEST_INTERVALS),
                    noise=noise if isinstance(noise, FleetNoise) else None,
                ),
            ]  # fmt: skip
            verdict = assess_run(spec, status, measured, NOW)
            status = verdict.status
            if verdict.outcome != "Running":
                return ended(verdict), interval + 1
        return "Undecided", MAX_INTERVALS

    return roll_out


# How an oracle counts the pods' own noise: not at all (requests alone), as the simulation drew it, or estimated from
# each pod's raw mean log latency with the rank test's own estimator (kvcal.core.analysis.podspread).
PodNoise = Literal["ignored", "known", "estimated"]


@dataclass(frozen=True)
class Moments:
    """One role's raw log latencies since the step began, per pod: count, mean and variance."""

    n: np.ndarray
    mean: np.ndarray
    variance: np.ndarray

    @classmethod
    def of(cls, role: Side, run: int, interval: int) -> "Moments":
        n = role.n[run, interval].astype(float)
        mean = role.log_sum[run, interval] / np.maximum(n, 1)
        variance = (role.log_squares[run, interval] - n * mean * mean) / np.maximum(n - 1, 1)
        return cls(n, mean, variance)

    def pooled(self) -> tuple[float, float, float]:
        total = float(self.n.sum())
        mean = float((self.n * self.mean).sum()) / max(total, 1)
        squares = float((self.variance * np.maximum(self.n - 1, 0) + self.n * self.mean**2).sum())
        return total, mean, (squares - total * mean * mean) / max(total - 1, 1)


def oracle_decider(spec: AnalysisSpec, pods: Pods = TODAY, noise: PodNoise = "ignored") -> Decider:
    """The rank test's design (tolerances, per-look boundaries, looks, counters) on a Welch t-test of raw log
    latencies pooled since the step began, with the pods' own noise ``noise``."""
    plan = design(spec.latency[0], spec)
    tolerances = [math.log(1 + each) for each in (plan.rollback_tolerance, plan.healthy_tolerance,
                                                   plan.promote_tolerance, plan.regressed_tolerance)]  # fmt: skip

    def roll_out(sim: Simulation, run: int) -> tuple[str, int]:
        status = AnalysisStatus()
        for interval in range(MAX_INTERVALS):
            roles = [Moments.of(role, run, interval) for role in (sim.baseline, sim.canary)]
            (n_base, mean_base, var_base), (n_canary, mean_canary, var_canary) = (role.pooled() for role in roles)
            n_now = float(sim.canary.counts[run, interval].sum())
            exhausted = interval + 1 > plan.looks  # as the rank test: its last look passed, onUndecided decides
            if n_now < spec.min_requests or n_base < 2 or n_canary < 2:
                phase = "Inconclusive"
            elif exhausted:
                phase = "Undecided"
            else:
                requests = math.sqrt(var_base / n_base + var_canary / n_canary)
                differences = [mean_canary - mean_base - each for each in tolerances]
                z_slower, z_healthy, z_within, z_regressed = oracle_zs(
                    differences, requests, roles, pods, noise, interval + 1
                )
                rollback_critical, healthy_critical, promote_critical, regressed_critical = plan.critical(interval + 1)
                phase = (
                    "Failed" if z_slower >= rollback_critical and z_healthy >= healthy_critical
                    else "Successful" if z_within <= -promote_critical and z_regressed <= -regressed_critical
                    else "Undecided"
                )  # fmt: skip
            measured = [Measurement(metric="ttft-mean", phase=phase, at=f"t{interval}", exhausted=exhausted or None)]  # type: ignore[arg-type]
            verdict = assess_run(spec, status, measured, NOW)
            status = verdict.status
            if verdict.outcome != "Running":
                return ended(verdict), interval + 1
        return "Undecided", MAX_INTERVALS

    return roll_out


def oracle_zs(
    effects: list[float], requests: float, roles: list[Moments], pods: Pods, noise: PodNoise, looks: int
) -> list[float]:
    """The z of each difference of mean log latencies (less a tolerance) whose requests' standard deviation is
    ``requests``, with the pods' own noise counted as ``noise`` says."""
    if noise == "ignored":
        return [effect / requests for effect in effects]
    if noise == "known":  # each role's pool moves by (node^2 + own^2 / looks) / its pods
        baseline_pod = pods.node**2 + pods.own**2 / looks
        canary_pod = pods.node**2 + pods.canary_load**2 / looks
        deviation = math.sqrt(requests**2 + baseline_pod / pods.baseline + canary_pod / pods.canary)
        return [effect / deviation for effect in effects]
    deviations_by_role, weights = [], 0.0
    for role in roles:
        total, mean, variance = role.pooled()
        shares = role.n / max(total, 1)
        weights += float((shares**2).sum())
        answered = role.n > 1
        if answered.sum() < 2:
            continue
        # Each pod's deviation from its role's pool, and its requests' variance (the pod against the rest, scaled
        # by 1 - its share), as kvcal.core.analysis.podspread.pod_spread reads them from histograms.
        outside = 1 - shares[answered]
        variances = outside**2 * variance * (1 / role.n[answered] + 1 / (total - role.n[answered]))
        deviations_by_role.append(((role.mean[answered] - mean).tolist(), variances.tolist()))
    spread = spread_of(deviations_by_role)
    return [spread_z(effect, requests, spread, weights)[0] for effect in effects]


def flagger_decider(max_p95: float, threshold: int = 2, iterations: int = 5, min_requests: int = 50) -> Decider:
    def roll_out(sim: Simulation, run: int) -> tuple[str, int]:
        failed = passed = 0
        for interval in range(MAX_INTERVALS):
            counts = sim.canary.counts[run, interval]
            if counts.sum() < min_requests:
                continue  # Flagger skips a check without data ("no values found" halts, it does not pass)
            if histogram_quantile(QUANTILE, counts) > max_p95:
                failed += 1
                if failed >= threshold:  # Flagger's own threshold: rolls back on reaching it
                    return "Failed", interval + 1
            else:
                passed += 1
                if passed >= iterations:
                    return "Passed", interval + 1
        return "Undecided", MAX_INTERVALS

    return roll_out


def histogram_quantile(q: float, counts: np.ndarray) -> float:
    """Prometheus' histogram_quantile over non-cumulative bucket counts (last one is +Inf)."""
    cumulative = np.cumsum(counts)
    rank = q * cumulative[-1]
    index = int(np.searchsorted(cumulative, rank, side="left"))
    if index >= len(TTFT_BUCKETS):
        return float(TTFT_BUCKETS[-1])
    lower = 0.0 if index == 0 else float(TTFT_BUCKETS[index - 1])
    below = 0 if index == 0 else int(cumulative[index - 1])
    return float(lower + (float(TTFT_BUCKETS[index]) - lower) * (rank - below) / max(int(counts[index]), 1))


def evaluate(decider: Decider, regressed: Simulation, healthy: Simulation, runs: int) -> dict[str, float]:
    """Percentages of rollouts: regressed ones rolled back within 3 and 10 intervals and promoted; healthy ones
    rolled back as slower, rolled back for too few requests, undecided (the rank test's last look passed:
    onUndecided decides) and promoted."""
    tally = dict.fromkeys(("detect3", "detect10", "detect", "missed", "false", "few", "undecided", "promoted"), 0)
    for run in range(runs):
        outcome, used = decider(regressed, run)
        tally["detect3"] += outcome == "Failed" and used <= 3
        tally["detect10"] += outcome == "Failed" and used <= 10
        tally["detect"] += outcome == "Failed"
        tally["missed"] += outcome == "Passed"
        outcome, used = decider(healthy, run)
        tally["false"] += outcome == "Failed"
        tally["few"] += outcome == "Inconclusive"
        tally["undecided"] += outcome == "Undecided"
        tally["promoted"] += outcome == "Passed"
    return {key: 100 * count / runs for key, count in tally.items()}


HEADER = (
    f"{'scenario':<15} {'req/ivl':>7} {'pods b+c':>8} {'own':>9} {'node':>5}  {'method':<33} {'detect<=3':>9} "
    f"{'<=10':>6} {'<=15':>6} {'promoted regr.':>14} {'false':>6} {'too few':>7} {'undecided':>9} {'promoted':>8}"
)


def row(scenario: str, canary: int, pods: Pods, method: str, result: dict[str, float]) -> str:
    return (
        f"{scenario:<15} {canary:>7,} {f'{pods.baseline}+{pods.canary}':>8} {_own(pods):>9} {pods.node:>5.2f}  "
        f"{method:<33} {result['detect3']:8.1f}% {result['detect10']:5.1f}% {result['detect']:5.1f}% "
        f"{result['missed']:13.1f}% "
        f"{result['false']:5.1f}% {result['few']:6.1f}% {result['undecided']:8.1f}% {result['promoted']:7.1f}%"
    )


def _own(pods: Pods) -> str:
    """The pods' own load; ``b>c`` where the canary's is larger than the baseline's."""
    return f"{pods.own:.2f}" if pods.canary_own is None else f"{pods.own:.2f}>{pods.canary_own:.2f}"


@dataclass(frozen=True)
class Row:
    scenario: str
    canary: int  # requests per interval
    pods: Pods = TODAY
    every: bool = False  # every method, or the operator's rank test only
    spec: AnalysisSpec = RANK
    spec_name: str = "default"
    learned: bool = False  # also the rank test with the noise learned from a history of the baseline's pods


TODAY_ROWS = [Row("lognormal", n, every=True) for n in (60, 150, 300, 600, 1500)] + [
    Row("heavy tail", 300, every=True), Row("bimodal", 300, every=True), Row("p99-only", 300, every=True),
    Row("p99-only", 1500, every=True),
]  # fmt: skip
NOISE_ROWS = [
    *(Row("lognormal", 300, Pods(baseline=4, own=own, node=node)) for own in (0.0, 0.05, 0.10, 0.20)
      for node in (0.02, 0.05)),
    *(Row("lognormal", 300, Pods(baseline=baseline, own=0.10, node=0.05)) for baseline in (1, 8)),
]  # fmt: skip
# Sizing a canary: canary pods (spec.serving.canary.replicas) and successfulIntervals against the canary's own noise.
SIZING_ROWS = [
    Row("lognormal", 300, Pods(baseline=4, canary=canary, own=own, node=0.05), spec=spec, spec_name=name)
    for own in (0.10, 0.20) for canary in (1, 2, 4) for spec, name in ((RANK, "default"), (RANK_SEVEN, "succ. 7"))
]  # fmt: skip
# Inter-token latency at a GPU's speed (~3,000 tokens per interval on the canary): the default noise floor against
# the 5 ms one before it, which promised to pass whatever the ratio within 5 ms.
ITL_ROWS = [
    Row("itl", 3000, spec=RANK_ITL), Row("itl", 3000, spec=RANK_ITL_5MS, spec_name="5 ms floor"),
    Row("itl", 3000, Pods(baseline=4, own=0.05, node=0.02), spec=RANK_ITL),
    Row("fast itl", 3000, spec=RANK_ITL), Row("fast itl", 3000, spec=RANK_ITL_5MS, spec_name="5 ms floor"),
]  # fmt: skip


# One baseline pod and one canary pod (the step's intervals are the replicates: nothing else shows a pod's own noise),
# then the efficiency goals against more baseline pods and canary pods (spec.serving.canary.replicas) at the same
# requests per interval: today's conditions and a canary pod's own load at 5%. The goal rows' draws follow the 1+1
# rows': docs/operations.md quotes them from this order.
ONE_POD_ROWS = [
    Row("lognormal", 300, Pods(baseline=1, own=own, node=node), spec=spec, spec_name=name)
    for own, node in ((0.0, 0.02), (0.05, 0.02), (0.10, 0.05), (0.20, 0.05))
    for spec, name in ((RANK, "default"), (RANK_SEVEN, "succ. 7"))
]  # fmt: skip
# The efficiency goals against the pods there are: today's conditions and a canary pod's own load at 5%, with more
# baseline pods and canary pods (spec.serving.canary.replicas) at the same requests per interval.
GOAL_ROWS = [
    *(Row("lognormal", 300, Pods(baseline=9, canary=canary)) for canary in (2, 4)),
    *(Row("lognormal", 300, Pods(baseline=baseline, canary=canary, own=0.05, node=0.02))
      for baseline, canary in ((4, 2), (4, 4), (9, 1), (9, 2), (9, 4), (16, 2))),
]  # fmt: skip

# The noise learned from HISTORY_INTERVALS sampled past intervals of the baseline's pods (the spec's default
# history.samples), against today's estimate and the oracles, at the efficiency goals' conditions: 9+1 pods, each
# pod's own load 5-15% and node offsets up to 4%, a canary noisier than its baseline, 4+1 pods, and today's default.
HISTORY_INTERVALS = 96
LEARNED_ROWS = [
    Row("lognormal", 300, TODAY, learned=True),
    *(Row("lognormal", 300, Pods(baseline=9, own=own, node=node), learned=True)
      for own in (0.05, 0.10, 0.15) for node in (0.02, 0.04)),
    *(Row("lognormal", 300, Pods(baseline=9, own=own, node=0.02, canary_own=noisier), learned=True)
      for own, noisier in ((0.10, 0.15), (0.05, 0.10), (0.05, 0.20))),
    Row("lognormal", 300, Pods(baseline=4, own=0.05, node=0.02), learned=True),
    *(Row("lognormal", 300, Pods(baseline=4, canary=canary, own=0.10, node=0.05), learned=True)
      for canary in (1, 2, 4)),  # the sizing table's conditions
]  # fmt: skip

# The rows whose promoted regressions read above 1% in the default run (4 to 8 of 300: a count of a few is mostly
# chance), for a rerun with more draws: --recheck --runs 1500.
RECHECK_ROWS = [TODAY_ROWS[5], ONE_POD_ROWS[0], ONE_POD_ROWS[1], ONE_POD_ROWS[5]]
RECHECK_NAMES = ("heavy tail", "1+1 quiet pods (default and succ. 7)", "1+1 own 10% node 5% (succ. 7)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=300, help="seeded rollouts per row (regressed and healthy each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="one row of today's and two noisy ones")
    parser.add_argument("--recheck", action="store_true", help=f"only {', '.join(RECHECK_NAMES)}, on fresh draws")
    parser.add_argument("--learned", action="store_true", help="only the rows with the noise learned from history")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    # New rows go last, so every row before keeps its draws (and its numbers in docs/operations.md).
    cells = TODAY_ROWS + NOISE_ROWS + SIZING_ROWS + ITL_ROWS + ONE_POD_ROWS + GOAL_ROWS + LEARNED_ROWS
    if args.quick:
        cells = [TODAY_ROWS[2], NOISE_ROWS[5], NOISE_ROWS[7]]
    # --learned: the same draws as in the whole run (the rows before are drawn, not judged)
    skipped = len(cells) - len(LEARNED_ROWS) if args.learned else 0
    if args.recheck:  # draws of their own (seed, 1): not a rerun of the rows' 300
        cells, rng = RECHECK_ROWS, np.random.default_rng([args.seed, 1])
    print(f"{args.runs} regressed and {args.runs} healthy rollouts per row, seed {args.seed}; shared load sigma "
          f"{LOAD_SIGMA}; each pod's node offset (node) and own per-interval load (own) as lognormal sigmas; "
          f"regression x{REGRESSION} on the canary; the baseline {BASELINE_SHARE}x the canary's requests, split "
          f"over its pods; 60 s intervals, vLLM's TTFT buckets; default spec unless named (maxRegression 0.10, "
          f"rollbackAbove 0.05, failureLimit 1, successfulIntervals 5, {MAX_INTERVALS} intervals at most)")  # fmt: skip
    plan = design(RANK.latency[0], RANK)

    def shown(bounds: tuple[float, ...]) -> str:
        return " ".join(f"{z:.2f}" for z in bounds)

    print(f"rank test, default spec: {plan.looks} looks; Failed at z >= {shown(plan.rollback_boundaries)} against "
          f"x{1 + plan.rollback_tolerance:g} and z >= {shown(plan.healthy_boundaries)} against "
          f"x{1 + plan.healthy_tolerance:g}; Successful at z <= -({shown(plan.promote_boundaries)}) against "
          f"x{1 + plan.promote_tolerance:g} and z <= -({shown(plan.regressed_boundaries)}) against "
          f"x{1 + plan.regressed_tolerance:g}\n")  # fmt: skip
    print(HEADER)
    print("-" * len(HEADER))
    started = time.monotonic()
    for index, cell in enumerate(cells):
        scenario, canary, pods, every = SCENARIOS[cell.scenario], cell.canary, cell.pods, cell.every
        regressed = simulate(rng, scenario, args.runs, canary, regressed=True, pods=pods)
        healthy = simulate(rng, scenario, args.runs, canary, regressed=False, pods=pods)
        if args.learned and index < skipped:
            continue
        methods: list[tuple[str, Decider]] = [(f"kvcal rank (operator, {cell.spec_name})", operator_decider(cell.spec))]
        if cell.learned:
            history = np.random.default_rng([args.seed, 2, index])  # draws of their own: the rollouts' stay as they are
            for sim in (regressed, healthy):
                learn_history(history, scenario, sim, canary, pods, HISTORY_INTERVALS)
            methods.append(("kvcal rank, noise learned", operator_decider(cell.spec, learned=True)))
        if args.recheck:
            (method, decider), *_ = methods
            print(row(scenario.name, canary, pods, method, evaluate(decider, regressed, healthy, args.runs)))
            continue
        if every:
            nominal = histogram_quantile(QUANTILE, healthy.baseline.pooled[:, -1].sum(axis=0))
            methods += [
                ("kvcal quantile (operator)", operator_decider(QUANTILE_TEST)),
                ("Flagger-like p95 <= nominal x1.1", flagger_decider(nominal * 1.10)),
                ("oracle: t-test on raw log TTFT", oracle_decider(RANK)),
            ]
        methods += [
            ("oracle, the pods' noise estimated", oracle_decider(cell.spec, pods, "estimated")),
            ("oracle, the pods' noise known", oracle_decider(cell.spec, pods, "known")),
        ]
        for method, decider in methods:
            print(row(scenario.name, canary, pods, method, evaluate(decider, regressed, healthy, args.runs)),
                  flush=True)  # fmt: skip
        if every or cell.learned or cell in (NOISE_ROWS[-1], SIZING_ROWS[-1], ITL_ROWS[2], ONE_POD_ROWS[-1],
                                             GOAL_ROWS[1]):  # fmt: skip
            print()
    print(
        "\ndetect<=3, <=10, <=15: regressed canaries rolled back within 3, 10 and 15 intervals; promoted regr.: "
        "regressed canaries promoted; false: healthy canaries rolled back as slower (or by a Flagger-like "
        "threshold); too few: healthy canaries rolled back for too few requests (InconclusiveLimit); undecided: "
        "healthy canaries whose rank test made its last look undecided (onUndecided: pause waits for a person, "
        "rollback rolls them back: add it to false); "
        f"promoted: healthy canaries promoted within {MAX_INTERVALS} intervals. ({time.monotonic() - started:.0f}s)"
    )


if __name__ == "__main__":
    main()
