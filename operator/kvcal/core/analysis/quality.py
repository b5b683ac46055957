"""Pure scoring of quality probes: the same prompts, greedy, sent to baseline and canary.

- Accuracy: each reply is scored against the probe's expected answer; the canary fails when its accuracy is more
  than ``maxAccuracyDrop`` below the baseline's.
- Top-1 token agreement: both sides decode greedily, so token i is each side's top-1 choice *given the same
  context* only up to the first token where they differ; after it the contexts differ and positions no longer
  compare. Agreement is therefore (matching tokens) / (matching tokens + divergences) summed over probes — the
  teacher-forced agreement, measured on the prefix where it is defined. Fails below ``minTokenAgreement``.
- Mean |Δlogprob| of the chosen token over the shared prefix: informational (how much the distributions moved).
"""

import math
import re
from dataclasses import dataclass

from kvcal.core.analysis.verdict import is_missing
from kvcal.models.spec import QualitySpec
from kvcal.models.status import Measurement
from kvcal.probes.schema import Probe

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_WORDS = re.compile(r"[^\w]+")


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: tuple[str, ...] = ()
    logprobs: tuple[float, ...] = ()
    finish_reason: str | None = None
    prompt_tokens: int = 0  # the server's usage count (0 where it gives none)
    completion_tokens: int = 0


@dataclass(frozen=True)
class ProbeResult:
    probe: Probe
    baseline: Completion
    canary: Completion


@dataclass(frozen=True)
class Agreement:
    matched: int
    compared: int
    abs_logprob_delta_sum: float
    logprob_pairs: int

    @property
    def rate(self) -> float:
        return self.matched / self.compared if self.compared else math.nan

    @property
    def mean_abs_logprob_delta(self) -> float:
        return self.abs_logprob_delta_sum / self.logprob_pairs if self.logprob_pairs else math.nan


def _numbers(text: str) -> list[float]:
    return [float(n) for n in _NUMBER.findall(text.replace(",", ""))]


def _normalize(text: str) -> str:
    return " ".join(_WORDS.sub(" ", text.lower()).split())


def score(probe: Probe, text: str) -> bool:
    """Does the reply answer the probe? (see MatchMode in kvcal.probes.schema)"""
    mode = probe.match_mode
    if mode == "number":
        # The answer is the first number the reply adds to the prompt's ("2 + 3 = 5" answers 5, not 2).
        given = set(_numbers(probe.prompt))
        found = _numbers(text)
        answer = next((n for n in found if n not in given), found[-1] if found else None)
        try:
            return answer is not None and math.isclose(answer, float(probe.expected))
        except ValueError:
            return False
    if mode == "exact":
        first = text.strip().splitlines()[0] if text.strip() else ""
        return _normalize(first) == _normalize(probe.expected)
    return f" {_normalize(probe.expected)} " in f" {_normalize(text)} "


def agreement(baseline: Completion, canary: Completion) -> Agreement:
    """Top-1 agreement and |Δlogprob| over the shared-context prefix of two greedy decodes."""
    matched = 0
    delta_sum, pairs = 0.0, 0
    for i, (b, c) in enumerate(zip(baseline.tokens, canary.tokens, strict=False)):
        if b != c:
            return Agreement(matched, matched + 1, delta_sum, pairs)
        matched += 1
        if i < len(baseline.logprobs) and i < len(canary.logprobs):
            delta_sum += abs(baseline.logprobs[i] - canary.logprobs[i])
            pairs += 1
    # One side stopped (end of sequence) where the other went on: that choice differed too.
    diverged = len(baseline.tokens) != len(canary.tokens) and min(len(baseline.tokens), len(canary.tokens)) > 0
    stopped_differently = diverged and "stop" in (baseline.finish_reason, canary.finish_reason)
    return Agreement(matched, matched + int(stopped_differently), delta_sum, pairs)


def _accuracy_message(results: list[ProbeResult]) -> str:
    groups: dict[str, list[int]] = {}
    for r in results:
        g = groups.setdefault(r.probe.label, [0, 0, 0])
        g[0] += score(r.probe, r.baseline.text)
        g[1] += score(r.probe, r.canary.text)
        g[2] += 1
    return ", ".join(f"{label} {b}/{n}->{c}/{n}" for label, (b, c, n) in groups.items())


def assess_quality(spec: QualitySpec, results: list[ProbeResult], *, at: str, suite: str) -> list[Measurement]:
    """Measurements ``accuracy`` and ``tokenAgreement`` (gating) and ``logprobDelta`` (informational)."""
    if not results:
        return [Measurement(metric="accuracy", phase="Inconclusive", at=at, message=f"suite {suite}: no probe ran")]
    n = len(results)
    base_acc = sum(score(r.probe, r.baseline.text) for r in results) / n
    canary_acc = sum(score(r.probe, r.canary.text) for r in results) / n
    floor = base_acc - spec.max_accuracy_drop
    accuracy = Measurement(
        metric="accuracy", phase="Successful" if canary_acc >= floor - 1e-9 else "Failed", at=at,
        baseline=base_acc, canary=canary_acc, threshold=floor, query=f"probes:{suite}",
        message=f"{n} probes: {_accuracy_message(results)}",
    )  # fmt: skip
    parts = [agreement(r.baseline, r.canary) for r in results]
    total = Agreement(
        sum(a.matched for a in parts), sum(a.compared for a in parts),
        sum(a.abs_logprob_delta_sum for a in parts), sum(a.logprob_pairs for a in parts),
    )  # fmt: skip
    if total.compared == 0:
        agree = Measurement(
            metric="tokenAgreement", phase="Inconclusive", at=at, threshold=spec.min_token_agreement,
            query=f"probes:{suite}", message="no tokens returned (does the server return logprobs/tokens?)",
        )  # fmt: skip
    else:
        ok = total.rate >= spec.min_token_agreement
        agree = Measurement(
            metric="tokenAgreement", phase="Successful" if ok else "Failed", at=at, baseline=1.0, canary=total.rate,
            threshold=spec.min_token_agreement, query=f"probes:{suite}",
            message=f"{total.matched}/{total.compared} top-1 tokens agree on the shared-context prefix",
        )  # fmt: skip
    delta = total.mean_abs_logprob_delta
    drift = Measurement(
        metric="logprobDelta", phase="Successful", at=at, baseline=0.0, canary=None if is_missing(delta) else delta,
        query=f"probes:{suite}", message=f"mean |Δlogprob| over {total.logprob_pairs} tokens (informational)",
    )  # fmt: skip
    return [accuracy, agree, drift]
