"""Where status.capacity shows: `kvcal status`, the operator's metrics, the Grafana dashboard."""

import json
from pathlib import Path

from kvcal.core.analysis.capacity import KVCacheConfig, KVCacheReadings, capacity_status
from kvcal.ctl import render_status
from kvcal.metrics import OperatorMetrics

ROOT = Path(__file__).resolve().parents[2]
BF16 = KVCacheConfig("auto", 93184, 2147483648, 45.5)
FP8 = KVCacheConfig("fp8", 186368, 2147483648, 91.0)
CAPACITY = capacity_status(KVCacheReadings(baseline=(BF16,), canary=(FP8,)), "2026-01-02T03:04:05Z")


def test_kvcal_status_shows_tokens_and_bytes_per_token_for_both_roles() -> None:
    assert CAPACITY is not None
    obj = {
        "metadata": {"name": "m", "namespace": "llm"},
        "status": {"phase": "Analyzing", "capacity": CAPACITY.to_wire()},
    }
    text = render_status(obj)
    assert "KV capacity (2026-01-02T03:04:05Z)" in text
    assert "baseline: auto KV, 93184 tokens, 23045.6 bytes/token, max concurrency 45.5" in text
    assert "canary: fp8 KV, 186368 tokens, 11522.8 bytes/token, max concurrency 91.0" in text
    assert "canary/baseline: 2.00x (check needs >= 1.8x a BF16 baseline)" in text
    obj["spec"] = {"analysis": {"capacity": {"enabled": False}}}
    assert "(check disabled)" in render_status(obj)
    assert "KV capacity" not in render_status({"metadata": {}, "status": {"phase": "Pending"}})


def test_operator_metrics_export_and_forget_the_capacity() -> None:
    metrics = OperatorMetrics()

    def value(metric: str, role: str) -> float | None:
        labels = {"namespace": "llm", "name": "m", "role": role}
        return metrics.registry.get_sample_value(metric, labels)

    metrics.set_capacity("llm", "m", CAPACITY)
    assert value("kvcal_kv_cache_tokens", "canary") == 186368
    assert value("kvcal_kv_cache_bytes_per_token", "baseline") == 23045.6
    metrics.set_capacity("llm", "m", None)
    assert value("kvcal_kv_cache_tokens", "canary") is None


def test_dashboard_has_a_capacity_panel_on_the_operator_metrics() -> None:
    dashboard = json.loads((ROOT / "dashboards" / "kvcal.json").read_text())
    (panel,) = [p for p in dashboard["panels"] if p["title"].startswith("KV capacity")]
    exprs = " ".join(target["expr"] for target in panel["targets"])
    assert "kvcal_kv_cache_tokens" in exprs and "kvcal_kv_cache_bytes_per_token" in exprs
