"""The optional saturation check (core/analysis/saturation.py): report values, gate only when the spec asks."""

import pytest

from kvcal.core.analysis import promql
from kvcal.core.analysis.saturation import Load, assess_saturation
from kvcal.models.spec import AnalysisSpec, SaturationCheck

AT = "2026-01-02T03:04:05Z"
QUERIES = {"running": "q-running", "waiting": "q-waiting", "preemptions": "q-preemptions"}
# Near the baseline's KV limit: BF16 queues and preempts, FP8 (twice the tokens) keeps everything running.
BF16 = Load(running=4.0, waiting=3.0, preemptions=12.0, requests=100.0)
FP8 = Load(running=7.0, waiting=0.2, preemptions=0.0, requests=100.0)


def assess(mode: str, baseline: Load, canary: Load, **check: float) -> dict[str, tuple[str, str]]:
    spec = SaturationCheck.model_validate({"mode": mode, **check})
    out = assess_saturation(spec, baseline, canary, min_requests=50, at=AT, queries=QUERIES)
    return {m.metric: (m.phase, m.message or "") for m in out}


def test_off_by_default() -> None:
    assert AnalysisSpec().saturation.mode == "disabled"


def test_report_records_values_without_a_verdict() -> None:
    out = assess_saturation(SaturationCheck(mode="report"), FP8, BF16, min_requests=50, at=AT, queries=QUERIES)
    by_metric = {m.metric: m for m in out}
    assert set(by_metric) == {"runningPerPod", "waitingPerPod", "preemptionsPerRequest"}  # no gating verdict
    assert (by_metric["preemptionsPerRequest"].baseline, by_metric["preemptionsPerRequest"].canary) == (0.0, 0.12)
    assert by_metric["waitingPerPod"].query == "q-waiting"


def test_gate_passes_a_canary_that_saturates_later() -> None:
    phase, message = assess("gate", BF16, FP8)["saturation"]
    assert phase == "Successful"
    assert (
        "waiting per pod: canary 0.20 vs baseline 3.00" in message
        and "preemptions per request: canary 0.000" in message
    )


@pytest.mark.parametrize(
    ("canary", "why"),
    [
        (Load(running=4.0, waiting=5.0, preemptions=12.0, requests=100.0), "waiting per pod: canary 5.00"),
        (Load(running=4.0, waiting=3.0, preemptions=30.0, requests=100.0), "preemptions per request: canary 0.300"),
    ],
)
def test_gate_fails_a_canary_that_queues_or_preempts_more(canary: Load, why: str) -> None:
    phase, message = assess("gate", BF16, canary)["saturation"]
    assert phase == "Failed" and message.startswith("the canary saturates before the baseline") and why in message


def test_noise_floors_let_an_idle_pair_pass() -> None:
    idle = Load(running=0.5, waiting=0.0, preemptions=0.0, requests=60.0)
    slightly_busier = Load(running=0.6, waiting=0.4, preemptions=0.0, requests=60.0)
    assert assess("gate", idle, slightly_busier)["saturation"][0] == "Successful"


@pytest.mark.parametrize(
    "canary",
    [
        Load(running=1.0, waiting=None, preemptions=0.0, requests=100.0),
        Load(running=1.0, waiting=0.0, preemptions=None, requests=100.0),
        Load(running=1.0, waiting=0.0, preemptions=0.0, requests=10.0),  # < minRequests
        Load(running=1.0, waiting=float("nan"), preemptions=0.0, requests=100.0),
    ],
)
def test_missing_data_or_too_few_requests_is_inconclusive(canary: Load) -> None:
    assert assess("gate", BF16, canary)["saturation"][0] == "Inconclusive"


def test_queries_are_per_pod_means_under_either_name_form() -> None:
    selector = 'namespace="llm",kvcal_dev_calibration="llm",role="canary"'
    waiting = promql.render_named("requests_waiting", selector, "60s")
    assert waiting == f'avg(avg_over_time({{__name__=~"vllm[:_]num_requests_waiting",{selector}}}[60s]))'
    assert "num_requests_running" in promql.render_named("requests_running", selector, "60s")
    config = promql.render_kv_cache_config(selector)
    assert config.startswith("max by (cache_dtype, kv_cache_size_tokens, kv_cache_memory_bytes,")
    assert f'{{__name__=~"vllm[:_]cache_config_info",{selector}}}' in config
