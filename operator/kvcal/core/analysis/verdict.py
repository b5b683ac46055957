"""Canary analysis as pure functions, after Argo Rollouts' counter model: measurement -> interval -> run.

- ``assess_*`` turn raw baseline/canary values into a typed ``Measurement`` (the query and both values kept).
  Empty, NaN or infinite values, and intervals with fewer than ``minRequests`` requests on either side, are
  Inconclusive — never Successful.
- ``interval_phase`` folds one interval's measurements: Failed > Error > Inconclusive > Undecided > Successful
  (Undecided: the sequential rank test, kvcal.core.analysis.ranktest, needs more data; it resets the success streak
  only).
- ``assess_run`` updates the counters and decides:
  * Failed when ``failures`` exceeds ``failureLimit`` (total, not consecutive: flapping cannot hide a regression),
    when ``consecutiveErrors`` exceeds ``consecutiveErrorLimit`` (metrics unreadable), or when ``inconclusive``
    exceeds ``inconclusiveLimit`` (e.g. no traffic: the canary cannot be shown to be safe, so it is not promoted);
  * Passed when ``consecutiveSuccesses`` reaches ``successfulIntervals``; any other interval resets that streak;
  * Undecided when a sequential test made its last look without deciding (``Measurement.exhausted``): neither
    shown slower nor shown safe, its own outcome (spec.analysis.onUndecided: pause or rollback);
  * Running otherwise.
  Limits are counts tolerated, as in Argo Rollouts: ``failureLimit: 1`` tolerates one failed interval and rolls
  back on the second; ``failureLimit: 0`` rolls back on the first.
"""

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from statistics import NormalDist
from typing import Literal, NamedTuple

from kvcal.core.guard.redact import redact
from kvcal.core.timestamps import rfc3339
from kvcal.models.spec import AnalysisSpec, LatencyCheck
from kvcal.models.status import MAX_MEASUREMENTS, AnalysisStatus, Measurement

MeasurementPhase = Literal["Successful", "Undecided", "Failed", "Inconclusive", "Error"]
Outcome = Literal["Running", "Passed", "Failed", "Undecided"]

# Recorded for people and dashboards, never gating an interval.
INFORMATIONAL_METRICS = frozenset({"preemptions", "kvCacheUsage", "logprobDelta"})
_SEVERITY: dict[str, int] = {"Successful": 0, "Undecided": 1, "Inconclusive": 2, "Error": 3, "Failed": 4}


@dataclass(frozen=True)
class AnalysisVerdict:
    status: AnalysisStatus
    outcome: Outcome
    reason: str
    interval: MeasurementPhase | None = None  # the phase of the interval just assessed; None when nothing new


@dataclass(frozen=True)
class RequestCounts:
    baseline: float | None
    canary: float | None


class Reading(NamedTuple):
    """One metric of both roles as Prometheus answered (None: no data), and the canary's query, kept for people."""

    baseline: float | None
    canary: float | None
    query: str | None = None


class RequestGate(NamedTuple):
    """An interval's request counts and the spec's minRequests: a verdict on fewer is Inconclusive."""

    counts: RequestCounts | None
    min_requests: int


def is_missing(value: float | None) -> bool:
    return value is None or math.isnan(value) or math.isinf(value)


def latency_metric_name(check: LatencyCheck) -> str:
    """'ttft-p95', 'itl-p99', 'e2e-p99.9'."""
    return f"{check.metric}-p{check.quantile * 100:g}"


def quantile_from_buckets(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Quantile of a histogram given as (upper bound ``le``, cumulative count) pairs, +Inf included.

    Prometheus' histogram_quantile assumes latencies spread uniformly inside a bucket; vLLM's buckets are wide
    (0.25-0.5-0.75 s for TTFT), so its p95 moves in steps as a distribution shifts, and a 15% slower canary reads
    as +9..+15% depending on where the p95 sits (benchmarks/bench_analysis.py). Here the bracketing bucket is
    interpolated on a probit scale in log-latency (exact for a lognormal, monotone for anything), which tracks
    ratios without that bias. It falls back to Prometheus' linear rule in the first bucket and where the bucket's
    upper bound holds every sample (no curvature to use), and answers like it in the +Inf bucket.
    """
    if not 0 < q < 1:
        raise ValueError(f"quantile {q!r}: must be in (0, 1)")
    points = sorted((float(le), float(c)) for le, c in buckets)
    if not points or not math.isinf(points[-1][0]):
        raise ValueError("buckets: need the le=+Inf bucket (is the query 'sum by (le) (rate(..._bucket))'?)")
    cumulative, running = [], 0.0
    for le, count in points:  # rate() can leave tiny non-monotonic float noise
        running = max(running, count)
        cumulative.append((le, running))
    total = cumulative[-1][1]
    if total <= 0 or math.isnan(total):
        return None
    rank = q * total
    index = next(index for index, (_, count) in enumerate(cumulative) if count >= rank)
    upper, c_hi = cumulative[index]
    if math.isinf(upper):
        return cumulative[index - 1][0] if index > 0 else None
    lower, c_lo = cumulative[index - 1] if index > 0 else (0.0, 0.0)
    f_lo, f_hi = c_lo / total, c_hi / total
    if lower <= 0 or f_lo <= 0 or f_hi >= 1 or c_hi <= c_lo:
        return lower + (upper - lower) * (rank - c_lo) / max(c_hi - c_lo, 1e-300)
    probit = NormalDist().inv_cdf
    fraction = (probit(q) - probit(f_lo)) / (probit(f_hi) - probit(f_lo))
    return math.exp(math.log(lower) + (math.log(upper) - math.log(lower)) * fraction)


def too_few_requests(requests: RequestCounts | None, min_requests: int) -> str | None:
    if requests is None:
        return None
    for role, count in (("baseline", requests.baseline), ("canary", requests.canary)):
        if is_missing(count) or count is None or count < min_requests:
            shown = "no data" if is_missing(count) else f"{count:g} requests"
            return f"{role}: {shown} < minRequests {min_requests}"
    return None


def _missing(baseline: float | None, canary: float | None) -> str | None:
    absent = [role for role, v in (("baseline", baseline), ("canary", canary)) if is_missing(v)]
    return f"no data for {' and '.join(absent)} (empty or NaN result)" if absent else None


def _seconds(value: float) -> str:
    return f"{value * 1000:.1f}ms" if value < 1 else f"{value:.3f}s"


def assess_latency(check: LatencyCheck, reading: Reading, *, gate: RequestGate, at: str) -> Measurement:
    """Canary quantile vs baseline quantile: fails above max(baseline x (1+maxRegression), baseline + noiseFloor)."""
    name = latency_metric_name(check)
    baseline, canary, query = reading
    why = too_few_requests(*gate) or _missing(baseline, canary)
    if why or baseline is None or canary is None:
        return Measurement(
            metric=name, phase="Inconclusive", at=at, baseline=_finite(baseline), canary=_finite(canary),
            query=query, message=why,
        )  # fmt: skip
    limit = max(baseline * (1 + check.max_regression), baseline + check.noise_floor_seconds)
    delta = f"{(canary / baseline - 1) * 100:+.1f}%" if baseline > 0 else "n/a"
    ok = canary <= limit
    message = (
        f"canary {_seconds(canary)} vs baseline {_seconds(baseline)} ({delta}) {'<=' if ok else '>'} limit "
        f"{_seconds(limit)}"
    )
    return Measurement(
        metric=name, phase="Successful" if ok else "Failed", at=at, baseline=baseline, canary=canary,
        threshold=limit, query=query, message=message,
    )  # fmt: skip


def assess_error_rate(max_error_rate: float, reading: Reading, *, gate: RequestGate, at: str) -> Measurement:
    """Fails when the canary's error rate is above maxErrorRate and above the baseline's (a shared outage is not
    the canary's fault). A missing baseline rate counts as 0; a missing canary rate is Inconclusive."""
    baseline, canary, query = reading
    why = too_few_requests(*gate) or _missing(0.0, canary)
    if why or canary is None:
        return Measurement(
            metric="errorRate", phase="Inconclusive", at=at, baseline=_finite(baseline), canary=_finite(canary),
            threshold=max_error_rate, query=query, message=why,
        )  # fmt: skip
    base = 0.0 if is_missing(baseline) or baseline is None else baseline
    failed = canary > max_error_rate and canary > base
    message = f"canary {canary:.2%} vs baseline {base:.2%}, maxErrorRate {max_error_rate:.2%}"
    return Measurement(
        metric="errorRate", phase="Failed" if failed else "Successful", at=at, baseline=base, canary=canary,
        threshold=max_error_rate, query=query, message=message,
    )  # fmt: skip


def assess_requests(requests: RequestCounts, *, min_requests: int, at: str, query: str | None = None) -> Measurement:
    why = too_few_requests(requests, min_requests)
    return Measurement(
        metric="requests", phase="Inconclusive" if why else "Successful", at=at, baseline=_finite(requests.baseline),
        canary=_finite(requests.canary), threshold=float(min_requests), query=query, message=why,
    )  # fmt: skip


def informational(
    metric: str, baseline: float | None, canary: float | None, *, at: str, query: str | None
) -> Measurement:
    return Measurement(
        metric=metric, phase="Successful", at=at, baseline=_finite(baseline), canary=_finite(canary), query=query,
        message="informational (does not gate the rollout)",
    )  # fmt: skip


def error_measurement(metric: str, error: str, *, at: str, query: str | None = None) -> Measurement:
    """The measurement could not be taken (Prometheus down, HTTP error): counts toward consecutiveErrorLimit. The
    adapters put no answer's body in `error`; redact is the second line for anything else that lands here."""
    return Measurement(metric=metric, phase="Error", at=at, query=query, message=redact(error)[:500])


def _finite(value: float | None) -> float | None:
    return None if is_missing(value) else value


def interval_phase(measurements: Iterable[Measurement]) -> MeasurementPhase | None:
    """Worst phase among gating measurements; None when there is nothing to judge."""
    gating = [measurement for measurement in measurements if measurement.metric not in INFORMATIONAL_METRICS]
    if not gating:
        return None
    worst = max(gating, key=lambda m: _SEVERITY[m.phase])
    return worst.phase


def _ttft_delta(new: list[Measurement], previous: str | None) -> str | None:
    """The p95 TTFT delta (status.analysis.ttftP95Delta, a printer column); other quantiles never stand in for it."""
    for measurement in new:
        baseline, canary = measurement.baseline, measurement.canary
        if measurement.metric == "ttft-p95" and baseline and canary is not None and measurement.phase != "Error":
            return f"{(canary / baseline - 1) * 100:+.1f}%"
    return previous


def _counters(status: AnalysisStatus, phase: MeasurementPhase) -> dict[str, int]:
    successes, failures = status.consecutive_successes, status.failures
    inconclusive, errors = status.inconclusive, status.consecutive_errors
    if phase == "Successful":
        return {"consecutive_successes": successes + 1, "consecutive_errors": 0}
    if phase == "Failed":
        return {"consecutive_successes": 0, "failures": failures + 1, "consecutive_errors": 0}
    if phase == "Inconclusive":
        return {"consecutive_successes": 0, "inconclusive": inconclusive + 1, "consecutive_errors": 0}
    if phase == "Undecided":  # a sequential test that needs more data: no verdict, nothing counted against it
        return {"consecutive_successes": 0, "consecutive_errors": 0}
    return {"consecutive_successes": 0, "consecutive_errors": errors + 1}


def _why(measurements: list[Measurement], phase: str) -> str:
    parts = [f"{each.metric}: {each.message or each.phase}" for each in measurements if each.phase == phase]
    return "; ".join(parts[:4])


def run_outcome(spec: AnalysisSpec, status: AnalysisStatus, last: list[Measurement]) -> tuple[Outcome, str]:
    """Outcome of the counters alone; ``last`` only explains a failure."""
    if status.failures > spec.failure_limit:
        return "Failed", f"FailureLimit: {status.failures} failed intervals (limit {spec.failure_limit}). " + _why(
            last, "Failed"
        )
    if status.consecutive_errors > spec.consecutive_error_limit:
        return "Failed", (
            f"ConsecutiveErrorLimit: {status.consecutive_errors} intervals in a row without readable metrics "
            f"(limit {spec.consecutive_error_limit}). " + _why(last, "Error")
        )
    if status.inconclusive > spec.inconclusive_limit:
        return "Failed", (
            f"InconclusiveLimit: {status.inconclusive} inconclusive intervals (limit {spec.inconclusive_limit}); "
            "the canary could not be shown to be safe. " + _why(last, "Inconclusive")
        )
    if status.consecutive_successes >= max(1, spec.successful_intervals):
        return "Passed", f"{status.consecutive_successes} consecutive successful intervals"
    return "Running", (
        f"{status.consecutive_successes}/{spec.successful_intervals} successful intervals in a row, "
        f"{status.failures} failed (limit {spec.failure_limit}), {status.inconclusive} inconclusive "
        f"(limit {spec.inconclusive_limit}), {status.consecutive_errors} errors in a row "
        f"(limit {spec.consecutive_error_limit})"
    )


def assess_run(spec: AnalysisSpec, status: AnalysisStatus, new: list[Measurement], now: datetime) -> AnalysisVerdict:
    """Fold one interval's measurements into the run; ``new == []`` re-evaluates the counters only."""
    phase = interval_phase(new)
    if phase is None:
        outcome, reason = run_outcome(spec, status, status.measurements)
        return AnalysisVerdict(status=status, outcome=outcome, reason=reason)
    at = rfc3339(now)
    updated = status.model_copy(
        update={
            **_counters(status, phase),
            "started_at": status.started_at or at,
            "last_measured_at": at,
            "ttft_p95_delta": _ttft_delta(new, status.ttft_p95_delta),
            "measurements": [*status.measurements, *new][-MAX_MEASUREMENTS:],
        }
    )
    outcome, reason = run_outcome(spec, updated, new)
    exhausted = [each for each in new if each.exhausted]
    if outcome == "Running" and exhausted:
        outcome, reason = "Undecided", "Undecided: " + "; ".join(f"{m.metric}: {m.message}" for m in exhausted[:3])
    return AnalysisVerdict(status=updated, outcome=outcome, reason=reason, interval=phase)
