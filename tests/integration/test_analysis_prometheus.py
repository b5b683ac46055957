"""Scenario tests: the real Prometheus scrapes two exporters serving vLLM's metric names (baseline and canary,
controlled latency distributions); PrometheusSource measures them and assess_run decides, interval by interval."""

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from kvcal.adapters.prometheus import PrometheusSource
from kvcal.core.analysis import promql
from kvcal.core.analysis.plan import Estimator
from kvcal.core.analysis.ranktest import NO_POD_REFERENCE
from kvcal.core.analysis.verdict import AnalysisVerdict, assess_run
from kvcal.core.guard.policy import Policy, PrometheusAccess
from kvcal.models.spec import AnalysisSpec, LatencyCheck, PrometheusRef
from kvcal.models.status import AnalysisStatus, Measurement
from tests.support.exporter import Profile, VllmExporter
from tests.support.prometheus import PrometheusServer, free_port, role_selector, role_target_labels

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

WINDOW_SECONDS = 3
GOOD = Profile(rate=80, ttft_median=0.15, itl_median=0.03, sigma=0.1)
SLOW = Profile(rate=80, ttft_median=0.30, itl_median=0.045, sigma=0.1)  # TTFT x2, ITL x1.5
IDLE = Profile(rate=0)


@dataclass
class Rollout:
    prometheus: PrometheusServer
    baseline: VllmExporter
    canary: VllmExporter
    namespace: str
    selector: promql.Selector
    estimator: Estimator = "buckets"

    def settle(self, scrapes: int = WINDOW_SECONDS + 1) -> None:
        """Let the whole query window fill with samples of the current profiles."""
        for _ in range(scrapes):
            self.prometheus.wait_next_scrape(f'namespace="{self.namespace}"')

    def intervals(self, spec: AnalysisSpec, profiles: list[Profile]) -> list[AnalysisVerdict]:
        """One analysis interval per canary profile, stopping at the first Passed/Failed."""
        metrics = PrometheusSource(self.selector, policy=self.prometheus.policy(), estimator=self.estimator)
        status, verdicts = AnalysisStatus(), []
        for profile in profiles:
            if profile != self.canary.profile:
                self.canary.profile = profile
                self.settle()
            else:
                self.settle(2)
            verdict = assess_run(spec, status, metrics.measure(spec, WINDOW_SECONDS), datetime.now(UTC))
            verdicts.append(verdict)
            status = verdict.status
            if verdict.outcome != "Running":
                break
        return verdicts


SCENARIOS = 8  # tests that take a rollout from the pool


@pytest.fixture(scope="module")
def pool(prometheus: PrometheusServer) -> Iterator[list[Rollout]]:
    """Idle exporter pairs, registered all at once: Prometheus applies target changes at most every 5 s, so one
    registration for the module instead of one per test. Each test takes its own pair (own namespace label)."""
    rollouts: list[Rollout] = []
    targets: dict[str, dict[str, str]] = {}
    for i in range(SCENARIOS):
        ns = f"analysis-{i}"
        baseline, canary = VllmExporter(IDLE, seed=2 * i + 1).start(), VllmExporter(IDLE, seed=2 * i + 2).start()
        targets[baseline.target] = role_target_labels(ns, "baseline")
        targets[canary.target] = role_target_labels(ns, "canary")
        selector = role_selector(ns)
        rollouts.append(Rollout(prometheus, baseline, canary, ns, selector))
    prometheus.set_targets("analysis", targets)
    try:
        prometheus.wait_targets_up(list(targets))
        yield rollouts
    finally:
        prometheus.remove_targets("analysis")
        for r in rollouts:
            r.baseline.stop()
            r.canary.stop()


@pytest.fixture
def rollout(pool: list[Rollout], request: pytest.FixtureRequest) -> Iterator[Rollout]:
    r = pool.pop()
    r.baseline.profile = GOOD
    r.canary.profile = getattr(request, "param", GOOD)
    r.settle()
    try:
        yield r
    finally:
        r.baseline.profile = r.canary.profile = IDLE


def spec_for(server: PrometheusServer | None, **overrides: object) -> AnalysisSpec:
    values: dict[str, object] = {
        "prometheus": PrometheusRef(address=server.url if server else "http://unused"),
        "min_requests": 50,
        "successful_intervals": 3,
        "failure_limit": 1,
        "inconclusive_limit": 2,
        "consecutive_error_limit": 1,
        # The quantile test judges each interval on its own, so these scenarios drive assess_run's counters one
        # interval at a time; the rank test (the default) pools a step: its own tests below.
        "latency": [
            LatencyCheck(metric="ttft", test="quantile"),
            LatencyCheck(metric="itl", test="quantile"),
            LatencyCheck(metric="e2e", quantile=0.99, test="quantile"),
        ],
    }
    values.update(overrides)
    return AnalysisSpec.model_validate(values)


def test_regression_rolls_back_within_the_failure_limit(rollout: Rollout) -> None:
    spec = spec_for(rollout.prometheus)
    verdicts = rollout.intervals(spec, [SLOW] * 4)
    assert [v.outcome for v in verdicts] == ["Running", "Failed"]
    assert verdicts[-1].reason.startswith("FailureLimit: 2 failed intervals")
    last = {m.metric: m for m in verdicts[-1].status.measurements[-7:]}
    ttft = last["ttft-p95"]
    assert ttft.phase == "Failed" and ttft.canary is not None and ttft.baseline is not None
    assert ttft.canary > 1.3 * ttft.baseline
    assert ttft.query is not None and "time_to_first_token_seconds_bucket" in ttft.query
    assert last["requests"].phase == "Successful" and (last["requests"].canary or 0) >= 50
    assert verdicts[-1].status.ttft_p95_delta is not None and verdicts[-1].status.ttft_p95_delta.startswith("+")


def test_no_regression_passes(rollout: Rollout) -> None:
    # With Prometheus' own histogram_quantile instead of kvcal's bucket estimator.
    rollout.estimator = "histogram_quantile"
    spec = spec_for(rollout.prometheus)  # the estimator matters to the quantile test only
    verdicts = rollout.intervals(spec, [GOOD] * 5)
    assert [v.outcome for v in verdicts] == ["Running", "Running", "Passed"]
    final = verdicts[-1].status
    assert final.consecutive_successes == 3 and final.failures == 0
    error_rate = next(m for m in reversed(final.measurements) if m.metric == "errorRate")
    assert error_rate.phase == "Successful" and error_rate.canary == 0.0


@pytest.mark.parametrize("rollout", [IDLE], indirect=True)
def test_no_traffic_is_inconclusive_and_never_passes(rollout: Rollout) -> None:
    spec = spec_for(rollout.prometheus)
    verdicts = rollout.intervals(spec, [IDLE] * 5)
    assert [v.interval for v in verdicts] == ["Inconclusive"] * 3
    assert [v.outcome for v in verdicts] == ["Running", "Running", "Failed"]
    assert verdicts[-1].reason.startswith("InconclusiveLimit")
    requests = next(m for m in verdicts[0].status.measurements if m.metric == "requests")
    assert requests.canary == 0 and "canary: 0 requests < minRequests 50" in (requests.message or "")
    latency = next(m for m in verdicts[0].status.measurements if m.metric == "ttft-p95")
    assert latency.phase == "Inconclusive" and latency.canary is None  # NaN from Prometheus is not stored


def test_prometheus_down_counts_errors_then_fails() -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused, as for a Prometheus down
    spec = spec_for(None, prometheus=PrometheusRef(address=dead))
    policy = Policy(prometheus_default=PrometheusAccess(name="down", address=dead))
    metrics = PrometheusSource(role_selector("ns"), policy=policy)
    status, verdicts = AnalysisStatus(), []
    for _ in range(3):
        verdict = assess_run(spec, status, metrics.measure(spec, WINDOW_SECONDS), datetime.now(UTC))
        verdicts.append(verdict)
        status = verdict.status
        if verdict.outcome != "Running":
            break
    assert [v.interval for v in verdicts] == ["Error", "Error"]
    assert [v.outcome for v in verdicts] == ["Running", "Failed"]
    assert verdicts[-1].reason.startswith("ConsecutiveErrorLimit")
    m = verdicts[-1].status.measurements[-1]
    assert m.metric == "prometheus" and m.phase == "Error" and "unreachable" in (m.message or "")


def test_flapping_canary_never_passes_and_failures_add_up(rollout: Rollout) -> None:
    spec = spec_for(rollout.prometheus)
    verdicts = rollout.intervals(spec, [GOOD, SLOW, GOOD, GOOD, SLOW, GOOD])
    assert [v.interval for v in verdicts] == ["Successful", "Failed", "Successful", "Successful", "Failed"]
    assert [v.outcome for v in verdicts] == ["Running"] * 4 + ["Failed"]


def test_canary_errors_fail_the_error_rate(rollout: Rollout) -> None:
    spec = spec_for(rollout.prometheus, max_error_rate=0.05)
    failing = Profile(rate=80, ttft_median=0.15, itl_median=0.03, sigma=0.1, error_rate=0.3)
    verdicts = rollout.intervals(spec, [failing] * 3)
    assert verdicts[-1].outcome == "Failed"
    error_rate = next(m for m in reversed(verdicts[-1].status.measurements) if m.metric == "errorRate")
    assert error_rate.phase == "Failed" and error_rate.canary is not None and not math.isnan(error_rate.canary)
    assert 0.15 < error_rate.canary < 0.45 and error_rate.baseline == 0.0


def test_canary_failing_every_request_rolls_back_on_errors_not_on_missing_data(rollout: Rollout) -> None:
    spec = spec_for(rollout.prometheus)
    broken = Profile(rate=80, error_rate=1.0)
    verdicts = rollout.intervals(spec, [broken] * 3)
    assert [v.outcome for v in verdicts] == ["Running", "Failed"]
    assert verdicts[-1].reason.startswith("FailureLimit")
    last = {m.metric: m for m in verdicts[-1].status.measurements[-7:]}
    assert last["errorRate"].phase == "Failed" and last["errorRate"].canary == 1.0
    assert last["requests"].phase == "Successful"  # 5xx replies are traffic too
    assert last["ttft-p95"].phase == "Inconclusive"  # no latency data from a canary that never answers


def test_rank_test_pools_the_step_from_prometheus(rollout: Rollout) -> None:
    """The rank test reads increase() bucket counts of the interval and of the whole step from real Prometheus:
    three intervals pooled hold about three times the interval's requests, and the look is the third. With one
    pod per role the step's full intervals (a subquery) are its replicates: two at look 3, none at look 1."""
    rollout.settle(3 * WINDOW_SECONDS + 2)
    spec = spec_for(rollout.prometheus, interval=f"{WINDOW_SECONDS}s", latency=[LatencyCheck(metric="ttft")])
    metrics = PrometheusSource(rollout.selector, policy=rollout.prometheus.policy())
    pooled = metrics.measure(spec, WINDOW_SECONDS, 3 * WINDOW_SECONDS)
    single = metrics.measure(spec, WINDOW_SECONDS)
    ttft, ttft_single = (next(m for m in ms if m.metric == "ttft-p95") for ms in (pooled, single))
    assert ttft.query is not None and "increase(" in ttft.query and f"[{3 * WINDOW_SECONDS}s]" in ttft.query
    assert ttft.phase != "Failed" and ttft.message is not None and "look 3/6" in ttft.message
    assert re.search(r"over 2 intervals|1 full interval", ttft.message), ttft.message
    assert ttft_single.message is not None and "look 1/6" in ttft_single.message
    assert ttft_single.phase == "Undecided" and "0 full interval(s) of the step" in ttft_single.message
    canary_pooled = _canary_requests(ttft.message)
    canary_single = _canary_requests(ttft_single.message)
    assert 2.3 * canary_single < canary_pooled < 3.7 * canary_single
    # The interval's p95s stay in status for people (canary and baseline within 20% of each other, same profile).
    assert ttft.baseline is not None and ttft.canary is not None and abs(ttft.canary / ttft.baseline - 1) < 0.2


def _canary_requests(message: str | None) -> float:
    match = re.search(r"([\d,]+) canary vs", message or "")
    assert match is not None, message
    return float(match[1].replace(",", ""))


BASELINE_PODS = (0.15, 0.155, 0.145, 0.15)  # TTFT medians: four baseline pods on nodes a few % apart


@pytest.fixture(scope="module")
def pods(prometheus: PrometheusServer) -> Iterator[Rollout]:
    """One rollout whose baseline runs four pods (one exporter each, its own pod name and scrape target)."""
    namespace = "analysis-pods"
    baseline = [
        VllmExporter(Profile(rate=30, ttft_median=median), seed=100 + index).start()
        for index, median in enumerate(BASELINE_PODS)
    ]
    canary = VllmExporter(Profile(rate=30), seed=200).start()
    targets = {pod.target: role_target_labels(namespace, "baseline", f"llm-{i}") for i, pod in enumerate(baseline)}
    targets[canary.target] = role_target_labels(namespace, "canary")
    prometheus.set_targets("analysis-pods", targets)
    try:
        prometheus.wait_targets_up(list(targets))
        yield Rollout(prometheus, baseline[0], canary, namespace, role_selector(namespace))
    finally:
        prometheus.remove_targets("analysis-pods")
        for exporter in [*baseline, canary]:
            exporter.stop()


def test_rank_test_reads_each_pod_from_prometheus(pods: Rollout) -> None:
    """The step's buckets come back per pod (sum by (pod, instance, le)) from real Prometheus: the verdict counts
    4 baseline pods and 1 canary pod and widens its variance by their spread; a canary 2x slower still rolls back."""
    pods.settle(3 * WINDOW_SECONDS + 2)
    spec = spec_for(pods.prometheus, interval=f"{WINDOW_SECONDS}s", latency=[LatencyCheck(metric="ttft")])
    metrics = PrometheusSource(pods.selector, policy=pods.prometheus.policy())
    same = next(m for m in metrics.measure(spec, WINDOW_SECONDS, 3 * WINDOW_SECONDS) if m.metric == "ttft-p95")
    assert same.query is not None and "sum by (pod, instance, le)" in same.query
    assert same.message is not None and "pods 4+1, pod spread" in same.message, same.message
    assert same.phase != "Failed", same.message
    pods.canary.profile = Profile(rate=30, ttft_median=0.30)
    pods.settle(3 * WINDOW_SECONDS + 2)
    slow = next(m for m in metrics.measure(spec, WINDOW_SECONDS, 3 * WINDOW_SECONDS) if m.metric == "ttft-p95")
    assert slow.phase == "Failed", slow.message
    assert slow.message is not None and "pods 4+1" in slow.message


def test_one_pod_per_role_decides_on_the_steps_intervals_from_prometheus(rollout: Rollout) -> None:
    """1 baseline and 1 canary pod (issue 24): each full interval of the step comes back from real Prometheus as
    one sample of a subquery, and the verdict's variance is their spread. A canary 2x slower is Failed and one like
    the baseline Successful once enough intervals agree (looks 5 and 6 of 6: 3 and 4 degrees of freedom)."""
    spec = spec_for(rollout.prometheus, interval=f"{WINDOW_SECONDS}s", latency=[LatencyCheck(metric="ttft")])
    metrics = PrometheusSource(rollout.selector, policy=rollout.prometheus.policy())

    def look(number: int) -> Measurement:
        return next(m for m in metrics.measure(spec, WINDOW_SECONDS, number * WINDOW_SECONDS) if m.metric == "ttft-p95")

    rollout.settle(6 * WINDOW_SECONDS + 2)
    same = look(6)
    assert same.phase == "Successful", same.message
    # 5 windows of the 3 s grid; 4 when the grid ticks between the two roles' queries (only common ones count)
    assert same.message is not None and re.search(r"over [45] intervals", same.message), same.message
    assert NO_POD_REFERENCE in same.message
    rollout.canary.profile = SLOW
    rollout.settle(5 * WINDOW_SECONDS + 2)
    slow = look(5)
    assert slow.phase == "Failed", slow.message
    assert slow.message is not None and re.search(r"over [34] intervals", slow.message), slow.message
