"""Numbers vLLM only prints in its log: the KV-cache capacity in tokens (that is what FP8 KV buys) and the
engine start-up time. Patterns match vLLM 0.32's lines on CPU and CUDA, e.g.
`[kv_cache_utils.py:2327] CPU KV cache size: 186,368 tokens, Maximum concurrency for 2,048 tokens per request: 91.00x`.
"""

import re

_KV_TOKENS = re.compile(r"\b(?:GPU|CPU|XPU|TPU|NPU|HPU)? ?KV cache size: ([\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
_KV_DTYPE = re.compile(r"\bkv_cache_dtype=(\w+)")


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def kv_cache_tokens(log: str) -> int | None:
    """Total KV-cache capacity in tokens (summed if several engines/workers logged one each)."""
    found = [_int(m[1]) for m in _KV_TOKENS.finditer(log)]
    return sum(found) if found else None


def max_concurrency(log: str) -> tuple[int, float] | None:
    """(tokens per request, how many such requests fit in the KV cache at once)."""
    match = _CONCURRENCY.search(log)
    return (_int(match[1]), float(match[2])) if match else None


def engine_init_seconds(log: str) -> float | None:
    match = _INIT.search(log)
    return float(match[1]) if match else None


def engine_kv_cache_dtype(log: str) -> str | None:
    """The kv_cache_dtype the engine was configured with (after vLLM's own overrides)."""
    match = _KV_DTYPE.search(log)
    return match[1] if match else None
