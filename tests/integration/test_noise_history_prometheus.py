"""The baseline's noise learned from a real Prometheus holding hours of per-pod history (backfilled with `promtool tsdb
create-blocks-from openmetrics`): 9 baseline pods whose node offsets and own load per minute were drawn, then a step of
a 15% slower canary pod. PrometheusSource learns the noise through its own range subquery; the learned variances
match what the pods drew, and the rank test with them decides where the step's own estimate does not."""

import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from kvcal.adapters.prometheus import PrometheusClient, PrometheusSource, QueryClient
from kvcal.core.analysis import promql
from kvcal.core.analysis.fleetnoise import FleetNoise, from_status, learn_noise
from kvcal.core.guard.policy import PrometheusAccess
from kvcal.models.spec import AnalysisSpec, LatencyCheck, NoiseHistory
from kvcal.models.status import Measurement, NoiseStatus
from tests.support.prereq import require
from tests.support.prometheus import (
    ROLE_POD_LABELS,
    PrometheusServer,
    find_prometheus,
    free_port,
    role_selector,
)

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

NAMESPACE = "history"
BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0]
SCRAPE_SECONDS = 15
INTERVAL_SECONDS = 60
HISTORY_MINUTES = 4 * 60
STEP_MINUTES = 4
PODS, OWN, NODE = 9, 0.05, 0.02
BASELINE_REQUESTS, CANARY_REQUESTS = 300, 300  # per pod and minute: the canary's share is 10%
REGRESSION = 1.15
SPEC = AnalysisSpec(
    latency=[LatencyCheck(metric="ttft")],
    interval=f"{INTERVAL_SECONDS}s",
    history=NoiseHistory(lookback=f"{HISTORY_MINUTES}m", samples=96),
)


@dataclass(frozen=True)
class Drawn:
    """Each pod's bucket counts per minute (pods x minutes x buckets, +Inf last) and the history they make."""

    counts: np.ndarray
    canary: np.ndarray  # minutes x buckets: the canary pod, in the step only
    end: int  # unix seconds of the last sample

    def history(self, every: int) -> list[dict[str, list[tuple[float, float]]]]:
        """Every ``every``-th minute of the baseline's pods, as learn_noise takes them."""
        out = []
        for minute in range(0, HISTORY_MINUTES, every):
            out.append({f"pod-{pod}": _buckets(self.counts[pod, minute]) for pod in range(PODS)})
        return out


def _buckets(counts: np.ndarray) -> list[tuple[float, float]]:
    cumulative = np.cumsum(counts).tolist()
    return [*zip(BUCKETS, cumulative[:-1], strict=True), (math.inf, cumulative[-1])]


def draw(seed: int, requests: int, end: int) -> Drawn:
    """The fleet's minutes: a load shared by every pod, each pod's node offset and own load per minute (lognormal
    sigmas NODE and OWN), lognormal TTFT about 0.2 s; the canary (its own node and load, x REGRESSION) in the step."""
    rng = np.random.default_rng(seed)
    minutes = HISTORY_MINUTES + STEP_MINUTES
    load = np.exp(rng.normal(0.0, 0.15, minutes))
    nodes = np.exp(rng.normal(0.0, NODE, PODS + 1))
    counts = np.zeros((PODS, minutes, len(BUCKETS) + 1), dtype=np.int64)
    canary = np.zeros((STEP_MINUTES, len(BUCKETS) + 1), dtype=np.int64)
    for minute in range(minutes):
        for pod in range(PODS + 1):
            if pod == PODS and minute < HISTORY_MINUTES:
                continue
            scale = 0.2 * load[minute] * nodes[pod] * math.exp(rng.normal(0.0, OWN))
            if pod == PODS:
                scale *= REGRESSION
            samples = np.exp(rng.normal(0.0, 0.5, rng.poisson(requests))) * scale
            row = np.bincount(np.searchsorted(BUCKETS, samples), minlength=len(BUCKETS) + 1)
            if pod == PODS:
                canary[minute - HISTORY_MINUTES] = row
            else:
                counts[pod, minute] = row
    return Drawn(counts, canary, end)


def openmetrics(drawn: Drawn) -> str:
    """The counters Prometheus would have scraped every SCRAPE_SECONDS (each minute's requests spread evenly)."""
    minutes = HISTORY_MINUTES + STEP_MINUTES
    start = drawn.end - minutes * INTERVAL_SECONDS
    per_minute = INTERVAL_SECONDS // SCRAPE_SECONDS
    pods: list[tuple[dict[str, str], np.ndarray]] = []
    for pod in range(PODS):
        pods.append((_labels("baseline", f"llm-baseline-{pod}"), drawn.counts[pod]))
    step = np.zeros((minutes, len(BUCKETS) + 1), dtype=np.int64)
    step[HISTORY_MINUTES:] = drawn.canary
    pods.append((_labels("canary", "llm-canary-0"), step))
    lines = ["# TYPE vllm:time_to_first_token_seconds_bucket gauge"]
    requests = ["# TYPE vllm:request_success_total gauge"]
    for labels, minute_counts in pods:
        first = HISTORY_MINUTES if labels["pod"].startswith("llm-canary") else 0
        running = np.zeros(len(BUCKETS) + 1)
        series: dict[str, list[str]] = {le: [] for le in [*map(str, BUCKETS), "+Inf"]}
        total: list[str] = []
        for minute in range(first, minutes):
            for tick in range(per_minute):
                running = running + minute_counts[minute] / per_minute
                at = start + minute * INTERVAL_SECONDS + (tick + 1) * SCRAPE_SECONDS
                cumulative = np.cumsum(running)
                for le, value in zip(series, cumulative, strict=True):
                    series[le].append(f"{value:.4f} {at}")
                total.append(f"{cumulative[-1]:.4f} {at}")
        text = ",".join(f'{key}="{value}"' for key, value in labels.items())
        for le, samples in series.items():
            lines += [f'vllm:time_to_first_token_seconds_bucket{{{text},le="{le}"}} {sample}' for sample in samples]
        requests += [f"vllm:request_success_total{{{text}}} {sample}" for sample in total]
    return "\n".join([*lines, *requests, "# EOF", ""])


def _labels(role: str, pod: str) -> dict[str, str]:
    series = {promql.series_label(key): value for key, value in ROLE_POD_LABELS[role].items()}  # type: ignore[index]
    return {"namespace": NAMESPACE, "pod": pod, **series}


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusServer, Drawn]]:
    binary, promtool = find_prometheus(), shutil.which("promtool")
    require(binary and promtool, "prometheus and promtool not found: run `make prometheus` (Debian's package)")
    assert binary is not None and promtool is not None
    workdir = tmp_path_factory.mktemp("history")
    drawn = draw(seed=11, requests=BASELINE_REQUESTS, end=int(time.time()) - 1)
    source = workdir / "history.om"
    source.write_text(openmetrics(drawn))
    data = workdir / "data"
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)], check=True,
                   capture_output=True)  # fmt: skip
    server = PrometheusServer(binary=binary, workdir=workdir, port=free_port(), retention="1d")
    server.start()
    try:
        yield server, drawn
    finally:
        server.stop()


def learned(server: PrometheusServer) -> NoiseStatus:
    source = PrometheusSource(role_selector(NAMESPACE), policy=server.policy())
    (noise,) = source.learn_noise(SPEC)
    return noise


def test_the_noise_learned_through_prometheus_is_the_one_drawn(backfilled: tuple[PrometheusServer, Drawn]) -> None:
    """Through Prometheus (96 sampled minutes of 4 hours, increase() over one interval): the pods and intervals it
    saw; own load within its confidence interval of the same pods' minutes read with 100x the requests (nearly no
    request noise: what the pods drew, on the rank test's scale), node offsets within theirs (8 degrees of freedom);
    and what the status keeps is what the test reads."""
    server, drawn = backfilled
    status = learned(server)
    assert status.source == "learned", status.message
    assert status.pods == PODS and status.intervals is not None and status.intervals >= 90
    noise = from_status([status])["ttft"]
    truth = learn_noise(draw(seed=11, requests=100 * BASELINE_REQUESTS, end=drawn.end).history(every=1))
    assert isinstance(truth, FleetNoise)
    own_band = 3 * math.sqrt(2 / noise.own_degrees)  # the estimate's relative standard error, x3
    assert abs(noise.own / truth.own - 1) <= own_band + 0.25, (noise, truth)  # + increase()'s extrapolation
    low, high = 2.18 / 8, 17.5 / 8  # chi-square(8) 1% and 99% quantiles / 8
    assert truth.node * low * 0.8 <= noise.node <= truth.node * high * 1.2, (noise, truth)


def test_a_short_history_is_said_and_the_step_estimates(backfilled: tuple[PrometheusServer, Drawn]) -> None:
    server, _ = backfilled
    source = PrometheusSource(role_selector("nobody-here"), policy=server.policy())
    (status,) = source.learn_noise(SPEC)
    assert status.source == "estimated" and status.message is not None
    assert "0 baseline pod(s)" in status.message and "estimates the pods' noise in each step" in status.message


@dataclass
class AtTime:
    """A Prometheus client whose instant queries are evaluated at ``at`` (the API's ``time``): the step's looks, one
    interval apart, as the operator made them."""

    client: QueryClient
    at: float

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return self.client.custom_query(query, {**(params or {}), "time": f"{self.at:.3f}"})

    def close(self) -> None:
        self.client.close()


def looks(server: PrometheusServer, drawn: Drawn, noise: list[NoiseStatus]) -> list[Measurement]:
    """The latency measurement of each look of the canary's step (look k: its first k intervals)."""
    step_start = drawn.end - STEP_MINUTES * INTERVAL_SECONDS
    out = []
    for look in range(1, STEP_MINUTES + 1):
        at = step_start + look * INTERVAL_SECONDS

        def connect(access: PrometheusAccess, at: float = at) -> QueryClient:
            return AtTime(PrometheusClient(access), at)

        source = PrometheusSource(role_selector(NAMESPACE), policy=server.policy(), connect=connect)
        measured = source.measure(SPEC, INTERVAL_SECONDS, look * INTERVAL_SECONDS, noise)
        out.append(next(each for each in measured if each.metric == "ttft-p95"))
    return out


def test_the_learned_noise_decides_where_the_steps_estimate_cannot(
    backfilled: tuple[PrometheusServer, Drawn],
) -> None:
    """The canary's step (15% slower, one pod beside 9), look by look as the operator reads it: with the learned noise
    two looks are Failed within the step's 4 intervals (a rollback with failureLimit 1); with the step's own
    estimate of the pods' spread (8 degrees of freedom, read through the requests' noise) the same data is not. One
    seeded draw: benchmarks/bench_analysis.py has the rates."""
    server, drawn = backfilled
    with_history = looks(server, drawn, [learned(server)])
    without = looks(server, drawn, [])
    failed = [sum(each.phase == "Failed" for each in measured) for measured in (with_history, without)]
    assert failed[0] >= 2 and failed[1] < 2, [each.message for each in [*with_history, *without]]
    assert all("noise learned from" in (each.message or "") for each in with_history)
    assert all("pod spread" in (each.message or "") for each in without)
