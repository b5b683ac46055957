"""`kvcal plan`: the rank test's likely ends with the noise learned from the baseline's history (kvcal.sizing)."""

import pytest

from kvcal.core.analysis.fleetnoise import FleetNoise, noise_status
from kvcal.ctl import render_status
from kvcal.models.spec import AnalysisSpec, LatencyCheck
from kvcal.sizing import outlook, render_plan

SPEC = AnalysisSpec(latency=[LatencyCheck(metric="ttft")])
CHECK = SPEC.latency[0]
# A 9-pod fleet at ~300 requests per pod and interval, lognormal TTFT on vLLM's buckets (the benchmark's): own load
# 5% and node offsets 2% on the effect scale (x 0.56), a 10% slowdown's effect 0.047.
QUIET = FleetNoise(node=1.3e-4, own=0.0, node_degrees=8, own_degrees=760, pods=9, intervals=96, requests=300,
                   slowdown=0.047)  # fmt: skip
NOISY = FleetNoise(node=1.3e-4, own=8e-4, node_degrees=8, own_degrees=760, pods=9, intervals=96, requests=300,
                   slowdown=0.047)  # fmt: skip


def test_quiet_pods_catch_a_regression_within_a_few_intervals() -> None:
    """About the benchmark's rank test with the learned noise in today's conditions (92% within 3 intervals, 95% within
    the step): the canary's node offset alone hides the rest, for anyone."""
    seen = outlook(QUIET, CHECK, SPEC, baseline_pods=9, canary_pods=1, weight=10, runs=1000)
    assert seen.caught_by_look[2] >= 0.80
    assert (seen.intervals_to_catch() or 99) <= 8
    assert seen.healthy_promoted >= 0.95
    assert seen.regression_promoted <= 0.01 and seen.healthy_rolled_back <= 0.01


def test_more_canary_pods_average_their_own_load_away() -> None:
    """With own load 5% one canary pod leaves many rollouts undecided; four pods at the same traffic catch more,
    sooner, and promote more healthy canaries."""
    one = outlook(NOISY, CHECK, SPEC, baseline_pods=9, canary_pods=1, weight=10, runs=1000)
    four = outlook(NOISY, CHECK, SPEC, baseline_pods=9, canary_pods=4, weight=10, runs=1000)
    assert four.caught_by_look[-1] > one.caught_by_look[-1] + 0.05
    assert four.healthy_promoted > one.healthy_promoted
    assert (four.intervals_to_catch() or 99) <= (one.intervals_to_catch() or 99)


def test_the_outlook_is_seeded() -> None:
    assert outlook(NOISY, CHECK, SPEC, baseline_pods=9, canary_pods=1, weight=10, runs=200) == outlook(
        NOISY, CHECK, SPEC, baseline_pods=9, canary_pods=1, weight=10, runs=200
    )


def kvcalibration(noise: list[dict[str, object]]) -> dict[str, object]:
    return {
        "metadata": {"name": "llm", "namespace": "serving"},
        "spec": {"analysis": {"latency": [{"metric": "ttft"}, {"metric": "itl"}]}},
        "status": {"phase": "Deploying", "noise": noise},
    }


def test_plan_prints_a_row_per_canary_size_and_says_what_it_lacks() -> None:
    learned = noise_status("ttft", NOISY, "2026-12-07T00:00:00Z").to_wire()
    short = noise_status("itl", "history: 1 baseline pod(s) seen", "2026-12-07T00:00:00Z").to_wire()
    text = render_plan(kvcalibration([learned, short]), [1, 2])
    lines = text.splitlines()
    assert lines[0].startswith("ttft: noise learned from 96 intervals of 9 baseline pods")
    assert "300 requests per pod and interval; 9 baseline pods, first step" in lines[0]
    assert "+15% rolled back <=3" in lines[1]
    assert [line.split()[0] for line in lines[2:4]] == ["1", "2"]
    assert lines[4] == (
        "itl: no learned noise: history: 1 baseline pod(s) seen: the rank test estimates the pods' noise in each step"
    )


@pytest.mark.parametrize("noise", [[], None])
def test_plan_without_history_says_so(noise: list[dict[str, object]] | None) -> None:
    assert render_plan(kvcalibration(noise or []), [1]).splitlines() == [
        "ttft: no learned noise: not learned yet (status.noise)",
        "itl: no learned noise: not learned yet (status.noise)",
    ]


def test_status_shows_the_noise_used() -> None:
    learned = noise_status("ttft", NOISY, "2026-12-07T00:00:00Z").to_wire()
    text = render_status(kvcalibration([learned]))
    assert "Latency noise (kvcal plan sizes the canary with it)" in text
    assert "ttft: learned at 2026-12-07T00:00:00Z: noise learned from 96 intervals of 9 baseline pods" in text
