"""core.analysis.share: the canary's observed share of requests against the weight kvcal set (issue 25, item 2)."""

import random
from datetime import timedelta

import pytest

from kvcal.core.analysis.share import (
    CONFIDENCE,
    MIN_REQUESTS,
    assess_share,
    expected_share,
    wilson_interval,
    with_share,
)
from kvcal.core.analysis.verdict import RequestCounts, assess_requests, interval_phase
from kvcal.core.decide import decide
from kvcal.core.timestamps import rfc3339
from kvcal.models.spec import Router
from kvcal.models.status import AnalysisStatus, CanaryStatus, Measurement, Phase
from tests.support.decide import NOW, baseline, observations, spec, started

AT = "2026-01-02T03:04:05Z"


def requests(baseline: float | None, canary: float | None) -> Measurement:
    return assess_requests(RequestCounts(baseline, canary), min_requests=1, at=AT)


def test_wilson_interval_matches_known_values() -> None:
    low, high = wilson_interval(10, 100, z=1.959964)  # the textbook 95% example: 10/100 -> [0.0552, 0.1744]
    assert (round(low, 4), round(high, 4)) == (0.0552, 0.1744)
    assert wilson_interval(0, 400)[0] == 0.0 and wilson_interval(400, 400)[1] == 1.0
    with pytest.raises(ValueError):
        wilson_interval(0, 0)


@pytest.mark.parametrize(("canary", "total", "weight"), [(40, 400, 10), (200, 400, 50), (0, 400, 0), (30, 100, 30)])
def test_a_share_at_its_weight_is_successful(canary: int, total: int, weight: int) -> None:
    m = assess_share(requests(total - canary, canary), weight, "gateway-api", at=AT)
    assert m is not None and m.phase == "Successful" and m.threshold == weight / 100
    assert m.canary == pytest.approx(canary / total)


def test_a_share_outside_the_interval_is_an_error_that_says_so() -> None:
    # The label bug's symptom: 10% on the route, and the baseline Service also sending the canary half of the rest.
    m = assess_share(requests(225, 175), 10, "gateway-api", at=AT)
    assert m is not None and m.phase == "Error"
    assert m.message is not None
    assert "43.8% of 400 requests" in m.message and "its weight is 10%" in m.message
    assert "outside the 99.9% binomial interval" in m.message and "gateway-api" in m.message
    assert interval_phase([requests(225, 175), m]) == "Error"  # never a pass


@pytest.mark.parametrize(
    ("measurement", "router"),
    [
        (requests(300, 100), "none"),  # no user traffic by design: probes and test load only
        (requests(60, 39), "gateway-api"),  # fewer than MIN_REQUESTS
        (requests(None, 50), "replicas"),  # counts missing: the requests measurement is Inconclusive already
        (None, "replicas"),  # no requests measurement this interval
    ],
)
def test_the_check_is_skipped(measurement: Measurement | None, router: Router) -> None:
    assert assess_share(measurement, 10, router, at=AT) is None
    assert with_share([measurement] if measurement else [], 10, router, AT) == ([measurement] if measurement else [])


def test_false_alarms_stay_near_one_in_a_thousand() -> None:
    """A router that does split as set: over many simulated intervals the check errs about 1 - CONFIDENCE of the
    time (a wrong interval would err far more often, e.g. 5% for a 95% one)."""
    rng = random.Random(25)
    trials, errors = 4000, 0
    for _ in range(trials):
        n = rng.randint(MIN_REQUESTS, 2000)
        canary = sum(1 for _ in range(n) if rng.random() < 0.1)
        m = assess_share(requests(n - canary, canary), 10, "replicas", at=AT)
        errors += m is not None and m.phase == "Error"
    assert errors / trials < 5 * (1 - CONFIDENCE)


@pytest.mark.parametrize(
    ("since_weight_set", "checked"), [(timedelta(seconds=30), True), (timedelta(seconds=29), False)]
)
def test_decide_checks_the_share_once_a_window_lies_within_the_step(since_weight_set: timedelta, checked: bool) -> None:
    """An Analyzing pass with a requests measurement gets the share check beside it, against status.canary.weight,
    once the interval's window (30 s here) counts only requests sent since the step's weight was set."""
    s = spec(serving={"baseline": {"deployment": "llm", "service": "llm"}, "traffic": {"steps": [50]}})
    status = started(Phase.ANALYZING).model_copy(
        update={
            "canary": CanaryStatus(deployment="smollm2-canary", weight=33, step_index=0),
            "analysis": AnalysisStatus(started_at=rfc3339(NOW - since_weight_set)),
        }
    )
    obs = observations(baseline=baseline(2), canary=baseline(1), measurements=(requests(100, 400),))
    d = decide(s, status, obs, NOW)
    shares = [m for m in d.status.analysis.measurements if m.metric == "trafficShare"]
    assert [(m.phase, m.threshold) for m in shares] == ([("Error", 0.33)] if checked else [])


@pytest.mark.parametrize(
    ("weight", "mirror", "share"), [(0, 0, 0.0), (0, 100, 0.5), (50, 0, 0.5), (0, 50, 1 / 3), (10, 100, 1.0 / 1.9)]
)
def test_the_expected_share_counts_the_mirrored_copies(weight: int, mirror: int, share: float) -> None:
    # At weight 10% and a 100% mirror the canary answers 0.1 + 0.9 (copies) of 1.9 counted requests per user request.
    assert expected_share(weight, mirror) == pytest.approx(share)


def test_a_shadow_stage_passes_the_share_check_under_mirrored_traffic() -> None:
    """Weight 0 and a 100% mirror: the canary answers a copy of every request, half of all it counts. Without the
    mirror in the check, every interval of 100+ requests was an Error and the stage could not pass."""
    mirrored = assess_share(requests(500, 480), 0, "gateway-api", at=AT, mirror=100)
    assert mirrored is not None and mirrored.phase == "Successful" and "100% mirror" in mirrored.message
    not_mirroring = assess_share(requests(980, 0), 0, "gateway-api", at=AT, mirror=100)  # the gateway drops the copies
    assert not_mirroring is not None and not_mirroring.phase == "Error"
    assert assess_share(requests(500, 480), 0, "gateway-api", at=AT).phase == "Error"  # type: ignore[union-attr]


def test_decide_passes_the_mirror_of_the_shadow_stage_to_the_share_check() -> None:
    s = spec(
        serving={
            "baseline": {"deployment": "llm", "service": "llm"},
            "traffic": {"router": "gateway-api", "httpRoute": "llm", "steps": [50], "shadow": {"percent": 100}},
        }
    )
    status = started(Phase.ANALYZING).model_copy(
        update={
            "canary": CanaryStatus(deployment="smollm2-canary", weight=0, mirror=100, step_index=0),
            "analysis": AnalysisStatus(started_at=rfc3339(NOW - timedelta(seconds=60))),
        }
    )
    obs = observations(baseline=baseline(2), canary=baseline(1), measurements=(requests(400, 410),))
    d = decide(s, status, obs, NOW)
    shares = [m for m in d.status.analysis.measurements if m.metric == "trafficShare"]
    assert [(m.phase, m.threshold) for m in shares] == [("Successful", 0.5)]
