"""Power and false-rollback rate of kvcal's canary analysis vs a Flagger-like fixed threshold (seeded simulation).

Each simulated rollout runs analysis intervals of 60 s until the analysis passes, fails, or MAX_INTERVALS pass:
- traffic: ``rps`` requests/s on the service, ``weight`` % to the canary; per-interval counts are Poisson;
- TTFT per request: lognormal (median 0.2 s, sigma 0.5), times a per-interval load factor shared by both sides
  (lognormal sigma 0.15: load spikes move both), times a per-rollout canary pod offset (lognormal sigma 0.02:
  a different node); a regression multiplies the canary's TTFT by 1.15 (p95 +15%);
- p95 comes from vLLM's TTFT histogram buckets over the query window (one interval, or since the analysis started
  capped at 3 intervals: kvcal's query_window_seconds), estimated by Prometheus' histogram_quantile (linear inside
  a bucket) or by kvcal's quantile_from_buckets (probit-log inside the bucket; exact for a lognormal — the
  ``--tail`` option adds a non-lognormal queueing tail to check that this is not the only reason it works).
kvcal decides with its real core (kvcal.core.analysis.assess_latency + assess_run, the spec's defaults unless the
row says otherwise). The Flagger-like check compares the canary's p95 alone with a fixed maximum (the nominal
baseline p95 x 1.10, or x 1.25) and rolls back after ``threshold`` failed checks, promoting after 5 passed ones.

Run: .venv/bin/python benchmarks/bench_analysis.py [--runs 1000] [--seed 0]
"""

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from kvcal.core.analysis import RequestCounts, assess_latency, assess_run, quantile_from_buckets
from kvcal.models.spec import AnalysisSpec, LatencyCheck
from kvcal.models.status import AnalysisStatus

TTFT_BUCKETS = np.array([0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                         20.0, 40.0, 80.0, 160.0, 640.0, 2560.0])  # fmt: skip
MEDIAN, SIGMA, LOAD_SIGMA, POD_SIGMA = 0.2, 0.5, 0.15, 0.02
REGRESSION = 1.15
QUANTILE = 0.95
INTERVAL_SECONDS = 60
MAX_INTERVALS = 15
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Traffic:
    rps: float
    weight: int  # % to the canary

    def __str__(self) -> str:
        n = self.rps * self.weight / 100 * INTERVAL_SECONDS
        return f"{self.rps:g} rps, {self.weight}% canary (~{n:.0f} req/interval)"


@dataclass(frozen=True)
class Latency:
    tail_fraction: float = 0.0  # share of requests that also wait in a queue
    tail_mean: float = 0.3  # mean of that exponential wait, seconds

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        samples = np.exp(rng.normal(0.0, SIGMA, size)) * MEDIAN
        if self.tail_fraction:
            samples += (rng.random(size) < self.tail_fraction) * rng.exponential(self.tail_mean, size)
        return samples

    def nominal_p95(self) -> float:
        return float(np.quantile(self.draw(np.random.default_rng(12345), 400_000), QUANTILE))


def bucket_counts(rng: np.random.Generator, latency: Latency, n: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Histogram bucket counts (runs x intervals x buckets+1) of TTFTs, n[r, i] samples each."""
    runs, intervals = n.shape
    total = int(n.sum())
    owner = np.repeat(np.arange(runs * intervals), n.ravel())
    samples = latency.draw(rng, total) * scale.ravel()[owner]
    idx = np.searchsorted(TTFT_BUCKETS, samples, side="left")  # le semantics: value <= bound
    counts = np.zeros((runs * intervals, len(TTFT_BUCKETS) + 1), dtype=np.int64)
    np.add.at(counts, (owner, idx), 1)
    return counts.reshape(runs, intervals, -1)


def histogram_quantile(q: float, counts: np.ndarray) -> float:
    """Prometheus' histogram_quantile over non-cumulative bucket counts (last one is +Inf)."""
    total = counts.sum()
    if total == 0:
        return math.nan
    cumulative = np.cumsum(counts)
    rank = q * total
    b = int(np.searchsorted(cumulative, rank, side="left"))
    if b >= len(TTFT_BUCKETS):
        return float(TTFT_BUCKETS[-1])
    lower = 0.0 if b == 0 else float(TTFT_BUCKETS[b - 1])
    below = 0 if b == 0 else int(cumulative[b - 1])
    return float(lower + (float(TTFT_BUCKETS[b]) - lower) * (rank - below) / max(int(counts[b]), 1))


def kvcal_quantile(q: float, counts: np.ndarray) -> float:
    cumulative = np.cumsum(counts)
    points = [(float(le), float(c)) for le, c in zip(TTFT_BUCKETS, cumulative[:-1], strict=True)]
    value = quantile_from_buckets(q, [*points, (math.inf, float(cumulative[-1]))])
    return math.nan if value is None else value


Estimator = Callable[[float, np.ndarray], float]


@dataclass
class Simulation:
    base_counts: np.ndarray  # runs x intervals x buckets
    canary_counts: np.ndarray
    n_base: np.ndarray
    n_canary: np.ndarray

    def window(self, run: int, interval: int, width: int, estimator: Estimator) -> tuple[float, float, float, float]:
        lo = max(0, interval - width + 1)
        b = self.base_counts[run, lo : interval + 1].sum(axis=0)
        c = self.canary_counts[run, lo : interval + 1].sum(axis=0)
        return estimator(QUANTILE, b), estimator(QUANTILE, c), float(b.sum()), float(c.sum())


def simulate(rng: np.random.Generator, latency: Latency, runs: int, traffic: Traffic, regression: float) -> Simulation:
    canary_rate = traffic.rps * traffic.weight / 100 * INTERVAL_SECONDS
    n_canary = rng.poisson(canary_rate, (runs, MAX_INTERVALS))
    n_base = rng.poisson(traffic.rps * INTERVAL_SECONDS - canary_rate, (runs, MAX_INTERVALS))
    load = np.exp(rng.normal(0.0, LOAD_SIGMA, (runs, MAX_INTERVALS)))
    pod = np.exp(rng.normal(0.0, POD_SIGMA, (runs, 1)))
    return Simulation(
        base_counts=bucket_counts(rng, latency, n_base, load),
        canary_counts=bucket_counts(rng, latency, n_canary, load * pod * regression),
        n_base=n_base,
        n_canary=n_canary,
    )


Decider = Callable[[Simulation, int], tuple[str, int]]  # -> (outcome, intervals used)


def kvcal_decider(spec: AnalysisSpec, width: int, estimator: Estimator = kvcal_quantile) -> Decider:
    """kvcal's core decides; the window grows with the analysis up to ``width`` intervals (query_window_seconds)."""
    check = spec.latency[0]

    def roll_out(sim: Simulation, run: int) -> tuple[str, int]:
        status = AnalysisStatus()
        for interval in range(MAX_INTERVALS):
            baseline, canary, n_base, n_canary = sim.window(run, interval, min(interval + 1, width), estimator)
            requests = RequestCounts(n_base, n_canary)
            measurement = assess_latency(
                check, baseline, canary, requests=requests, min_requests=spec.min_requests, at=f"t{interval}"
            )
            verdict = assess_run(spec, status, [measurement], NOW)
            status = verdict.status
            if verdict.outcome != "Running":
                return verdict.outcome, interval + 1
        return "Undecided", MAX_INTERVALS

    return roll_out


def flagger_decider(max_p95: float, threshold: int = 2, iterations: int = 5, min_requests: int = 50) -> Decider:
    def roll_out(sim: Simulation, run: int) -> tuple[str, int]:
        failed = passed = 0
        for interval in range(MAX_INTERVALS):
            _, canary, _, n_canary = sim.window(run, interval, 1, histogram_quantile)
            if n_canary < min_requests or math.isnan(canary):
                continue  # Flagger skips a check without data ("no values found" halts, it does not pass)
            if canary > max_p95:
                failed += 1
                if failed >= threshold:  # Flagger's own threshold: rolls back on reaching it
                    return "Failed", interval + 1
            else:
                passed += 1
                if passed >= iterations:
                    return "Passed", interval + 1
        return "Undecided", MAX_INTERVALS

    return roll_out


def evaluate(decider: Decider, regressed: Simulation, healthy: Simulation, runs: int) -> dict[str, float]:
    detect3 = detect = false = passed_ok = 0
    intervals: list[int] = []
    for r in range(runs):
        outcome, used = decider(regressed, r)
        detect += outcome == "Failed"
        detect3 += outcome == "Failed" and used <= 3
        if outcome == "Failed":
            intervals.append(used)
        outcome, _ = decider(healthy, r)
        false += outcome == "Failed"
        passed_ok += outcome == "Passed"
    return {
        "detect3": 100 * detect3 / runs,
        "detect": 100 * detect / runs,
        "false": 100 * false / runs,
        "promoted": 100 * passed_ok / runs,
        "intervals": float(np.mean(intervals)) if intervals else math.nan,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tail", type=float, default=0.0, help="share of requests with an exponential queue wait")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    latency = Latency(tail_fraction=args.tail)
    nominal = latency.nominal_p95()
    defaults = AnalysisSpec(latency=[LatencyCheck(metric="ttft")])
    # A threshold midway between "no change" and the regression to catch (x1.15) splits the noise evenly.
    tighter = AnalysisSpec(latency=[LatencyCheck(metric="ttft", max_regression=0.08)])
    methods: list[tuple[str, Decider]] = [
        ("kvcal, histogram_quantile, window 1", kvcal_decider(defaults, 1, histogram_quantile)),
        ("kvcal defaults (buckets, window <=3)", kvcal_decider(defaults, 3)),
        ("kvcal maxRegression 0.08", kvcal_decider(tighter, 3)),
        ("Flagger-like max = nominal p95 x1.10", flagger_decider(nominal * 1.10)),
        ("Flagger-like max = nominal p95 x1.25", flagger_decider(nominal * 1.25)),
    ]
    scenarios = [Traffic(20, 10), Traffic(50, 10), Traffic(100, 10), Traffic(200, 10), Traffic(50, 50)]
    print(f"{args.runs} rollouts per cell, seed {args.seed}; TTFT lognormal median {MEDIAN}s sigma {SIGMA}, "
          f"+ queue wait on {args.tail:.0%} (exp mean {latency.tail_mean}s), nominal p95 {nominal:.3f}s; "
          f"shared load sigma {LOAD_SIGMA}, canary pod offset sigma {POD_SIGMA}; regression x{REGRESSION} on the "
          f"canary; interval {INTERVAL_SECONDS}s, p95 via vLLM histogram buckets")  # fmt: skip
    print("goal: detection within 3 intervals >= 95%, false rollbacks <= 2%\n")
    header = f"{'traffic':<36} {'method':<38} {'detect<=3':>9} {'detect':>7} {'false':>6} {'promote':>8} {'ivl':>5}"
    print(header)
    print("-" * len(header))
    started = time.monotonic()
    for traffic in scenarios:
        regressed = simulate(rng, latency, args.runs, traffic, REGRESSION)
        healthy = simulate(rng, latency, args.runs, traffic, 1.0)
        for name, decider in methods:
            s = evaluate(decider, regressed, healthy, args.runs)
            goal = "  ok" if s["detect3"] >= 95 and s["false"] <= 2 else ""
            print(f"{traffic!s:<36} {name:<38} {s['detect3']:8.1f}% {s['detect']:6.1f}% {s['false']:5.1f}% "
                  f"{s['promoted']:7.1f}% {s['intervals']:5.2f}{goal}")  # fmt: skip
        print()
    print(
        f"detect<=3: regressed canary rolled back within 3 intervals; false: healthy canary rolled back; "
        f"promote: healthy canary promoted; ivl: mean intervals to a rollback. ({time.monotonic() - started:.0f}s)"
    )


if __name__ == "__main__":
    main()
