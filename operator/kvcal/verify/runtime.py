"""`kvcal verify CHECKPOINT_DIR --runtime`: load the checkpoint in real vLLM, read back the K/V scales each attention
layer really uses, and compare them with the checkpoint's.

vLLM logs nothing when scales are missing (it runs at 1.0), ignored, or collapsed from per-head to one value per
layer (its CPU backend takes the max over heads), and it silently switches `--kv-cache-dtype auto` to fp8 when the
checkpoint has a kv_cache_scheme. Reading the loaded modules is the only proof. `compare()` and `compare_workers()`
are pure; `read_back()` starts vLLM.

With tensor parallelism every worker (TP rank) loads its own copy of the scales, per-head ones sliced to the KV heads
it holds, so every worker's answer is compared with its share of the checkpoint (`rank_view`)."""

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvcal.verify.problems import Problem
from kvcal.verify.static import BF16_REL_TOL, LayerScales, StaticResult

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class LoadedScale:
    """One attention module as vLLM loaded it."""

    module: str
    k: float
    v: float
    kv_cache_dtype: str
    method: str
    k_values: tuple[float, ...] = ()  # the scale tensor, when the backend keeps per-head values
    v_values: tuple[float, ...] = ()
    backend: str = ""  # attention backend name, e.g. CPU_ATTN, FLASH_ATTN
    backend_per_head: bool | None = None  # does that backend apply per-head scales (None: unknown)
    q: float | None = None  # _q_scale_float (None in captures older than Q read-back)
    q_values: tuple[float, ...] = ()
    quantizes_query: bool | None = None  # does this layer's forward quantize Q with it (FP8 attention backends)

    @property
    def layer(self) -> int | None:
        match = _LAYER.search(self.module)
        return int(match[1]) if match else None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> "LoadedScale":
        """A row of `kvcal.verify.readback.read_kv_scales` (5 or 9 fields in older captures, 12 now)."""
        k_values = tuple(float(x) for x in row[5]) if len(row) > 5 else ()
        v_values = tuple(float(x) for x in row[6]) if len(row) > 6 else ()
        backend = str(row[7]) if len(row) > 7 else ""
        per_head = bool(row[8]) if len(row) > 8 and row[8] is not None else None
        q = float(row[9]) if len(row) > 9 else None
        q_values = tuple(float(x) for x in row[10]) if len(row) > 10 else ()
        quantizes_query = bool(row[11]) if len(row) > 11 else None
        return cls(str(row[0]), float(row[1]), float(row[2]), str(row[3]), str(row[4]), k_values, v_values, backend,
                   per_head, q, q_values, quantizes_query)  # fmt: skip


@dataclass
class RuntimeResult:
    layers: int
    mismatches: int = 0
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    loaded: list[LoadedScale] = field(default_factory=list)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= abs(b) * BF16_REL_TOL + 1e-12


def _compare_one(layer: int, kind: str, expected: tuple[float, ...], row: LoadedScale) -> Problem | None:
    got = row.k if kind == "k" else row.v
    got_values = row.k_values if kind == "k" else row.v_values
    tensor = f"{row.module}._{kind}_scale"
    if not expected:  # the checkpoint has none (static verify says so): vLLM must be at its default
        if got == 1.0:
            return None
        return Problem(
            "mismatch",
            f"vLLM uses {got:.6g} but the checkpoint has no scale here (vLLM copies k_scale into v_scale, or back, "
            "when only one is present)",
            layer,
            tensor,
        )
    per_head = len(expected) > 1 and len(set(expected)) > 1
    if (
        per_head
        and row.backend_per_head  # else the backend uses only the float: the max over heads
        and len(got_values) == len(expected)
        and all(_close(g, e) for g, e in zip(got_values, expected, strict=True))
    ):
        return None
    if per_head and _close(got, max(expected)):
        return Problem(
            "collapsed",
            f"per-head scales {[round(e, 6) for e in expected]} collapsed to one per-tensor scale {got:.6g} (the max "
            f"over heads): attention backend {row.backend or '(unknown)'} does not apply per-head scales (calibrate "
            "with strategy tensor, or serve on a backend that supports per-head, such as FLASH_ATTN on CUDA)",
            layer,
            tensor,
        )
    want = max(expected)
    if got == 1.0 and want != 1.0:
        return Problem(
            "runtime-missing",
            f"vLLM runs this layer at scale 1.0 but the checkpoint has {want:.6g}: the scale was not loaded "
            f"(quant method {row.method}; a kv_cache_scheme in config.json and the standard name are needed)",
            layer,
            tensor,
        )
    if not _close(got, want):
        return Problem("mismatch", f"vLLM uses {got:.6g}, the checkpoint has {want:.6g}", layer, tensor)
    return None


def _compare_query(layer: int, expected: tuple[float, ...], row: LoadedScale) -> Problem | None:
    """vLLM's _q_scale_float must be the checkpoint's q_scale (the max over heads: it reduces per-head Q scales)."""
    if not expected or row.q is None:
        return None
    if _close(row.q, max(expected)):
        return None
    why = "q_scale was not loaded" if row.q == 1.0 else "the checkpoint's q_scale"
    return Problem(
        "q-mismatch",
        f"vLLM uses q scale {row.q:.6g}, the checkpoint has {max(expected):.6g} ({why}; FP8 attention backends "
        "quantize Q with it)",
        layer,
        f"{row.module}._q_scale",
    )


def _check_protected(layer: int, row: LoadedScale, protected: bool) -> Problem | None:
    """A protected layer must keep a BF16 (non-FP8) KV cache; with a skip list, every other layer must be FP8."""
    fp8 = row.kv_cache_dtype.startswith("fp8")
    if protected and fp8:
        return Problem(
            "protected-fp8",
            f"protected layer runs an {row.kv_cache_dtype} KV cache: vLLM did not apply --kv-cache-dtype-skip-layers",
            layer,
            row.module,
        )
    if not protected and not fp8:
        return Problem("not-fp8", f"layer stores its KV cache as {row.kv_cache_dtype}, not FP8", layer, row.module)
    return None


def _query_notes(checkpoint: StaticResult, loaded: Sequence[LoadedScale]) -> list[str]:
    if not any(s.q for s in checkpoint.scales.values()) or not loaded:
        return []
    if all(row.quantizes_query for row in loaded):
        return ["vLLM quantizes Q to FP8 with the read-back q_scale in every layer"]
    backends = ", ".join(sorted({row.backend or "(unknown)" for row in loaded if not row.quantizes_query}))
    return [
        f"vLLM loaded q_scale, but attention backend {backends} does not quantize Q (only FP8 attention backends "
        "do, e.g. FlashAttention 3 on Hopper): the Q scales take effect only there"
    ]


def compare(
    checkpoint: StaticResult,
    loaded: Sequence[LoadedScale],
    requested_dtype: str,
    protected_layers: Sequence[int] = (),
) -> RuntimeResult:
    result = RuntimeResult(layers=checkpoint.shape.layers, loaded=list(loaded))
    protected = set(protected_layers)
    for layer in sorted(protected - set(range(checkpoint.shape.layers))):
        why = f"protected layer {layer} does not exist: the model has {checkpoint.shape.layers} layers"
        result.problems.append(Problem("protected-absent", why, layer))
    by_layer = {row.layer: row for row in loaded if row.layer is not None}
    dtypes = sorted({row.kv_cache_dtype for row in loaded})
    if not loaded:
        result.problems.append(Problem("runtime-absent", "vLLM's model has no attention module with K/V scales"))
    if loaded and not any(d.startswith("fp8") for d in dtypes):
        result.problems.append(
            Problem(
                "not-fp8",
                f"vLLM stores the KV cache as {', '.join(dtypes)}: the scales are unused (serve with "
                "--kv-cache-dtype fp8)",
            )
        )
    if requested_dtype == "auto" and any(d.startswith("fp8") for d in dtypes) and checkpoint.strategy:
        result.notes.append(
            "vLLM switched --kv-cache-dtype auto to fp8 because config.json carries a kv_cache_scheme: "
            "serving this checkpoint always quantizes the KV cache"
        )
    for layer in range(checkpoint.shape.layers):
        row = by_layer.get(layer)
        if row is None:
            result.problems.append(Problem("runtime-absent", "no attention module for this layer in vLLM", layer))
            continue
        scales = checkpoint.scales.get(layer)
        layer_problems = [_check_protected(layer, row, layer in protected)] if protected else []
        if layer not in protected:  # a BF16 layer's K/V scales are unused, whatever vLLM keeps of them
            for kind in ("k", "v"):
                expected = (scales.k if kind == "k" else scales.v) if scales else ()
                layer_problems.append(_compare_one(layer, kind, expected, row))
        layer_problems.append(_compare_query(layer, scales.q if scales else (), row))
        result.problems += [problem for problem in layer_problems if problem]
    result.mismatches = sum(_is_mismatch(p) for p in result.problems)
    result.notes += _query_notes(checkpoint, loaded)
    collapsed = [p for p in result.problems if p.code == "collapsed"]
    if collapsed:
        result.notes.append(f"{len(collapsed)} per-head scales collapsed to per-tensor by this attention backend")
    return result


def _is_mismatch(problem: Problem) -> bool:
    """A layer whose scales (or KV dtype) vLLM does not use as the checkpoint says; not a model-wide problem, nor a
    protected layer that does not exist."""
    return problem.layer is not None and problem.code != "protected-absent"


def rank_heads(kv_heads: int, tensor_parallel_size: int, rank: int) -> range:
    """The KV heads TP rank `rank` holds, as vLLM 0.32 shards them (QKVParallelLinear in
    model_executor/layers/linear.py; the attn_head scale loader in compressed_tensors.py follows it): H >= t heads
    are split evenly, rank r holding [r*H/t, (r+1)*H/t); fewer heads than ranks are replicated, rank r holding head
    r // (t/H)."""
    if tensor_parallel_size <= 1:
        return range(kv_heads)
    if kv_heads >= tensor_parallel_size:
        per_rank = kv_heads // tensor_parallel_size
        return range(rank * per_rank, (rank + 1) * per_rank)
    head = rank // (tensor_parallel_size // kv_heads)
    return range(head, head + 1)


def _per_rank(values: tuple[float, ...], heads: range, kv_heads: int) -> tuple[float, ...]:
    """A per-head scale sliced to the rank's heads; a single per-tensor scale is loaded whole by every rank."""
    if kv_heads <= 1 or len(values) != kv_heads or heads.stop > kv_heads:  # (a TP size vLLM refuses to load)
        return values
    return tuple(values[head] for head in heads)


def _query_per_rank(values: tuple[float, ...], heads: range, kv_heads: int) -> tuple[float, ...]:
    """vLLM reduces per-head q_scale (one per query head) to one per KV head (the max over its query group), then
    slices it as k_scale."""
    if len(values) <= 1 or kv_heads < 1 or len(values) % kv_heads:
        return values
    group = len(values) // kv_heads
    per_kv_head = tuple(max(values[head * group : (head + 1) * group]) for head in range(kv_heads))
    return _per_rank(per_kv_head, heads, kv_heads)


def rank_view(checkpoint: StaticResult, rank: int, tensor_parallel_size: int) -> StaticResult:
    """The checkpoint's scales as TP rank `rank` loads them."""
    if tensor_parallel_size <= 1:
        return checkpoint
    kv_heads = checkpoint.shape.kv_heads
    heads = rank_heads(kv_heads, tensor_parallel_size, rank)
    scales = {
        layer: LayerScales(
            _per_rank(s.k, heads, kv_heads), _per_rank(s.v, heads, kv_heads), _query_per_rank(s.q, heads, kv_heads)
        )
        for layer, s in checkpoint.scales.items()
    }
    return replace(checkpoint, scales=scales)


def compare_workers(
    checkpoint: StaticResult,
    per_worker: Sequence[Sequence[LoadedScale]],
    tensor_parallel_size: int = 1,
    requested_dtype: str = "fp8",
    protected_layers: Sequence[int] = (),
) -> RuntimeResult:
    """Every worker's read-back (apply_model's answers, in rank order) against that rank's share of the checkpoint.

    A problem every worker has is reported once, as a single worker's would be; one that only some workers have is
    reported per worker, named `worker R of T`."""
    if not per_worker or (len(per_worker) == 1 and tensor_parallel_size <= 1):
        rows = per_worker[0] if per_worker else []
        return compare(rank_view(checkpoint, 0, tensor_parallel_size), rows, requested_dtype, protected_layers)
    results = [
        compare(rank_view(checkpoint, rank, tensor_parallel_size), rows, requested_dtype, protected_layers)
        for rank, rows in enumerate(per_worker)
    ]
    workers = len(results)
    merged = RuntimeResult(layers=checkpoint.shape.layers, loaded=[row for rows in per_worker for row in rows])
    if workers != tensor_parallel_size:
        why = f"vLLM answered from {workers} workers, expected {tensor_parallel_size} (the tensor-parallel size)"
        merged.problems.append(Problem("workers", why))
    found: dict[Problem, list[int]] = {}  # in the order first seen
    for rank, result in enumerate(results):
        for problem in result.problems:
            found.setdefault(problem, []).append(rank)
    for problem, ranks in found.items():
        if len(ranks) == workers:
            merged.problems.append(problem)
        else:
            merged.problems += [
                replace(problem, message=f"worker {rank} of {workers}: {problem.message}") for rank in ranks
            ]
    merged.problems.sort(key=lambda p: -1 if p.layer is None else p.layer)  # model-wide first, then by layer (stable)
    merged.mismatches = sum(_is_mismatch(p) for p in merged.problems)
    merged.notes = list(dict.fromkeys(note for result in results for note in result.notes))
    return merged


def read_back(
    checkpoint: Path,
    kv_cache_dtype: str = "fp8",
    attention_backend: str | None = None,
    max_model_len: int = 512,
    skip_layers: Sequence[int] = (),
    tensor_parallel_size: int = 1,
) -> list[list[LoadedScale]]:
    """Loads the checkpoint in a real vLLM engine (eager, small context) at the given tensor-parallel size and reads
    every attention module's scales: one list per worker, in rank order."""
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model pickles our function
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB on the CPU backend: the read-back needs no cache
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries our result (--json)
    # The engine in this process, and with TP 1 its single worker too (each spawned process re-imports torch and
    # vLLM, ~30 s apiece on 2 CPU cores); the scales read back are the same.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM  # imported here: the static verifier must not need vLLM

    from kvcal.verify.readback import read_kv_scales

    kwargs: dict[str, Any] = {
        "model": str(checkpoint),
        "kv_cache_dtype": kv_cache_dtype,
        "enforce_eager": True,
        "max_model_len": max_model_len,
        "max_num_seqs": 4,
        # TP > 1 needs one process per rank (the workers inherit PYTHONPATH, so they import our read-back function).
        "distributed_executor_backend": "mp" if tensor_parallel_size > 1 else "uni",
        "tensor_parallel_size": tensor_parallel_size,
    }
    if attention_backend:
        kwargs["attention_config"] = {"backend": attention_backend}
    if skip_layers:
        kwargs["kv_cache_dtype_skip_layers"] = [str(layer) for layer in skip_layers]
    llm = LLM(**kwargs)
    try:
        per_worker = llm.apply_model(read_kv_scales)
    finally:
        shutdown = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if shutdown is not None and hasattr(shutdown, "shutdown"):
            shutdown.shutdown()
        del llm
    return [[LoadedScale.from_row(row) for row in rows] for rows in per_worker or []]
