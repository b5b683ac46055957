"""Tensor parallelism in the runtime verification: every worker's read-back against its rank's share of the
checkpoint, the KV heads sliced as vLLM 0.32 slices them."""

import pytest

from kvcal.verify.runtime import LoadedScale, compare_workers, rank_heads, rank_view
from kvcal.verify.static import LayerScales, ModelShape, StaticResult

METHOD = "CompressedTensorsKVCacheMethod"


def row(layer: int, k: tuple[float, ...], v: tuple[float, ...], per_head: bool = True) -> LoadedScale:
    """A worker's read-back of one layer, on a backend that applies per-head scales (e.g. FLASH_ATTN)."""
    name = f"model.layers.{layer}.self_attn.attn"
    return LoadedScale(name, max(k), max(v), "fp8", METHOD, k, v, "FLASH_ATTN", per_head)


def per_tensor(layers: int = 3, kv_heads: int = 4) -> StaticResult:
    scales = {n: LayerScales((0.01 * (n + 1),), (0.02 * (n + 1),)) for n in range(layers)}
    return StaticResult(ModelShape(layers, kv_heads), "tensor", scales)


def per_head(layers: int = 3, kv_heads: int = 4) -> StaticResult:
    scales = {
        n: LayerScales(
            tuple(0.01 * (n + 1) * (h + 1) for h in range(kv_heads)),
            tuple(0.02 * (n + 1) * (h + 1) for h in range(kv_heads)),
        )
        for n in range(layers)
    }
    return StaticResult(ModelShape(layers, kv_heads), "attn_head", scales)


def answers(checkpoint: StaticResult, tp: int) -> list[list[LoadedScale]]:
    """What vLLM's workers answer when they loaded `checkpoint` correctly at TP `tp`."""
    return [[row(n, s.k, s.v) for n, s in sorted(rank_view(checkpoint, rank, tp).scales.items())] for rank in range(tp)]


@pytest.mark.parametrize(
    ("kv_heads", "tp", "held"),
    [
        (8, 1, [[0, 1, 2, 3, 4, 5, 6, 7]]),
        (8, 2, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        (8, 8, [[0], [1], [2], [3], [4], [5], [6], [7]]),
        (2, 4, [[0], [0], [1], [1]]),  # fewer KV heads than ranks: replicated, rank r holds head r // (t / H)
        (1, 4, [[0], [0], [0], [0]]),
    ],
)
def test_rank_heads_follow_vllm(kv_heads: int, tp: int, held: list[list[int]]) -> None:
    assert [list(rank_heads(kv_heads, tp, rank)) for rank in range(tp)] == held


def test_every_worker_equal_to_its_share_is_ok() -> None:
    for checkpoint in (per_tensor(), per_head()):
        for tp in (1, 2, 4, 8):
            result = compare_workers(checkpoint, answers(checkpoint, tp), tp)
            assert result.problems == [] and result.mismatches == 0, (checkpoint.strategy, tp, result.problems)


def test_per_tensor_scale_is_loaded_whole_on_every_rank() -> None:
    checkpoint = per_tensor()
    assert all(rank_view(checkpoint, rank, 4).scales == checkpoint.scales for rank in range(4))


def test_per_head_scales_are_the_ranks_slice() -> None:
    checkpoint = per_head(layers=1, kv_heads=4)
    k = checkpoint.scales[0].k
    assert [rank_view(checkpoint, rank, 2).scales[0].k for rank in range(2)] == [k[:2], k[2:]]
    assert [rank_view(checkpoint, rank, 8).scales[0].k for rank in range(8)] == [(k[r // 2],) for r in range(8)]


def test_query_scales_reduce_to_kv_heads_then_slice() -> None:
    """8 query heads over 4 KV heads: vLLM keeps the max of each query group, then the rank's KV heads."""
    q = (0.1, 0.3, 0.2, 0.4, 0.6, 0.5, 0.8, 0.7)
    checkpoint = StaticResult(ModelShape(1, 4), "attn_head", {0: LayerScales((0.1,) * 4, (0.1,) * 4, q)})
    assert [rank_view(checkpoint, rank, 2).scales[0].q for rank in range(2)] == [(0.3, 0.4), (0.6, 0.8)]


def test_wrong_scale_on_worker_1_names_the_worker_and_the_layer() -> None:
    checkpoint = per_tensor()
    read = answers(checkpoint, 2)
    read[1][2] = row(2, (0.5,), read[1][2].v_values)  # worker 1 runs layer 2 with another K scale
    result = compare_workers(checkpoint, read, 2)
    (problem,) = result.problems
    assert (problem.code, problem.layer) == ("mismatch", 2)
    assert problem.message.startswith("worker 1 of 2: vLLM uses 0.5")
    assert problem.line().startswith("layer 2 model.layers.2.self_attn.attn._k_scale: worker 1 of 2:")
    assert result.mismatches == 1


def test_worker_holding_another_ranks_heads_is_a_mismatch() -> None:
    """Rank 1 loaded rank 0's slice (a sharding bug): only a per-worker comparison sees it."""
    checkpoint = per_head(layers=1, kv_heads=4)
    read = answers(checkpoint, 2)
    read[1] = read[0]
    result = compare_workers(checkpoint, read, 2)
    assert {(p.code, p.layer) for p in result.problems} == {("mismatch", 0)}
    assert all(p.message.startswith("worker 1 of 2:") for p in result.problems)
    assert result.mismatches == 2  # k and v


def test_problem_every_worker_has_is_reported_once() -> None:
    checkpoint = per_tensor()
    read = answers(checkpoint, 4)
    for worker in read:  # the scales were not loaded anywhere: every worker runs layer 0 at 1.0
        worker[0] = row(0, (1.0,), (1.0,))
    result = compare_workers(checkpoint, read, 4)
    assert [(p.code, p.layer, p.message.startswith("worker")) for p in result.problems] == [
        ("runtime-missing", 0, False),
        ("runtime-missing", 0, False),
    ]
    assert result.mismatches == 2


def test_fewer_workers_than_the_tensor_parallel_size() -> None:
    checkpoint = per_tensor()
    result = compare_workers(checkpoint, answers(checkpoint, 2), 4)
    assert [p.code for p in result.problems] == ["workers"]
    assert "answered from 2 workers, expected 4" in result.problems[0].message
    assert result.mismatches == 0


def test_single_worker_is_todays_comparison() -> None:
    checkpoint = per_tensor()
    read = answers(checkpoint, 1)
    read[0][1] = row(1, (0.5,), read[0][1].v_values)
    (problem,) = compare_workers(checkpoint, read, 1).problems
    assert problem.message.startswith("vLLM uses 0.5")  # no worker named when there is only one


def test_problems_of_several_workers_come_in_layer_order() -> None:
    checkpoint = per_tensor()
    read = answers(checkpoint, 2)
    read[0][2] = row(2, (0.5,), read[0][2].v_values)
    read[1][0] = row(0, read[1][0].k_values, (0.5,))
    result = compare_workers(checkpoint, read, 2)
    assert [(p.layer, p.message.split(":")[0]) for p in result.problems] == [(0, "worker 1 of 2"), (2, "worker 0 of 2")]
