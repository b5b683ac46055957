"""The KV capacity check: FP8 KV must really be in effect in the canary.

vLLM reports its KV cache on ``vllm:cache_config_info`` (labels ``cache_dtype``, ``kv_cache_size_tokens``,
``kv_cache_memory_bytes``, ...). In the same KV space an FP8 cache holds twice the tokens of a BF16 one, so a canary
whose FP8 KV silently did not apply shows it here: its token count stays the baseline's. The check compares the
canary's tokens with ``minRatio`` x the BF16 baseline's.

A baseline that already stores FP8 KV (e.g. after an earlier promotion) is compared through its BF16 equivalent:
its tokens x (its bytes per KV element / 2), so an FP8 baseline needs a canary at >= minRatio / 2 of its tokens,
i.e. a canary that does not lose the capacity FP8 won. ``auto`` is taken as a 16-bit model dtype.

Missing series (no pod of a role reports it yet, or Prometheus returned nothing) is Inconclusive, never a pass.
Pods of one role that disagree are judged by the canary pod with the fewest tokens and the baseline pod with the
most (BF16-equivalent) tokens: one canary pod without FP8 is enough to fail.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from kvcal.core.guard.redact import redact
from kvcal.models.spec import CapacityCheck
from kvcal.models.status import CapacityStatus, KVCacheRole, Measurement

METRIC = "kvCapacity"
BF16_BYTES = 2
# Bytes per KV element by vLLM's --kv-cache-dtype; 'auto' follows the model dtype (16-bit for served LLMs).
_ELEMENT_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


def element_bytes(cache_dtype: str) -> int | None:
    """Bytes per KV element of a vLLM cache dtype (every fp8* variant is 1); None when unknown."""
    if cache_dtype.startswith("fp8"):
        return 1
    return _ELEMENT_BYTES.get(cache_dtype)


@dataclass(frozen=True)
class KVCacheConfig:
    """One distinct ``vllm:cache_config_info`` of a role's pods."""

    cache_dtype: str
    tokens: int
    memory_bytes: int | None = None
    max_concurrency: float | None = None
    skip_layers: str = "[]"

    @property
    def bytes_per_token(self) -> float | None:
        return self.memory_bytes / self.tokens if self.memory_bytes and self.tokens > 0 else None

    def role(self) -> KVCacheRole:
        return KVCacheRole(
            cache_dtype=self.cache_dtype, kv_tokens=self.tokens, kv_bytes=self.memory_bytes,
            bytes_per_token=_rounded(self.bytes_per_token), max_concurrency=self.max_concurrency,
        )  # fmt: skip


@dataclass(frozen=True)
class KVCacheReadings:
    """What Prometheus returned for each role; ``error`` when it could not be asked."""

    baseline: tuple[KVCacheConfig, ...] = ()
    canary: tuple[KVCacheConfig, ...] = ()
    query: str | None = None  # the canary's query, kept with the measurement
    error: str | None = None


def _number(value: str | None) -> float | None:
    """A label's number; None for vLLM's 'None', empty or absent."""
    if value is None or value in ("", "None"):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def parse_cache_config(labels: Mapping[str, str]) -> KVCacheConfig | None:
    """The labels of one ``vllm:cache_config_info`` series; None when it carries no token count (older vLLM)."""
    tokens = _number(labels.get("kv_cache_size_tokens"))
    if tokens is None or tokens <= 0:
        return None
    memory = _number(labels.get("kv_cache_memory_bytes"))
    return KVCacheConfig(
        cache_dtype=labels.get("cache_dtype", "auto"),
        tokens=int(tokens),
        memory_bytes=int(memory) if memory else None,
        max_concurrency=_number(labels.get("kv_cache_max_concurrency")),
        skip_layers=labels.get("kv_cache_dtype_skip_layers", "[]"),
    )


def _bf16_equivalent(config: KVCacheConfig) -> float | None:
    size = element_bytes(config.cache_dtype)
    return None if size is None else config.tokens * size / BF16_BYTES


def capacity_status(readings: KVCacheReadings, at: str) -> CapacityStatus | None:
    """What status.capacity shows; None when neither role reported anything (the last reading stays)."""
    if not readings.baseline and not readings.canary:
        return None
    canary = min(readings.canary, key=lambda config: config.tokens, default=None)
    baseline = max(readings.baseline, key=lambda config: _bf16_equivalent(config) or 0.0, default=None)
    ratio = round(canary.tokens / baseline.tokens, 3) if canary and baseline else None
    return CapacityStatus(
        measured_at=at,
        baseline=baseline.role() if baseline else None,
        canary=canary.role() if canary else None,
        token_ratio=ratio,
    )


def assess_capacity(check: CapacityCheck, readings: KVCacheReadings, at: str) -> Measurement:
    """Successful when the canary holds at least minRatio x the baseline's BF16-equivalent KV tokens."""

    def measurement(phase: str, message: str, **values: float | None) -> Measurement:
        return Measurement.model_validate(
            {"metric": METRIC, "phase": phase, "at": at, "query": readings.query, "message": message, **values}
        )

    if readings.error:
        return measurement("Error", redact(readings.error)[:500])  # the adapter's fixed text; redact: second line
    absent = [role for role, configs in (("baseline", readings.baseline), ("canary", readings.canary)) if not configs]
    if absent:
        return measurement(
            "Inconclusive", f"no vllm:cache_config_info with kv_cache_size_tokens for {' and '.join(absent)}"
        )
    canary = min(readings.canary, key=lambda config: config.tokens)
    baseline = max(readings.baseline, key=lambda config: _bf16_equivalent(config) or 0.0)
    equivalent = _bf16_equivalent(baseline)
    if equivalent is None:
        return measurement(
            "Inconclusive", f"baseline cache_dtype {baseline.cache_dtype!r}: unknown bytes per KV element",
            baseline=baseline.tokens, canary=canary.tokens,
        )  # fmt: skip
    required = check.min_ratio * equivalent
    ratio = canary.tokens / baseline.tokens
    needed = f"needs >= {required / baseline.tokens:.2f}x"
    if baseline.cache_dtype != "auto" and element_bytes(baseline.cache_dtype) != BF16_BYTES:
        needed += f": minRatio {check.min_ratio:g} x the {baseline.cache_dtype} baseline's BF16 equivalent"
    values = {"baseline": float(baseline.tokens), "canary": float(canary.tokens), "threshold": round(required, 1)}
    summary = (
        f"canary {canary.tokens} KV tokens ({canary.cache_dtype}) vs baseline {baseline.tokens} "
        f"({baseline.cache_dtype}): {ratio:.2f}x, {needed}"
    )
    if canary.skip_layers not in ("[]", ""):
        summary += f"; canary skips layers {canary.skip_layers}"
    if canary.tokens >= required:
        return measurement("Successful", summary, **values)
    return measurement("Failed", f"FP8 KV did not take effect: {summary}", **values)


def with_capacity(
    check: CapacityCheck, readings: KVCacheReadings | None, new: list[Measurement], at: str
) -> list[Measurement]:
    """An interval's measurements plus the capacity check: when it is enabled, an interval is being assessed and
    the KV cache was read (no metrics backend, no reading: nothing to check)."""
    if not new or readings is None or not check.enabled:
        return new
    return [*new, assess_capacity(check, readings, at)]
