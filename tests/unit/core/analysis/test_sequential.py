"""Group-sequential boundaries (kvcal.core.analysis.sequential): the published Pocock and O'Brien-Fleming constants, and
the error of the rank test's default design by simulation of the pooled statistic over the looks."""

from collections.abc import Callable
from statistics import NormalDist

import numpy as np
import pytest

from kvcal.core.analysis.sequential import MAX_EXACT_LOOKS, boundaries, decision_probability

# Jennison and Turnbull (2000), Tables 2.1 and 2.3: two-sided alpha 0.05 constants for K = 1..5 and 10 equally
# spaced looks (Pocock: Z_k >= c at every look; O'Brien-Fleming: Z_k >= c sqrt(K / k)). One-sided 0.025 crosses
# the lower boundary too with probability < 1e-4, so the same constants hold to the tables' 3 decimals.
POCOCK = {1: 1.960, 2: 2.178, 3: 2.289, 4: 2.361, 5: 2.413, 10: 2.555}
OBRIEN_FLEMING = {1: 1.960, 2: 1.977, 3: 2.004, 4: 2.024, 5: 2.040, 10: 2.087}


@pytest.mark.parametrize("looks", sorted(POCOCK))
def test_single_crossing_boundaries_match_the_published_constants(looks: int) -> None:
    pocock = boundaries(0.025, looks, 1, consecutive=False)
    assert pocock == pytest.approx((POCOCK[looks],) * looks, abs=3e-3)
    obrien_fleming = boundaries(0.025, looks, 1, consecutive=False, shape=-0.5)
    assert obrien_fleming[-1] == pytest.approx(OBRIEN_FLEMING[looks], abs=3e-3)
    assert obrien_fleming[0] == pytest.approx(OBRIEN_FLEMING[looks] * looks**0.5, abs=1e-2)


def pooled_z(rng: np.random.Generator, paths: int, looks: int) -> np.ndarray:
    """Z_k = S_k / sqrt(k) of a statistic pooled since the first look, under H0 at its boundary."""
    return np.cumsum(rng.standard_normal((paths, looks)), axis=1) / np.sqrt(np.arange(1, looks + 1))


def error_rates(z: np.ndarray, shape: float) -> tuple[float, float]:
    """Shares of steps the default spec's counters roll back (2 Failed looks) and promote (5 Successful in a row)
    over 10 looks, each decision at its boundary (Z is symmetric under H0: Successful is Z_k <= -b_k)."""
    rollback = np.array(boundaries(0.10, 10, 2, consecutive=False, shape=shape))
    promote = np.array(boundaries(0.10, 10, 5, consecutive=True, shape=shape))
    rolled_back = np.cumsum(z >= rollback, axis=1)[:, -1] >= 2
    run = np.zeros(len(z), dtype=int)
    promoted = np.zeros(len(z), dtype=bool)
    for look in range(10):
        run = np.where(z[:, look] <= -promote[look], run + 1, 0)
        promoted |= run >= 5
    return float(rolled_back.mean()), float(promoted.mean())


@pytest.mark.parametrize("shape", [0.0, 0.25])
def test_type_one_error_over_the_looks_is_alpha_by_simulation(shape: float) -> None:
    """The default spec's counters (failureLimit 1: 2 Failed looks; successfulIntervals 5: 5 in a row) on 10 looks:
    200,000 simulated steps decide at the boundary in alpha = 10% of them (simulation's standard error 0.07%)."""
    z = pooled_z(np.random.default_rng(2026), 200_000, 10)
    rolled_back, promoted = error_rates(z, shape)
    assert rolled_back == pytest.approx(0.10, abs=0.003)
    assert promoted == pytest.approx(0.10, abs=0.003)
    # The Markov design it replaces erred far less than allowed at its boundary: power thrown away.
    markov = NormalDist().inv_cdf(1 - 0.10 * 2 / 10)
    assert (np.cumsum(z >= markov, axis=1)[:, -1] >= 2).mean() < 0.06


def test_more_needed_looks_lower_the_boundary_and_too_many_never_decide() -> None:
    once, twice = (boundaries(0.10, 10, needed, consecutive=False)[0] for needed in (1, 2))
    assert twice < once
    assert decision_probability([0.0] * 4, 5, consecutive=False) == 0.0  # 5 rejecting looks out of 4: never
    assert boundaries(0.10, 4, 5, consecutive=False) == (0.0,) * 4


def test_beyond_the_exact_range_markov_s_bound_is_used() -> None:
    looks = MAX_EXACT_LOOKS + 2
    expected = NormalDist().inv_cdf(1 - 0.10 * 3 / looks)
    assert boundaries(0.10, looks, 3, consecutive=False, shape=0.25) == pytest.approx((expected,) * looks)


@pytest.mark.parametrize(
    "traffic",
    [
        pytest.param(lambda rng: np.exp(rng.normal(0.0, 0.5, (100_000, 10))), id="random"),
        pytest.param(lambda rng: np.tile(np.linspace(1.0, 4.0, 10), (100_000, 1)), id="rising-4x"),
        pytest.param(lambda rng: np.tile(np.linspace(4.0, 1.0, 10), (100_000, 1)), id="falling-4x"),
    ],
)
def test_unequal_traffic_per_interval_moves_the_error_little(
    traffic: Callable[[np.random.Generator], np.ndarray],
) -> None:
    """The design assumes about equal requests per interval; the real correlations follow the pooled counts. With
    traffic varying (lognormal sigma 0.5) or trending 4x over the step, either error stays within 8%..11.5%."""
    rng = np.random.default_rng(5)
    requests = traffic(rng)
    z = np.cumsum(rng.standard_normal(requests.shape) * np.sqrt(requests), axis=1) / np.sqrt(requests.cumsum(axis=1))
    rolled_back, promoted = error_rates(z, 0.25)
    assert 0.08 <= rolled_back <= 0.115
    assert 0.08 <= promoted <= 0.115
