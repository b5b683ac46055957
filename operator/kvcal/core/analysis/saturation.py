"""The saturation check (optional, spec.analysis.saturation): at the same offered load, the canary must not queue or
preempt more than the baseline.

More KV tokens let vLLM run more sequences at once, so near the baseline's limit an FP8 canary keeps fewer requests
waiting (``vllm:num_requests_waiting``) and preempts fewer (``vllm:num_preemptions``). Values are per pod (mean over
the window) and per request, so a canary with fewer pods or a smaller traffic share compares at the same load per
pod. ``report`` records the values in status; ``gate`` also fails an interval where the canary is worse beyond
``maxRegression`` and the noise floors below. Missing data or too few requests: Inconclusive.
"""

from dataclasses import dataclass

from kvcal.core.analysis.verdict import informational, is_missing
from kvcal.models.spec import SaturationCheck
from kvcal.models.status import Measurement

METRIC = "saturation"
# A canary within these of the baseline passes whatever the ratio (an idle baseline waits 0.0).
WAITING_NOISE_FLOOR = 0.5  # requests waiting, mean per pod
PREEMPTION_NOISE_FLOOR = 0.01  # preemptions per request


@dataclass(frozen=True)
class Load:
    """One role over the window."""

    running: float | None  # requests running, mean per pod
    waiting: float | None  # requests waiting, mean per pod
    preemptions: float | None  # preemptions, all pods
    requests: float | None  # requests finished, all pods

    @property
    def preemptions_per_request(self) -> float | None:
        if is_missing(self.preemptions) or is_missing(self.requests) or not self.requests:
            return None
        return (self.preemptions or 0.0) / self.requests


def _limit(baseline: float, max_regression: float, floor: float) -> float:
    return max(baseline * (1 + max_regression), baseline + floor)


def _verdict(check: SaturationCheck, baseline: Load, canary: Load, min_requests: int) -> tuple[str, str]:
    for role, load in (("baseline", baseline), ("canary", canary)):
        if is_missing(load.requests) or (load.requests or 0) < max(1, min_requests):
            return "Inconclusive", f"{role}: too few requests to compare saturation"
    base_wait, canary_wait = baseline.waiting, canary.waiting
    base_rate, canary_rate = baseline.preemptions_per_request, canary.preemptions_per_request
    if base_wait is None or canary_wait is None or is_missing(base_wait) or is_missing(canary_wait):
        return "Inconclusive", "no data for vllm:num_requests_waiting"
    if base_rate is None or canary_rate is None:
        return "Inconclusive", "no data for vllm:num_preemptions"
    wait_limit = _limit(base_wait, check.max_regression, WAITING_NOISE_FLOOR)
    rate_limit = _limit(base_rate, check.max_regression, PREEMPTION_NOISE_FLOOR)
    summary = (
        f"waiting per pod: canary {canary_wait:.2f} vs baseline {base_wait:.2f} (limit {wait_limit:.2f}); "
        f"preemptions per request: canary {canary_rate:.3f} vs baseline {base_rate:.3f} (limit {rate_limit:.3f})"
    )
    worse = canary_wait > wait_limit or canary_rate > rate_limit
    return ("Failed", f"the canary saturates before the baseline: {summary}") if worse else ("Successful", summary)


def assess_saturation(
    check: SaturationCheck, baseline: Load, canary: Load, *, min_requests: int, at: str, queries: dict[str, str | None]
) -> list[Measurement]:
    """Per-role values (informational) and, with mode gate, one gating verdict."""
    out = [
        informational("runningPerPod", baseline.running, canary.running, at=at, query=queries["running"]),
        informational("waitingPerPod", baseline.waiting, canary.waiting, at=at, query=queries["waiting"]),
        informational(
            "preemptionsPerRequest", baseline.preemptions_per_request, canary.preemptions_per_request,
            at=at, query=queries["preemptions"],
        ),
    ]  # fmt: skip
    if check.mode == "gate":
        phase, message = _verdict(check, baseline, canary, min_requests)
        out.append(
            Measurement.model_validate(
                {"metric": METRIC, "phase": phase, "at": at, "query": queries["waiting"], "message": message,
                 "baseline": baseline.waiting if not is_missing(baseline.waiting) else None,
                 "canary": canary.waiting if not is_missing(canary.waiting) else None}
            )
        )  # fmt: skip
    return out
