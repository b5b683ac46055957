"""Length coverage: do the calibration samples reach the context lengths the service serves?

Scales come from the largest |K|/|V| the calibration saw, and outliers grow with position (long prompts, attention
sinks, RoPE at large angles); a calibration that stops far below the served context has not seen the K/V a long
request writes. "Far below" is a fixed fraction, documented in docs/concepts.md."""

from collections.abc import Sequence

from pydantic import Field

from kvcal.models.base import Model

# Warn when the longest calibration sample is shorter than this share of the longest context served.
FAR_BELOW_FRACTION = 0.25


class LengthCoverage(Model):
    served_context_tokens: int = Field(description="Longest context the service serves (vLLM --max-model-len)")
    served_context_source: str = Field(description="'maxModelLen' (given) or 'max_position_embeddings' (model)")
    longest_sample_tokens: int = Field(description="Longest calibration sample as calibrated (after truncation)")
    median_sample_tokens: int
    covered_fraction: float = Field(description="longestSampleTokens / servedContextTokens")
    warning: str | None = Field(default=None, description="Set when calibration stops far below the served context")


def length_coverage(
    lengths: Sequence[int], served: int, source: str, max_seq_length: int, truncated: int
) -> LengthCoverage:
    """`lengths`: token lengths of the calibration samples as calibrated; `truncated`: how many were cut."""
    ordered = sorted(lengths)
    longest = ordered[-1] if ordered else 0
    fraction = longest / served if served > 0 else 1.0
    warning = None
    if fraction < FAR_BELOW_FRACTION:
        fix = (
            f"raise --max-seq-length (now {max_seq_length}; {truncated} samples were cut)"
            if truncated
            else "add longer calibration samples"
        )
        warning = (
            f"calibration stops at {longest} tokens, under {FAR_BELOW_FRACTION:.0%} of the {served}-token context "
            f"served ({source}): long requests may write K/V beyond the calibrated range; {fix}"
        )
    return LengthCoverage(
        served_context_tokens=served,
        served_context_source=source,
        longest_sample_tokens=longest,
        median_sample_tokens=ordered[len(ordered) // 2] if ordered else 0,
        covered_fraction=round(fraction, 4),
        warning=warning,
    )
