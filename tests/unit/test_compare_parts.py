"""The pure parts of `kvcal compare`: vLLM log parsing (on real vLLM 0.32 logs), prompt-logprob parsing and
scoring, percentiles, the variant plan, holdout parsing and the rendered table."""

import math
from pathlib import Path
from typing import Any

import pytest

from kvcal.compare import logparse, report, run, workload
from kvcal.compare.client import parse_prompt_logprobs
from kvcal.compare.metrics import PromptScores, logprob_delta, percentile

DATA = Path(__file__).parents[1] / "data" / "vllm-0.32-cpu"


@pytest.mark.parametrize(
    ("log", "tokens", "dtype"),
    [
        ("log-bf16.txt", 93_184, "auto"),
        ("log-fp8-default.txt", 186_368, "fp8"),
        ("log-fp8-calibrated.txt", 186_368, "fp8"),
    ],
)
def test_kv_cache_capacity_from_real_logs(log: str, tokens: int, dtype: str) -> None:
    text = (DATA / log).read_text()
    assert logparse.kv_cache_tokens(text) == tokens
    assert logparse.engine_kv_cache_dtype(text) == dtype
    per_request, concurrency = logparse.max_concurrency(text) or (0, 0.0)
    assert per_request == 2048 and concurrency == pytest.approx(tokens / 2048, rel=0.01)


def test_engine_init_seconds_and_gpu_wording() -> None:
    assert logparse.engine_init_seconds((DATA / "log-bf16.txt").read_text()) == pytest.approx(81.84)
    gpu = "INFO [kv_cache_utils.py:1087] GPU KV cache size: 1,234,560 tokens"
    assert logparse.kv_cache_tokens(gpu) == 1_234_560
    assert logparse.kv_cache_tokens("no such line") is None


def test_prompt_logprobs_with_and_without_token_ids() -> None:
    entries = [
        None,
        {"11": {"logprob": -0.5, "rank": 1, "decoded_token": "a"}},  # actual token is the top-1
        {"12": {"logprob": -3.0, "rank": 4, "decoded_token": "b"}, "13": {"logprob": -0.2, "rank": 1}},
    ]
    with_ids = parse_prompt_logprobs(entries, [10, 11, 12])
    assert with_ids == PromptScores((-0.5, -3.0), (11, 13))
    assert parse_prompt_logprobs(entries, None) == with_ids


def test_logprob_delta_and_top1_agreement() -> None:
    base = [PromptScores((-1.0, -2.0, -0.5), (1, 2, 3))]
    cand = [PromptScores((-1.5, -2.0, -0.25), (1, 9, 3))]
    delta = logprob_delta(base, cand)
    assert delta.positions == 3
    assert delta.top1_agreement == pytest.approx(2 / 3)
    assert delta.mean_abs == pytest.approx(0.25)
    assert delta.mean == pytest.approx(-0.25 / 3)
    assert delta.max_abs == pytest.approx(0.5)
    assert math.isnan(logprob_delta([], []).mean_abs)
    with pytest.raises(ValueError, match="same texts"):
        logprob_delta(base, [])


def test_percentile_matches_linear_interpolation() -> None:
    values = [0.1, 0.2, 0.3, 0.4, 1.0]
    assert percentile(values, 50) == pytest.approx(0.3)
    assert percentile(values, 95) == pytest.approx(0.88)
    assert math.isnan(percentile([], 50))


def test_plan_on_cpu_skips_per_head_with_the_reason(tmp_path: Path) -> None:
    variants = run.plan(tmp_path / "m", tmp_path / "c", None, "cpu", None)
    assert [v.name for v in variants] == ["bf16", "fp8-default", "fp8-calibrated-tensor", "fp8-calibrated-head"]
    assert variants[0].kv_cache_dtype == "auto" and variants[1].kv_cache_dtype == "fp8"
    assert variants[1].model == variants[0].model  # FP8 at scale 1.0 = the BF16 model with fp8 KV
    assert variants[3].skipped == "CPU backend collapses per-head scales to per-tensor (the max over heads)"


def test_fp8_needs_avx512_or_amx_on_cpu() -> None:
    assert run.cpu_fp8_support("flags\t: fpu sse avx2 avx512f avx512bw\n") is None
    reason = run.cpu_fp8_support("flags\t: fpu sse avx2\n")
    assert reason is not None and "AVX-512 or AMX" in reason
    variants = run.plan(Path("m"), Path("c"), None, "cpu", reason)
    assert [v.skipped == reason for v in variants[:3]] == [False, True, True]


def test_holdout_parsing_and_errors() -> None:
    items = workload.parse_holdout(
        ['{"text": "abcdef"}', "", '{"messages": [{"role": "user", "content": "hi"}]}'], "f", 4
    )
    assert items[0].text == "abcd" and items[1].messages == ({"role": "user", "content": "hi"},)
    with pytest.raises(ValueError, match="f:1: needs a 'text'"):
        workload.parse_holdout(['{"prompt": "x"}'], "f", 10)
    with pytest.raises(ValueError, match="f:1: not JSON"):
        workload.parse_holdout(["nope"], "f", 10)
    assert len(workload.load_holdout(None, 100, 3)) == 3  # the bundled held-out set


def test_needle_lengths_reach_near_the_limit() -> None:
    assert workload.needle_lengths(8192) == [512, 1024, 2048, 4096, 6963]
    assert workload.needle_lengths(2048)[-1] == 1740


def test_table_lists_configs_and_skips() -> None:
    rows: list[dict[str, Any]] = [
        {"name": "bf16", "status": "ok", "kvCacheTokens": 93184, "exactMatch": 0.5, "needle": {"512": 1.0}},
        {
            "name": "fp8-calibrated-tensor",
            "status": "ok",
            "kvCacheTokens": 186368,
            "positions": 10,
            "top1Agreement": 0.97,
            "logprobDeltaMeanAbs": 0.01,
            "sameAsBf16": 0.9,
            "needle": {"512": 0.5},
        },
        {"name": "fp8-calibrated-head", "status": "skipped: CPU backend collapses per-head"},
    ]
    text = report.table(rows)
    assert "186,368" in text and "97.0%" in text and "needle @ 512 tokens" in text
    assert text.splitlines()[-1] == "fp8-calibrated-head: skipped: CPU backend collapses per-head"
    md = report.markdown(rows, "t", ["ctx"])
    assert "| KV cache capacity (tokens) | 93,184 | 186,368 | - |" in md


def test_summarize_scores_against_the_baseline() -> None:
    from kvcal.compare.client import Generation
    from kvcal.probes import Probe

    probes = [
        Probe(id="qa", kind="qa", prompt="Capital of France?", expected="Paris"),
        Probe(id="n1", kind="needle", prompt="...", expected="4721", context_tokens=512),
        Probe(id="n2", kind="needle", prompt="...", expected="4721", context_tokens=8000),
    ]

    def reply(text: str) -> Generation:
        return Generation(text, 10, 0.1, 0.5, (0.02, 0.04))

    base = run.Observed(run.Variant("bf16", Path("m"), "auto"), [PromptScores((-1.0, -2.0), (1, 2))])
    base.replies = {"qa": reply("Paris."), "n1": reply("The code is 4721"), "n2": reply("no idea")}
    fp8 = run.Observed(run.Variant("fp8", Path("m"), "fp8"), [PromptScores((-1.5, -2.0), (1, 3))])
    fp8.replies = {"qa": reply("Lyon."), "n1": reply("The code is 4721")}
    fp8.errors = {"n2": "HTTP 400: prompt too long"}  # an error is not a miss: left out of the needle score
    row = run.summarize(fp8, base, probes)
    assert row["top1Agreement"] == 0.5 and row["logprobDeltaMeanAbs"] == 0.25
    assert row["exactMatch"] == 0.0 and row["sameAsBf16"] == 0.3333
    assert row["needle"] == {"512": 1.0}
    assert row["latency"]["requests"] == 1 and row["latency"]["itlP50"] == 0.03
    assert row["replies"]["qa"] == "Lyon."
    assert run._max_tokens(probes[1]) == 32 and run._max_tokens(probes[0]) == probes[0].max_tokens


def test_explicit_kv_bytes_replace_the_gib_env(tmp_path: Path) -> None:
    # vLLM's CPU platform lets VLLM_CPU_KVCACHE_SPACE override --kv-cache-memory-bytes (benchmarks/bench_capacity.py)
    from kvcal.compare.server import ServerConfig, VllmServer

    exact = VllmServer(ServerConfig(tmp_path, kv_cache_memory_bytes=64 * 2**20), tmp_path / "log")
    args = exact.args()
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(64 * 2**20)
    assert "VLLM_CPU_KVCACHE_SPACE" not in exact.env()
    default = VllmServer(ServerConfig(tmp_path), tmp_path / "log")
    assert "--kv-cache-memory-bytes" not in default.args() and "VLLM_CPU_KVCACHE_SPACE" in default.env()
