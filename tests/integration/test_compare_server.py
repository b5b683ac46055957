"""The shared vLLM server (tests.support.vllm) and the compare client against it: real vLLM 0.32 serving the
calibrated demo checkpoint, with FP8 KV where the CPU can store it (BF16 KV elsewhere)."""

from pathlib import Path

import pytest

from kvcal.compare import logparse
from kvcal.compare.client import OpenAIClient
from kvcal.compare.server import VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.model, pytest.mark.slow]


def test_server_runs_fp8_kv_and_reports_capacity(fp8_vllm: None, vllm_server: VllmServer) -> None:
    log = vllm_server.log_text()
    assert logparse.engine_kv_cache_dtype(log) == "fp8"
    tokens = logparse.kv_cache_tokens(log)
    assert tokens is not None and tokens > 2048


def test_prompt_scores_and_streamed_chat(vllm_server: VllmServer) -> None:
    client = OpenAIClient(vllm_server.url)
    try:
        text = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome."
        scores = client.prompt_scores(text)
        n = client.count_tokens(text)
        assert len(scores.token_logprobs) == len(scores.top1) == n - 1  # every token but the first
        assert all(lp <= 0 for lp in scores.token_logprobs)
        assert scores == client.prompt_scores(text)  # greedy and deterministic
        reply = client.chat([{"role": "user", "content": "What is the capital of France? One word."}], 8)
        assert reply.text and reply.prompt_tokens and reply.prompt_tokens > 5
        assert 0 < reply.ttft <= reply.e2e
    finally:
        client.close()


def test_server_logs_to_file(vllm_server: VllmServer) -> None:
    assert Path(vllm_server.log_path).is_file()
    assert f"kv_cache_dtype={vllm_server.config.kv_cache_dtype}" in vllm_server.log_text()
