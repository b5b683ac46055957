"""Does the canary get the share of requests its router was told to give it?

Each interval the Prometheus adapter already counts both roles' requests from vLLM's own counters (the ``requests``
measurement, core.analysis.promql's ``requests`` query). If every request went to the canary with probability w (the
weight kvcal set), the canary's count out of n is binomial(n, w). A share outside its 99.9% Wilson score interval, with
at least ``MIN_REQUESTS`` requests, is an Error measurement that says so: the router does not split traffic as set
(a Service that also selects the canary's pods, a gateway that ignores backendRef weights, an edit kvcal has not
seen yet), so nothing this interval measured can be trusted as a comparison at that weight. Never a pass, never a
Failed verdict on the canary itself.

With a mirror (the shadow stage: weight 0, a copy of mirror% of the baseline's requests sent to the canary, whose
answers nobody sees) the canary also counts the copies: of N user requests the baseline answers (1 - w)N, the
canary wN plus m(1 - w)N copies, so its expected share of all counted requests is (w + m(1 - w)) / (1 + m(1 - w)):
half at a 100% mirror, and 0 only without one.

Skipped under ``router: none`` (the canary gets no user traffic by design; the probes' and tests' load is all it
sees), when the counts are missing (the ``requests`` measurement is then Inconclusive already), and while the
interval's window still reaches back before the step's weight was set (a warmup shorter than the interval).
Requests kvcal's quality probes send reach each role once per probe, which moves the share towards 50%: with enough
user traffic that is noise, with almost none the interval has fewer than ``MIN_REQUESTS`` requests anyway.
"""

import math
from statistics import NormalDist

from kvcal.models.spec import Router
from kvcal.models.status import Measurement

METRIC = "trafficShare"
CONFIDENCE = 0.999
MIN_REQUESTS = 100
_Z = NormalDist().inv_cdf(1 - (1 - CONFIDENCE) / 2)


def wilson_interval(successes: float, trials: float, z: float = _Z) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (good coverage near 0 and 1, unlike the normal one)."""
    if trials <= 0:
        raise ValueError(f"trials {trials}: needs at least one")
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return max(0.0, centre - half), min(1.0, centre + half)


def expected_share(weight: int, mirror: int = 0) -> float:
    """The canary's expected fraction of the requests both roles count, at `weight` and `mirror` (percent)."""
    w, copies = weight / 100, mirror / 100 * (1 - weight / 100)
    return (w + copies) / (1 + copies)


def assess_share(
    requests: Measurement | None, weight: int, router: Router, *, at: str, mirror: int = 0
) -> Measurement | None:
    """The share check of one interval from its ``requests`` measurement, or None when it does not apply."""
    if router == "none" or requests is None or requests.baseline is None or requests.canary is None:
        return None
    baseline, canary = max(0.0, requests.baseline), max(0.0, requests.canary)
    total = baseline + canary
    if total < MIN_REQUESTS:
        return None
    low, high = wilson_interval(canary, total)
    expected = expected_share(weight, mirror)
    observed = canary / total
    told = f"its weight is {weight}%" + (
        f" and it receives a {mirror}% mirror (expected {100 * expected:.1f}%)" if mirror else ""
    )
    summary = (
        f"the canary answered {100 * observed:.1f}% of {total:.0f} requests (99.9% interval "
        f"{100 * low:.1f}-{100 * high:.1f}%), {told}"
    )
    if low <= expected <= high:
        return Measurement(
            metric=METRIC, phase="Successful", at=at, baseline=1 - observed, canary=observed, threshold=expected,
            message=summary,
        )  # fmt: skip
    return Measurement(
        metric=METRIC, phase="Error", at=at, baseline=1 - observed, canary=observed, threshold=expected,
        message=f"{summary}: router {router} does not split traffic as set (outside the 99.9% binomial interval); "
        "this interval's comparison does not hold at that weight",
    )  # fmt: skip


def with_share(
    new: list[Measurement], weight: int, router: Router, at: str, *, window_within_step: bool = True, mirror: int = 0
) -> list[Measurement]:
    """An interval's measurements plus the share check, when the interval has a ``requests`` measurement counted
    entirely at this step's weight (`window_within_step`)."""
    if not window_within_step:
        return new
    requests = next((m for m in new if m.metric == "requests"), None)
    checked = assess_share(requests, weight, router, at=at, mirror=mirror)
    return [*new, checked] if checked is not None else new
