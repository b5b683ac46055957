"""Pure scoring of one served configuration against the BF16 baseline: prompt-logprob deltas, top-1 agreement,
probe exact match, needle retrieval, latency percentiles. No I/O here."""

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PromptScores:
    """vLLM's prompt logprobs for one text: per position, the logprob of the actual next token and the top-1 token.
    Position 0 has no logprob (nothing precedes it) and is left out."""

    token_logprobs: tuple[float, ...]
    top1: tuple[int, ...]


@dataclass(frozen=True)
class LogprobDelta:
    positions: int
    mean_abs: float  # mean |logprob_fp8 - logprob_bf16| of the actual tokens
    mean: float  # mean logprob_fp8 - logprob_bf16: negative = FP8 finds the real text less likely
    max_abs: float
    top1_agreement: float  # fraction of positions where FP8's most likely next token is BF16's


def logprob_delta(baseline: Sequence[PromptScores], candidate: Sequence[PromptScores]) -> LogprobDelta:
    if len(baseline) != len(candidate):
        raise ValueError(f"baseline has {len(baseline)} texts, candidate {len(candidate)}: score the same texts")
    diffs: list[float] = []
    agree = 0
    for base, cand in zip(baseline, candidate, strict=True):
        n = min(len(base.token_logprobs), len(cand.token_logprobs))
        diffs += [c - b for b, c in zip(base.token_logprobs[:n], cand.token_logprobs[:n], strict=True)]
        agree += sum(b == c for b, c in zip(base.top1[:n], cand.top1[:n], strict=True))
    if not diffs:
        return LogprobDelta(0, math.nan, math.nan, math.nan, math.nan)
    return LogprobDelta(
        positions=len(diffs),
        mean_abs=sum(abs(d) for d in diffs) / len(diffs),
        mean=sum(diffs) / len(diffs),
        max_abs=max(abs(d) for d in diffs),
        top1_agreement=agree / len(diffs),
    )


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100), as numpy's default; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def fraction(flags: Sequence[bool]) -> float:
    return sum(flags) / len(flags) if flags else math.nan
