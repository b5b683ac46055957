"""The saturation check through the real Prometheus: PrometheusSource reads requests running and waiting per pod and
preemptions per request of two exporters serving vLLM's metric names (tests/support/exporter.py), and the gate
passes a canary that saturates later than the baseline and fails one that queues and preempts more."""

from collections.abc import Iterator

import pytest

from kvcal.adapters.prometheus import PrometheusSource
from kvcal.models.spec import AnalysisSpec, PrometheusRef, SaturationCheck
from tests.support.exporter import Profile, VllmExporter
from tests.support.prometheus import PrometheusServer, role_selector, role_target_labels

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

NAMESPACE = "saturation"
WINDOW_SECONDS = 3
# Near the BF16 baseline's KV limit: it queues and preempts; an FP8 canary keeps more running and preempts none.
BF16 = Profile(rate=80, running=4, waiting=3, preemptions_per_request=0.1)
FP8 = Profile(rate=80, running=7, waiting=0.2)
WORSE = Profile(rate=80, running=3, waiting=6, preemptions_per_request=0.3)


@pytest.fixture(scope="module")
def pair(prometheus: PrometheusServer) -> Iterator[tuple[VllmExporter, VllmExporter]]:
    baseline, canary = VllmExporter(BF16, seed=101).start(), VllmExporter(FP8, seed=102).start()
    prometheus.set_targets(NAMESPACE, {
        baseline.target: role_target_labels(NAMESPACE, "baseline"),
        canary.target: role_target_labels(NAMESPACE, "canary"),
    })  # fmt: skip
    try:
        prometheus.wait_targets_up([baseline.target, canary.target])
        yield baseline, canary
    finally:
        prometheus.remove_targets(NAMESPACE)
        baseline.stop()
        canary.stop()


def measure(prometheus: PrometheusServer, mode: str) -> dict[str, tuple[str, float | None, float | None, str]]:
    for _ in range(WINDOW_SECONDS + 1):  # the whole window holds the current profiles
        prometheus.wait_next_scrape(f'namespace="{NAMESPACE}"')
    spec = AnalysisSpec(
        prometheus=PrometheusRef(address=prometheus.url), latency=[], min_requests=50,
        saturation=SaturationCheck.model_validate({"mode": mode}),
    )  # fmt: skip
    selector = role_selector(NAMESPACE)
    out = PrometheusSource(selector, policy=prometheus.policy()).measure(spec, WINDOW_SECONDS)
    return {m.metric: (m.phase, m.baseline, m.canary, m.message or "") for m in out}


def test_gate_passes_a_canary_that_saturates_later_and_fails_one_that_saturates_first(
    pair: tuple[VllmExporter, VllmExporter], prometheus: PrometheusServer
) -> None:
    _, canary = pair
    report = measure(prometheus, "report")
    assert "saturation" not in report  # report: values only
    assert report["runningPerPod"][1:3] == (4.0, 7.0) and report["waitingPerPod"][1:3] == (3.0, 0.2)
    preemptions = report["preemptionsPerRequest"]
    assert preemptions[1] == pytest.approx(0.1, rel=0.05) and preemptions[2] == 0.0, preemptions

    assert measure(prometheus, "gate")["saturation"][0] == "Successful"
    canary.profile = WORSE
    phase, _, _, message = measure(prometheus, "gate")["saturation"]
    assert phase == "Failed" and message.startswith("the canary saturates before the baseline"), message
