"""When the analysis measures, and over which window: the one place that decides it.

An interval is due a warmup after the analysis started, then every ``interval`` after the last measurement; the
rank test pools the whole step, so its window reaches back to the step's first interval (at most one look past the
last the design makes), and which look of the step a measurement is follows from that window. decide() asks whether
a measurement is due, the rollout machine when to look again, the reconciler which window to query, and the
Prometheus adapter which look it measures: all of them here.
"""

from collections.abc import Sequence
from datetime import datetime, timedelta

from kvcal.core.timestamps import parse_rfc3339
from kvcal.models.spec import AnalysisSpec
from kvcal.models.status import AnalysisStatus, KVCalibrationStatus, NoiseStatus, Phase

# Looks per analysis step, as a multiple of successfulIntervals (the consecutive confident looks a promotion needs).
LOOKS_PER_SUCCESSFUL_INTERVAL = 2


def next_measurement_at(spec: AnalysisSpec, status: AnalysisStatus) -> datetime | None:
    """When the next analysis interval is due: warmup after the start, then every interval."""
    if status.last_measured_at:
        return parse_rfc3339(status.last_measured_at) + timedelta(seconds=spec.interval_seconds)
    if status.started_at:
        return parse_rfc3339(status.started_at) + timedelta(seconds=spec.warmup_seconds)
    return None


def measurement_due(spec: AnalysisSpec, status: KVCalibrationStatus, now: datetime) -> bool:
    """Whether the reconciler should query metrics and probes now (only while Analyzing)."""
    due = next_measurement_at(spec, status.analysis)
    return status.phase == Phase.ANALYZING and due is not None and now >= due


def noise_due(spec: AnalysisSpec, status: KVCalibrationStatus, now: datetime) -> bool:
    """Whether the reconciler should learn the baseline pods' noise from their history now: from the verification of
    the checkpoint (before any canary: `kvcal plan` sizes it) through the analysis, for a rank-tested metric whose
    noise the status lacks or learned more than spec.history.refresh ago."""
    if not spec.history.learn or status.phase not in (Phase.VERIFYING, Phase.DEPLOYING, Phase.ANALYZING):
        return False
    learned = {noise.metric: noise.learned_at for noise in status.noise}
    refresh = timedelta(seconds=spec.history.refresh_seconds)
    for check in spec.latency:
        if check.test != "rank":
            continue
        at = learned.get(check.metric)
        if at is None or parse_rfc3339(at) + refresh <= now:
            return True
    return False


def with_noise(status: Sequence[NoiseStatus], learned: Sequence[NoiseStatus]) -> list[NoiseStatus]:
    """The status' noise with the metrics just ``learned`` replaced, in metric order."""
    merged = {noise.metric: noise for noise in status} | {noise.metric: noise for noise in learned}
    return [merged[metric] for metric in sorted(merged)]


def query_window_seconds(spec: AnalysisSpec, status: AnalysisStatus, now: datetime, intervals: int = 3) -> float:
    """Query window for the measurement taken at ``now``: everything since the first measurement was due (the end
    of the warmup after ``status.startedAt``) plus that first interval, at least one interval and at most
    ``intervals`` intervals: the rank test's window, pooling the step
    (step_window_seconds)."""
    interval = spec.interval_seconds
    if status.started_at is None:
        return interval
    started = parse_rfc3339(status.started_at)
    since_first = (now - started).total_seconds() - spec.warmup_seconds
    return max(interval, min(since_first + interval, intervals * interval))


def look_number(spec: AnalysisSpec, step_seconds: float) -> int:
    """Which look of the step a measurement over ``step_seconds`` (since the step's first interval began) is."""
    return max(1, round(step_seconds / spec.interval_seconds))


def step_window_seconds(spec: AnalysisSpec, status: AnalysisStatus, now: datetime) -> float:
    """The rank test's window at ``now``: since the step's first interval began (one look past the last is enough
    to read as Inconclusive)."""
    return query_window_seconds(
        spec, status, now, intervals=LOOKS_PER_SUCCESSFUL_INTERVAL * spec.successful_intervals + 1
    )
