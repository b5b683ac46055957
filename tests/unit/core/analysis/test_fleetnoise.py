"""The baseline's noise learned from its history (kvcal.core.analysis.fleetnoise), on seeded histories drawn like
benchmarks/bench_analysis.py draws them: lognormal TTFT on vLLM's buckets, a load shared by every pod, each pod's node
offset and own per-interval load."""

import math

import numpy as np
import pytest
from benchmarks.bench_analysis import TTFT_BUCKETS, as_buckets

from kvcal.core.analysis.fleetnoise import (
    FEWEST_HISTORY_INTERVALS,
    FleetNoise,
    canary_noisier,
    from_status,
    learn_noise,
    learned_z,
    noise_status,
)
from kvcal.core.analysis.histograms import cumulative_counts
from kvcal.core.analysis.podspread import interval_spread
from kvcal.core.analysis.ranktest import assess_rank
from kvcal.models.spec import AnalysisSpec, LatencyCheck


def history(
    seed: int, *, pods: int = 9, intervals: int = 96, requests: int = 300, own: float = 0.05, node: float = 0.02
) -> list[dict[str, list[tuple[float, float]]]]:
    """Each sampled interval's bucket counts per pod (``increase()`` over one interval)."""
    rng = np.random.default_rng(seed)
    nodes = np.exp(rng.normal(0.0, node, pods))
    out = []
    for _ in range(intervals):
        load = math.exp(rng.normal(0.0, 0.15))
        interval = {}
        for pod in range(pods):
            scale = 0.2 * load * nodes[pod] * math.exp(rng.normal(0.0, own))
            samples = np.exp(rng.normal(0.0, 0.5, rng.poisson(requests))) * scale
            counts = np.bincount(np.searchsorted(TTFT_BUCKETS, samples), minlength=len(TTFT_BUCKETS) + 1)
            interval[f"pod-{pod}"] = as_buckets(counts, TTFT_BUCKETS)
        out.append(interval)
    return out


def learned(**kwargs: float) -> FleetNoise:
    noise = learn_noise(history(**kwargs))  # type: ignore[arg-type]
    assert isinstance(noise, FleetNoise), noise
    return noise


def test_own_load_is_learned_through_the_requests_noise() -> None:
    """300 requests per pod and interval against 30,000 (where the requests' own noise is nearly nil): the same own
    load, on the rank test's effect scale, within 20%; and a quiet fleet's own load reads near nothing."""
    typical = learned(seed=1, own=0.10)
    exact = learned(seed=1, own=0.10, requests=30_000)
    assert typical.own == pytest.approx(exact.own, rel=0.20)
    assert typical.own_degrees == 8 * 95
    quiet = learned(seed=2, own=0.0)
    assert quiet.own < typical.own / 20


def test_node_offsets_are_learned_with_the_pods_degrees_of_freedom() -> None:
    """The pods' offsets as the pods drew them (their spread on the effect scale, read with nearly no request noise),
    at pods - 1 degrees of freedom; and what sizing needs: requests per pod and the effect of a 10% slowdown (a
    lognormal of sigma 0.5 on vLLM's buckets: about 0.1 x 0.56, less what the buckets' ties hide)."""
    noise = learned(seed=3, node=0.04, own=0.05)
    exact = learned(seed=3, node=0.04, own=0.05, requests=30_000)
    assert noise.node_degrees == 8 and noise.pods == 9 and noise.intervals == 96
    assert noise.node == pytest.approx(exact.node, rel=0.25)
    assert noise.requests == pytest.approx(300, rel=0.02)
    assert 0.03 < noise.slowdown < 0.056


def test_pooled_variance_averages_own_load_over_the_step() -> None:
    noise = FleetNoise(node=1e-4, own=8e-4, node_degrees=8, own_degrees=760, pods=9, intervals=96)
    assert noise.pooled_variance(1) == pytest.approx(9e-4)
    assert noise.pooled_variance(4) == pytest.approx(3e-4)


def test_learned_z_reads_as_normal_when_the_history_is_long() -> None:
    """With own load at hundreds of degrees and nodes small beside the requests, the verdict's t has many degrees of
    freedom; a node variance at 2 pods (1 degree) and dominant makes it a t at a few."""
    wide = FleetNoise(node=1e-5, own=8e-4, node_degrees=8, own_degrees=760, pods=9, intervals=96)
    z, degrees = learned_z(0.05, 0.01, wide, 1.11, 5)
    assert degrees > 100
    assert z == pytest.approx(0.05 / math.sqrt(0.01**2 + 1.11 * wide.pooled_variance(5)), rel=0.01)
    narrow = FleetNoise(node=1e-3, own=1e-5, node_degrees=1, own_degrees=95, pods=2, intervals=96)
    z_narrow, degrees_narrow = learned_z(0.05, 0.01, narrow, 1.5, 5)
    assert degrees_narrow < 3
    assert abs(z_narrow) < 0.05 / math.sqrt(0.01**2 + 1.5 * narrow.pooled_variance(5))  # t's tail read as a normal


@pytest.mark.parametrize(
    ("pods", "intervals", "why"),
    [(1, 96, "two pods answering"), (9, FEWEST_HISTORY_INTERVALS - 1, f"{FEWEST_HISTORY_INTERVALS} needed")],
    ids=["one-pod", "short"],
)
def test_a_history_that_cannot_tell_says_why(pods: int, intervals: int, why: str) -> None:
    result = learn_noise(history(seed=4, pods=pods, intervals=intervals))  # type: ignore[arg-type]
    assert isinstance(result, str) and why in result, result


def test_pods_restarted_in_the_history_count_as_more_pods() -> None:
    """A pod replaced during the lookback is a pod of its own (its name): its node is one more sample."""
    past = history(seed=5, pods=4, intervals=48)
    renamed = [{f"{name}-new": buckets for name, buckets in interval.items()} for interval in history(seed=6, pods=4)]
    noise = learn_noise([*past, *renamed[:48]])  # type: ignore[arg-type]
    assert isinstance(noise, FleetNoise) and noise.pods == 8 and noise.node_degrees == 7


def test_the_guard_sees_a_canary_noisier_than_its_baseline() -> None:
    """The step's intervals of a canary with 4x its baseline's own-load variance trip the guard; a canary like its
    baseline pods mostly does not (GUARD_ALPHA)."""
    noise = learned(seed=7, own=0.05)

    def draw(rng: np.random.Generator, requests: int, scale: float) -> list[tuple[float, float]]:
        samples = np.exp(rng.normal(0.0, 0.5, requests)) * scale
        counts = np.bincount(np.searchsorted(TTFT_BUCKETS, samples), minlength=len(TTFT_BUCKETS) + 1)
        return cumulative_counts(as_buckets(counts, TTFT_BUCKETS))

    def intervals(own: float, seed: int) -> tuple[list[list[tuple[float, float]]], list[list[tuple[float, float]]]]:
        """9 intervals of a step: the baseline pool's 2,700 requests and the canary's 300, under a shared load."""
        rng = np.random.default_rng(seed)
        base, canary = [], []
        for _ in range(9):
            load = 0.2 * math.exp(rng.normal(0.0, 0.15))
            base.append(draw(rng, 2700, load))
            canary.append(draw(rng, 300, load * math.exp(rng.normal(0.0, own))))
        return base, canary

    tripped = {}
    for own in (0.05, 0.20):
        hits = 0
        for seed in range(40):
            spread, _, _ = interval_spread(*intervals(own, seed))
            hits += canary_noisier(noise, spread, 1 / 9) is not None
        tripped[own] = hits / 40
    assert tripped[0.20] >= 0.8, tripped
    assert tripped[0.05] <= 0.25, tripped


def test_the_status_round_trip_keeps_what_the_test_uses() -> None:
    noise = learned(seed=8)
    status = noise_status("ttft", noise, "2026-12-07T00:00:00Z")
    assert status.source == "learned" and status.message and "9 baseline pods" in status.message
    assert from_status([status]) == {"ttft": noise}
    short = noise_status("itl", "history: 1 baseline pod(s) seen", "2026-12-07T00:00:00Z")
    assert short.source == "estimated" and from_status([short]) == {}


def test_the_measurement_names_the_noise_it_used() -> None:
    """A 9+1 step's look 4 with the learned noise: the message names it; the same look of a canary whose intervals
    vary far beyond it says the canary's own intervals measure its load instead."""
    noise = learned(seed=9, own=0.05)
    rng = np.random.default_rng(10)

    def draw(requests: int, scale: float) -> list[tuple[float, float]]:
        samples = np.exp(rng.normal(0.0, 0.5, requests)) * scale
        counts = np.bincount(np.searchsorted(TTFT_BUCKETS, samples), minlength=len(TTFT_BUCKETS) + 1)
        return as_buckets(counts, TTFT_BUCKETS)

    def step(canary_own: float) -> tuple[list[list[tuple[float, float]]], ...]:
        loads = [0.2 * math.exp(rng.normal(0.0, 0.15)) for _ in range(4)]
        base = [[draw(300, load) for load in loads] for _ in range(9)]  # per pod, per interval
        canary = [draw(300, load * math.exp(rng.normal(0.0, canary_own))) for load in loads]
        pooled_base = [pooled(pod) for pod in base]
        by_interval = [pooled([pod[i] for pod in base]) for i in range(4)]
        return pooled_base, [pooled(canary)], by_interval[1:], canary[1:]

    spec = AnalysisSpec(latency=[LatencyCheck(metric="ttft")])
    for canary_own, says in ((0.0, "noise learned from 96 intervals of 9 baseline pods"),
                             (0.5, "its own intervals measure it")):  # fmt: skip
        base, canary, base_intervals, canary_intervals = step(canary_own)
        measured = assess_rank(
            spec.latency[0], spec, (base[0], canary[0]), (base, canary), look=4, requests=None, at="t",
            intervals=(base_intervals, canary_intervals), noise=noise,
        )  # fmt: skip
        assert says in (measured.message or ""), measured.message


def pooled(histograms: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    return [(le, sum(each[i][1] for each in histograms)) for i, (le, _) in enumerate(histograms[0])]
