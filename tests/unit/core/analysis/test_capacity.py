"""The KV capacity check (core/analysis/capacity.py) on vLLM's real cache_config_info labels, and in decide()."""

from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvcal.core.analysis.capacity import (
    KVCacheConfig,
    KVCacheReadings,
    assess_capacity,
    capacity_status,
    element_bytes,
    parse_cache_config,
    with_capacity,
)
from kvcal.core.decide import decide
from kvcal.core.observations import Decision
from kvcal.models.spec import CapacityCheck
from kvcal.models.status import AnalysisStatus, Phase
from tests.support.decide import ANALYZING, NOW, canary, m, observations, spec

DATA = Path(__file__).resolve().parents[3] / "data" / "vllm-0.32-cpu"
AT = "2026-01-02T03:04:05Z"


def cache_config(fixture: str) -> KVCacheConfig:
    """The one vllm:cache_config_info series of a real /metrics page, through the parser."""
    text = (DATA / fixture).read_text()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "vllm:cache_config_info"]
    (sample,) = family.samples
    config = parse_cache_config(sample.labels)
    assert config is not None
    return config


BF16 = cache_config("metrics-bf16.txt")
FP8 = cache_config("metrics-fp8-calibrated.txt")


def readings(baseline: tuple[KVCacheConfig, ...], canary_: tuple[KVCacheConfig, ...]) -> KVCacheReadings:
    return KVCacheReadings(baseline=baseline, canary=canary_, query="max by (cache_dtype) (...)")


def test_real_labels_parse_to_tokens_and_bytes_per_token() -> None:
    assert (BF16.cache_dtype, BF16.tokens, BF16.memory_bytes, BF16.max_concurrency) == ("auto", 93184, 2**31, 45.5)
    assert (FP8.cache_dtype, FP8.tokens, FP8.max_concurrency) == ("fp8", 186368, 91.0)
    assert BF16.bytes_per_token == pytest.approx(2 * (FP8.bytes_per_token or 0))
    assert BF16.bytes_per_token == pytest.approx(23045.6, abs=0.1)


def test_labels_without_tokens_or_memory() -> None:
    assert parse_cache_config({"cache_dtype": "fp8"}) is None  # an older vLLM: nothing to compare
    gpu = parse_cache_config({"cache_dtype": "fp8", "kv_cache_size_tokens": "1000", "kv_cache_memory_bytes": "None"})
    assert gpu is not None and gpu.memory_bytes is None and gpu.bytes_per_token is None


def test_fp8_beside_bf16_passes_with_both_numbers() -> None:
    result = assess_capacity(CapacityCheck(), readings((BF16,), (FP8,)), AT)
    assert result.phase == "Successful", result
    assert (result.baseline, result.canary) == (93184, 186368)
    assert result.threshold == pytest.approx(1.8 * 93184, abs=0.1)
    assert "2.00x" in (result.message or "") and "needs >= 1.80x" in (result.message or "")


def test_fp8_that_did_not_take_effect_fails_naming_both_numbers() -> None:
    result = assess_capacity(CapacityCheck(), readings((BF16,), (BF16,)), AT)
    assert result.phase == "Failed"
    assert result.message is not None and result.message.startswith("FP8 KV did not take effect")
    assert "canary 93184 KV tokens (auto) vs baseline 93184 (auto): 1.00x, needs >= 1.80x" in result.message


@pytest.mark.parametrize(
    ("canary_tokens", "min_ratio", "phase"),
    [(167731, 1.8, "Failed"), (167732, 1.8, "Successful"), (163072, 1.75, "Successful"), (186368, 2.0, "Successful")],
)
def test_threshold_is_min_ratio_times_the_baseline(canary_tokens: int, min_ratio: float, phase: str) -> None:
    tuned = replace(FP8, tokens=canary_tokens)  # 1.8 x 93184 = 167731.2
    assert assess_capacity(CapacityCheck(min_ratio=min_ratio), readings((BF16,), (tuned,)), AT).phase == phase


@pytest.mark.parametrize(
    ("baseline", "canary_", "missing"),
    [((), (FP8,), "baseline"), ((BF16,), (), "canary"), ((), (), "baseline and canary")],
)
def test_missing_series_is_inconclusive_never_a_pass(
    baseline: tuple[KVCacheConfig, ...], canary_: tuple[KVCacheConfig, ...], missing: str
) -> None:
    result = assess_capacity(CapacityCheck(), readings(baseline, canary_), AT)
    assert result.phase == "Inconclusive" and f"for {missing}" in (result.message or "")


def test_unreadable_prometheus_is_an_error() -> None:
    result = assess_capacity(CapacityCheck(), KVCacheReadings(error="Prometheus unreachable: ConnectError"), AT)
    assert result.phase == "Error" and "unreachable" in (result.message or "")


def test_an_fp8_baseline_is_compared_through_its_bf16_equivalent() -> None:
    # After a promotion the baseline already stores FP8 KV: a new FP8 canary keeps the capacity (1.00x) and passes;
    # one whose FP8 did not apply (half the tokens) fails.
    kept = assess_capacity(CapacityCheck(), readings((FP8,), (FP8,)), AT)
    assert kept.phase == "Successful" and "needs >= 0.90x" in (kept.message or "")
    assert "the fp8 baseline's BF16 equivalent" in (kept.message or "")
    lost = assess_capacity(CapacityCheck(), readings((FP8,), (BF16,)), AT)
    assert lost.phase == "Failed" and "0.50x" in (lost.message or "")


def test_one_canary_pod_without_fp8_fails_the_role() -> None:
    result = assess_capacity(CapacityCheck(), readings((BF16,), (FP8, BF16)), AT)
    assert result.phase == "Failed" and result.canary == 93184


def test_unknown_baseline_dtype_is_inconclusive() -> None:
    odd = replace(BF16, cache_dtype="nvfp4")
    assert element_bytes("nvfp4") is None and element_bytes("fp8_e5m2") == 1 and element_bytes("auto") == 2
    result = assess_capacity(CapacityCheck(), readings((odd,), (FP8,)), AT)
    assert result.phase == "Inconclusive" and "nvfp4" in (result.message or "")


def test_status_shows_tokens_and_bytes_per_token_for_both_roles() -> None:
    status = capacity_status(readings((BF16,), (FP8,)), AT)
    assert status is not None and status.token_ratio == 2.0 and status.measured_at == AT
    assert status.baseline is not None and status.canary is not None
    assert (status.baseline.kv_tokens, status.canary.kv_tokens) == (93184, 186368)
    assert (status.baseline.bytes_per_token, status.canary.bytes_per_token) == (23045.6, 11522.8)
    assert status.to_wire()["canary"] == {
        "cacheDtype": "fp8", "kvTokens": 186368, "kvBytes": 2147483648, "bytesPerToken": 11522.8,
        "maxConcurrency": 91.0,
    }  # fmt: skip
    assert capacity_status(KVCacheReadings(), AT) is None


def test_added_to_an_interval_only_when_enabled_and_read() -> None:
    interval = [m("Successful")]
    both = readings((BF16,), (FP8,))
    assert [x.metric for x in with_capacity(CapacityCheck(), both, interval, AT)] == ["ttft-p95", "kvCapacity"]
    assert with_capacity(CapacityCheck(enabled=False), both, interval, AT) == interval
    assert with_capacity(CapacityCheck(), None, interval, AT) == interval  # no metrics backend
    assert with_capacity(CapacityCheck(), both, [], AT) == []  # no interval due


def analyzing(canary_kv: KVCacheConfig, failures: int = 0) -> Decision:
    """One due interval in Analyzing: a Successful latency measurement and the roles' KV caches."""
    start = ANALYZING.model_copy(update={"analysis": AnalysisStatus(started_at=AT, failures=failures)})
    obs = replace(
        observations(canary=canary(), measurements=(m("Successful"),)), kv_cache=readings((BF16,), (canary_kv,))
    )
    return decide(spec(), start, obs, NOW)


def test_decide_rolls_back_a_canary_without_effective_fp8() -> None:
    first = analyzing(BF16).status
    assert first.phase == Phase.ANALYZING and first.analysis.measurements[-1].phase == "Failed"  # failureLimit 1
    second = analyzing(BF16, failures=1).status
    assert second.phase == Phase.ROLLING_BACK
    assert "kvCapacity: FP8 KV did not take effect: canary 93184 KV tokens" in second.history[-1].message
    assert second.capacity.canary is not None and second.capacity.canary.kv_tokens == 93184
    assert second.capacity.token_ratio == 1.0


def test_decide_keeps_an_fp8_canary_and_records_its_capacity() -> None:
    status = analyzing(FP8).status
    assert status.phase == Phase.ANALYZING
    assert [(x.metric, x.phase) for x in status.analysis.measurements] == [
        ("ttft-p95", "Successful"), ("kvCapacity", "Successful"),
    ]  # fmt: skip
    assert status.capacity.token_ratio == 2.0


def test_no_interval_no_status_change() -> None:
    """Held metrics (nothing new this pass) but a KV reading: the status stays as it was (no write, no loop)."""
    start = ANALYZING.model_copy(update={"analysis": AnalysisStatus(started_at=AT)})
    obs = replace(observations(canary=canary()), kv_cache=readings((BF16,), (FP8,)))
    assert decide(spec(), start, obs, NOW).status.capacity == start.capacity
