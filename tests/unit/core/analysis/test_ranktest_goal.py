"""The latency verdict's goals (issues #14 and #24), on the benchmark's own seeded simulation
(benchmarks/bench_analysis.py: lognormal TTFT, shared load drift, each pod's node offset and own per-interval load,
vLLM's TTFT buckets, ~300 canary requests per interval, the default spec).

- The guarantee: healthy canaries rolled back <= 1% and 15% regressions promoted <= 1%, in today's conditions
  (1 canary pod beside 9 baseline pods, node offsets sigma 2%) and with a noisy canary pod (its own load sigma 20%,
  nodes 5%, 4 baseline pods), where counting requests alone rolled back about one healthy canary in three.
- Detection where requests dominate: today's conditions catch three in four 15% regressions within 3 intervals
  (84% here). It was 95% when the verdict counted requests alone and held every decision at 10%; a canary pod's
  own node offset is real noise the verdict now includes, and the 0.5% test below rollbackAbove asks for more
  evidence. It was 64% while that test also took the noise floor (docs/operations.md, "Tuning the analysis", has the
  tables; issue #24 keeps the efficiency goal open).
- A slower inter-token latency at a GPU's speed is seen: the default noise floor is far below it.
- One baseline pod and one canary pod: the step's intervals show a pod's own noise where no other pod can.
- The efficiency goals are reached by sizing the canary: more canary pods at the same traffic."""

import numpy as np
import pytest
from benchmarks.bench_analysis import (
    HISTORY_INTERVALS,
    RANK,
    RANK_ITL,
    RANK_ITL_5MS,
    SCENARIOS,
    TODAY,
    Pods,
    evaluate,
    learn_history,
    operator_decider,
    oracle_decider,
    simulate,
)


@pytest.mark.parametrize(
    ("pods", "detect3"), [(TODAY, 75.0), (Pods(baseline=4, own=0.20, node=0.05), None)], ids=["today", "noisy-pod"]
)
def test_guarantee_and_detection_at_300_canary_requests_per_interval(pods: Pods, detect3: float | None) -> None:
    rng = np.random.default_rng(0)
    runs = 300
    regressed = simulate(rng, SCENARIOS["lognormal"], runs, 300, regressed=True, pods=pods)
    healthy = simulate(rng, SCENARIOS["lognormal"], runs, 300, regressed=False, pods=pods)
    result = evaluate(operator_decider(RANK), regressed, healthy, runs)
    assert result["false"] <= 1.0, result
    assert result["missed"] <= 1.0, result
    if detect3 is not None:
        assert result["detect3"] >= detect3, result
        assert result["promoted"] >= 97.0, result  # promotion stays possible: confident, not merely unrefuted


def test_the_efficiency_goal_is_the_price_of_estimating_the_pods_noise() -> None:
    """Where detection goes (docs/operations.md, "Tuning the analysis"): with a canary pod's own load at 5% per
    interval, node offsets at 2% and 4 baseline pods, the rank test's design on raw latencies reaches the issue's
    90% within 10 intervals only when told the pods' noise; estimating it from the pods there are (3 degrees of
    freedom) leaves a fraction of that, and both keep the guarantee."""
    rng = np.random.default_rng(0)
    runs = 300
    pods = Pods(baseline=4, own=0.05, node=0.02)
    regressed = simulate(rng, SCENARIOS["lognormal"], runs, 300, regressed=True, pods=pods)
    healthy = simulate(rng, SCENARIOS["lognormal"], runs, 300, regressed=False, pods=pods)
    known = evaluate(oracle_decider(RANK, pods, "known"), regressed, healthy, runs)
    estimated = evaluate(oracle_decider(RANK, pods, "estimated"), regressed, healthy, runs)
    for result in (known, estimated):
        assert result["false"] <= 1.0, result
        assert result["missed"] <= 1.0, result
    assert known["detect10"] >= 85.0, known
    assert estimated["detect10"] <= known["detect10"] / 2, (estimated, known)


def test_the_default_floor_lets_a_slower_itl_be_seen() -> None:
    """Inter-token latency at a GPU's ~12 ms on vLLM's ITL buckets (~3,000 tokens per canary interval, 9+1 pods): the
    default noise floor (0.5 ms) rolls back 15% slower ITLs and promotes none, and promotes healthy canaries (a
    quarter of the tokens sit in the first bucket, <= 10 ms, read as a lognormal's); the 5 ms default before it
    promised to pass whatever the ratio within 5 ms, so it rolled back none and promoted some."""
    rng = np.random.default_rng(0)
    runs = 100
    regressed = simulate(rng, SCENARIOS["itl"], runs, 3000, regressed=True)
    healthy = simulate(rng, SCENARIOS["itl"], runs, 3000, regressed=False)
    now = evaluate(operator_decider(RANK_ITL), regressed, healthy, runs)
    before = evaluate(operator_decider(RANK_ITL_5MS), regressed, healthy, runs)
    assert now["detect10"] >= 90.0 and now["missed"] <= 1.0 and now["false"] <= 1.0, now
    assert now["promoted"] >= 95.0, now  # the first bucket read as a lognormal's: a healthy canary is shown within
    assert before["detect10"] == 0.0 and before["missed"] >= 10.0, before


def test_one_pod_per_role_learns_its_noise_from_the_steps_intervals() -> None:
    """1 baseline pod and 1 canary pod with a noisy canary pod (own load 10%, nodes 5%): counting requests alone
    rolled back about a third of healthy canaries and promoted about a sixth of regressions; the step's intervals
    as replicates keep both near the guarantee (what stays with a node, no interval shows: regressions promoted may
    exceed 1% there). Quiet pods still decide, on later looks."""
    rng = np.random.default_rng(0)
    runs = 200
    for pods, quiet in ((Pods(baseline=1, own=0.10, node=0.05), False), (Pods(baseline=1), True)):
        regressed = simulate(rng, SCENARIOS["lognormal"], runs, 300, regressed=True, pods=pods)
        healthy = simulate(rng, SCENARIOS["lognormal"], runs, 300, regressed=False, pods=pods)
        result = evaluate(operator_decider(RANK), regressed, healthy, runs)
        assert result["false"] <= 1.0, result
        assert result["missed"] <= 3.0, result
        if quiet:
            assert result["detect10"] >= 90.0 and result["promoted"] >= 95.0, result


def test_more_canary_pods_reach_the_efficiency_goals() -> None:
    """The issue's efficiency goals at ~300 canary requests per interval, reached by sizing the canary (docs: "Sizing
    a canary"): in today's conditions 2 canary pods beside 9 catch >= 90% of 15% regressions within 3 intervals
    (1 pod: ~83%), and with a canary pod's own load at 5%, 4 canary pods beside 9 catch >= 90% within 10 (4+1:
    ~21%); both within the guarantee."""
    rng = np.random.default_rng(0)
    runs = 200
    for pods, goal in ((Pods(baseline=9, canary=2), "detect3"), (Pods(baseline=9, canary=4, own=0.05), "detect10")):
        regressed = simulate(rng, SCENARIOS["lognormal"], runs, 300, regressed=True, pods=pods)
        healthy = simulate(rng, SCENARIOS["lognormal"], runs, 300, regressed=False, pods=pods)
        result = evaluate(operator_decider(RANK), regressed, healthy, runs)
        assert result["false"] <= 1.0 and result["missed"] <= 1.0, result
        assert result[goal] >= 90.0, (goal, result)


@pytest.mark.parametrize(
    ("pods", "goal"), [(TODAY, "detect3"), (Pods(own=0.05), "oracle")], ids=["today", "own-load-5%"]
)
def test_the_noise_learned_from_history_decides_near_the_oracle(pods: Pods, goal: str) -> None:
    """The rank test with the noise learned from 96 sampled past intervals of the 9 baseline pods (issue goals, at
    ~300 canary requests per interval): the guarantee holds; in today's conditions it rolls back 15% regressions
    within 3 intervals about as often as a verdict told the pods' noise (92% in the benchmark; 82% estimated in the
    step); with each pod's own load at 5% it catches within 10 intervals, and promotes healthy canaries within 15,
    at least 85% as often as that oracle (91% and 95% in the benchmark's draws)."""
    rng = np.random.default_rng([0, 38])
    runs = 300
    regressed = simulate(rng, SCENARIOS["lognormal"], runs, 300, regressed=True, pods=pods)
    healthy = simulate(rng, SCENARIOS["lognormal"], runs, 300, regressed=False, pods=pods)
    history = np.random.default_rng([0, 38, 2])
    for sim in (regressed, healthy):
        learn_history(history, SCENARIOS["lognormal"], sim, 300, pods, HISTORY_INTERVALS)
    learned = evaluate(operator_decider(RANK, learned=True), regressed, healthy, runs)
    assert learned["false"] <= 1.0 and learned["missed"] <= 1.0, learned
    if goal == "detect3":
        assert learned["detect3"] >= 88.0 and learned["promoted"] >= 95.0, learned
        return
    known = evaluate(oracle_decider(RANK, pods, "known"), regressed, healthy, runs)
    assert learned["detect10"] >= 0.85 * known["detect10"], (learned, known)
    assert learned["promoted"] >= 0.85 * known["promoted"], (learned, known)
