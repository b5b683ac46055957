"""Group-sequential boundaries for a statistic pooled since the step began, designed for the counters that act on
its looks (docs/concepts.md, "The latency test").

Model: the z statistic at look k of K is Z_k = S_k / sqrt(k), S_k a sum of k independent N(0, 1) increments (each
interval adds about as many requests, so Z_k and Z_j correlate as sqrt(k / j)). Look k "rejects" when Z_k >= b_k.
The counters act on rejecting looks in one of two ways:
- ``consecutive=False``: the decision is taken at the ``needed``-th rejecting look (a rollback after failureLimit + 1
  Failed intervals);
- ``consecutive=True``: it is taken at ``needed`` rejecting looks in a row (a promotion after successfulIntervals).
``boundaries`` solves b_k = c x (k / K)^shape for P(decision within K looks) = alpha at the boundary of H0 (with
``needed`` 1: Pocock's boundary at shape 0, O'Brien and Fleming's at -1/2), by recursive numerical integration of
S_k's distribution on grids with a cell edge on each look's boundary (Armitage, McPherson and Rowe 1969).
"""

import math
from collections.abc import Sequence
from functools import lru_cache
from operator import mul
from statistics import NormalDist

# Grid step of S_k and half-width in standard deviations: boundaries within 2e-3 above those at step 0.05.
GRID_STEP = 0.2
GRID_HALF_WIDTH_SD = 7.0
# Above this many looks the exact computation grows too slow for a reconcile; Markov's bound (conservative) is used.
MAX_EXACT_LOOKS = 20
_SQRT_2 = math.sqrt(2)


def decision_probability(boundaries: Sequence[float], needed: int, *, consecutive: bool) -> float:
    """P(the counters decide within the looks) when look k rejects at Z_k >= ``boundaries[k - 1]`` under H0."""
    looks = len(boundaries)
    if needed > looks:
        return 0.0
    decided = 0.0
    # states[r]: the mass of S_k in each cell of this look's grid, over paths with r rejecting looks so far (in a row
    # if consecutive); mass that reaches ``needed`` leaves as decided.
    grid = _grid(boundaries[0], 1)
    states = {0: [_cell_probability(x) for x in grid]}
    for look in range(1, looks + 1):
        boundary = boundaries[look - 1] * math.sqrt(look)
        first_rejecting = next((i for i, x in enumerate(grid) if x >= boundary), len(grid))
        classified: dict[int, list[float]] = {}
        for count, masses in states.items():
            below = masses[:first_rejecting] + [0.0] * (len(grid) - first_rejecting)
            above = [0.0] * first_rejecting + masses[first_rejecting:]
            if count + 1 >= needed:
                decided += sum(above)
            else:
                _add(classified, count + 1, above)
            _add(classified, 0 if consecutive else count, below)
        if look == looks:
            break
        next_grid = _grid(boundaries[look], look + 1)
        states = {count: _propagate(masses, grid, next_grid) for count, masses in classified.items()}
        grid = next_grid
    return decided


@lru_cache(maxsize=256)
def boundaries(alpha: float, looks: int, needed: int, *, consecutive: bool, shape: float = 0.0) -> tuple[float, ...]:
    """Per-look boundaries c x (k / looks)^shape (Wang and Tsiatis' family: 0 is Pocock's constant boundary, a
    positive shape lowers the early looks' boundaries and raises the late ones'), c >= 0 solved so the decision
    probability over ``looks`` looks is ``alpha``. Beyond MAX_EXACT_LOOKS looks: Markov's inequality on the number
    of rejecting looks (each at alpha x needed / looks), valid for any dependence between looks and conservative."""
    markov = _upper_quantile(min(0.5, alpha * needed / looks))
    if looks > MAX_EXACT_LOOKS:
        return (markov,) * looks
    profile = [(look / looks) ** shape for look in range(1, looks + 1)]

    def gap(scale: float) -> float:  # nearly linear in the scale on the probit scale; falls as the scale grows
        probability = decision_probability([scale * each for each in profile], needed, consecutive=consecutive)
        return _upper_quantile(alpha) - _upper_quantile(min(max(probability, 1e-12), 1 - 1e-12))

    # Every boundary at or above Markov's errs on the safe side (gap <= 0); 0 is the lowest boundary allowed.
    low, high = 0.0, markov / min(profile)
    gap_low, gap_high = gap(low), gap(high)
    if gap_low <= 0:
        high = low
    while high - low > 1e-4:
        guess = low + (high - low) * gap_low / (gap_low - gap_high) if gap_low > gap_high else (low + high) / 2
        guess = min(max(guess, low + 1e-5), high - 1e-5)
        gap_guess = gap(guess)
        if abs(gap_guess) < 1e-5:
            high = guess
            break
        if gap_guess > 0:
            low, gap_low = guess, gap_guess
        else:
            high, gap_high = guess, gap_guess
    return tuple(high * each for each in profile)


def _grid(z_boundary: float, look: int) -> list[float]:
    """Cell midpoints for S_look with a cell edge on the look's boundary: no cell straddles it."""
    boundary = z_boundary * math.sqrt(look)
    half_width = GRID_HALF_WIDTH_SD * math.sqrt(look)
    first = math.floor((-half_width - boundary) / GRID_STEP)
    last = math.ceil((half_width - boundary) / GRID_STEP)
    return [boundary + (i + 0.5) * GRID_STEP for i in range(first, last)]


def _propagate(masses: list[float], grid: list[float], next_grid: list[float]) -> list[float]:
    """S_{k+1} = S_k + N(0, 1), each cell's mass moved from its midpoint into the next grid's cells. Both grids
    share the step, so the transition is one vector indexed by the difference of positions."""
    nonzero = [i for i, mass in enumerate(masses) if mass > 1e-300]
    if not nonzero:
        return [0.0] * len(next_grid)
    start, stop = nonzero[0], nonzero[-1] + 1
    values = masses[start:stop]
    width = stop - start
    # next_grid[j] - grid[start + i] = offset + (j - i) x step
    offset = next_grid[0] - grid[start]
    last = len(next_grid) - 1
    # reversed_kernel[t] is the transition for j - i = last - t: out[j] takes reversed_kernel[last - j:][:width]
    reversed_kernel = [_cell_probability(offset + (last - t) * GRID_STEP) for t in range(last + width)]
    return [sum(map(mul, values, reversed_kernel[last - j : last - j + width])) for j in range(len(next_grid))]


def _add(states: dict[int, list[float]], count: int, masses: list[float]) -> None:
    if count in states:
        states[count] = [mine + theirs for mine, theirs in zip(states[count], masses, strict=True)]
    else:
        states[count] = masses


def _cell_probability(center: float) -> float:
    """P(N(0, 1) falls in the cell of width GRID_STEP around ``center``), accurate far in either tail."""
    low, high = abs(center) - GRID_STEP / 2, abs(center) + GRID_STEP / 2
    return (math.erfc(low / _SQRT_2) - math.erfc(high / _SQRT_2)) / 2


def _upper_quantile(tail: float) -> float:
    return NormalDist().inv_cdf(1 - tail)
