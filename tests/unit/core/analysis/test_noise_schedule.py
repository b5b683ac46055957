"""When the operator learns the baseline's noise (core.analysis.schedule.noise_due) and how decide() keeps it."""

from datetime import timedelta

import pytest

from kvcal.core.analysis.fleetnoise import FleetNoise, noise_status
from kvcal.core.analysis.schedule import noise_due, with_noise
from kvcal.core.decide import decide
from kvcal.models.spec import LatencyCheck
from kvcal.models.status import Phase
from tests.support.decide import ANALYZING, NOW, canary, m, observations, spec

NOISE = FleetNoise(node=1e-4, own=8e-4, node_degrees=8, own_degrees=760, pods=9, intervals=96, requests=300,
                   slowdown=0.047)  # fmt: skip
AT = "2026-01-02T03:00:00Z"  # 4 minutes before NOW
LEARNED = noise_status("ttft", NOISE, AT)


@pytest.mark.parametrize(
    ("phase", "due"),
    [(Phase.PENDING, False), (Phase.VERIFYING, True), (Phase.DEPLOYING, True), (Phase.ANALYZING, True),
     (Phase.SUCCEEDED, False)],
)  # fmt: skip
def test_learned_from_the_verification_on_before_any_canary(phase: Phase, due: bool) -> None:
    analysis = spec().analysis
    assert noise_due(analysis, ANALYZING.model_copy(update={"phase": phase}), NOW) is due


def test_refreshed_when_stale_for_each_rank_tested_metric() -> None:
    analysis = spec(analysis={"latency": [{"metric": "ttft"}, {"metric": "itl", "test": "quantile"}]}).analysis
    learned = ANALYZING.model_copy(update={"noise": [LEARNED]})
    assert not noise_due(analysis, learned, NOW)  # itl's quantile test learns nothing
    assert not noise_due(analysis, learned, NOW + timedelta(minutes=55))
    assert noise_due(analysis, learned, NOW + timedelta(minutes=56))  # history.refresh: 1h after AT
    both = analysis.model_copy(update={"latency": [LatencyCheck(metric="ttft"), LatencyCheck(metric="e2e")]})
    assert noise_due(both, learned, NOW)  # e2e not learned yet


def test_not_learned_when_the_spec_says_not_to() -> None:
    analysis = spec(analysis={"history": {"learn": False}}).analysis
    assert not noise_due(analysis, ANALYZING, NOW)


def test_a_newer_reading_replaces_its_metrics_only() -> None:
    itl = noise_status("itl", "history: 1 baseline pod(s) seen", AT)
    newer = noise_status("ttft", NOISE, "2026-01-02T04:00:00Z")
    assert with_noise([LEARNED, itl], [newer]) == [itl, newer]


def test_decide_keeps_what_was_learned_across_the_analysis() -> None:
    """The noise a pass learned lands in status.noise with that pass's measurements, and stays there."""
    s = ANALYZING
    d = decide(spec(), s, observations(canary=canary(), measurements=(m("Successful"),), noise=(LEARNED,)), NOW)
    assert d.status.noise == [LEARNED]
    d = decide(spec(), d.status, observations(canary=canary(), measurements=(m("Successful"),)), NOW)
    assert d.status.noise == [LEARNED]
