"""Group-sequential boundaries (kvcal.core.sequential): the published Pocock and O'Brien-Fleming constants, and the
error of the rank test's default design by simulation of the pooled statistic over the looks."""

from statistics import NormalDist

import numpy as np
import pytest

from kvcal.core.sequential import MAX_EXACT_LOOKS, boundaries, decision_probability

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


@pytest.mark.parametrize("shape", [0.0, 0.25])
def test_type_one_error_over_the_looks_is_alpha_by_simulation(shape: float) -> None:
    """The default spec's counters (failureLimit 1: 2 Failed looks; successfulIntervals 5: 5 in a row) on 10 looks:
    200,000 simulated steps decide at the boundary in alpha = 10% of them (simulation's standard error 0.07%)."""
    looks, paths = 10, 200_000
    z = pooled_z(np.random.default_rng(2026), paths, looks)
    rollback = np.array(boundaries(0.10, looks, 2, consecutive=False, shape=shape))
    rolled_back = (np.cumsum(z >= rollback, axis=1)[:, -1] >= 2).mean()
    promote = np.array(boundaries(0.10, looks, 5, consecutive=True, shape=shape))
    run = np.zeros(paths, dtype=int)
    promoted = np.zeros(paths, dtype=bool)
    for look in range(looks):
        run = np.where(z[:, look] <= -promote[look], run + 1, 0)  # Z is symmetric under H0
        promoted |= run >= 5
    assert rolled_back == pytest.approx(0.10, abs=0.003)
    assert promoted.mean() == pytest.approx(0.10, abs=0.003)
    # The Markov design it replaces erred far less than allowed at its boundary: power thrown away.
    markov = NormalDist().inv_cdf(1 - 0.10 * 2 / looks)
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
