"""Where the calibration computes (kvcal.calibrator.placement.plan_placement) and whether it fits the pod's memory
and the Job's deadline, for the GPUs and models a platform team runs; sizes in, a plan out: no device needed."""

import pytest

from kvcal.calibrator.placement import (
    GIB,
    HOST_RESERVE_BYTES,
    SAVE_SHARD_BYTES,
    Placement,
    check_deadline,
    estimate_work,
    plan_placement,
    working_bytes,
)
from kvcal.calibrator.preflight import InputError, ModelInfo

H100 = 80 * 10**9  # total memory torch reports for an H100 80 GB, roughly
POD_MEMORY = 64 * GIB  # the calibration Job's default memory limit (core/manifests/jobs.py)


def llama(weight_bytes: int, layers: int, hidden: int, intermediate: int, vocab: int = 128_256) -> ModelInfo:
    return ModelInfo(
        config={},
        weight_bytes=weight_bytes,
        max_positions=131_072,
        layers=layers,
        kv_heads=8,
        head_dim=128,
        hidden_size=hidden,
        intermediate_size=intermediate,
        vocab_size=vocab,
    )


LLAMA_8B = llama(16_060_000_000, 32, 4096, 14_336)
LLAMA_70B = llama(141_100_000_000, 80, 8192, 28_672)
DEFAULT_SEQ = 4096  # spec.calibration.maxSeqLength's default


def test_no_accelerator_means_the_cpu_and_cuda_asked_without_one_is_refused() -> None:
    small = llama(270_000_000, 30, 576, 1536, 49_152)
    plan = plan_placement("auto", small, working_bytes(small, 512), [], POD_MEMORY)
    assert (plan.path, plan.devices) == ("cpu", ("cpu",))
    with pytest.raises(InputError, match=r"nvidia.com/gpu"):
        plan_placement("cuda", small, working_bytes(small, 512), [], POD_MEMORY)
    assert plan_placement("cpu", small, working_bytes(small, 512), [H100], POD_MEMORY).path == "cpu"


def test_the_defaults_fit_an_8b_model_on_one_80gb_gpu() -> None:
    plan = plan_placement("auto", LLAMA_8B, working_bytes(LLAMA_8B, DEFAULT_SEQ), [H100], POD_MEMORY)
    assert (plan.path, plan.devices, plan.host_weight_bytes) == ("one-device", ("cuda:0",), 0)


def test_a_70b_model_spreads_over_the_pods_gpus_in_order() -> None:
    plan = plan_placement("auto", LLAMA_70B, working_bytes(LLAMA_70B, DEFAULT_SEQ), [H100] * 4, POD_MEMORY)
    assert plan.path == "several-devices" and plan.devices == ("cuda:0", "cuda:1", "cuda:2")  # 3 of 4 suffice
    budgets = list(plan.weight_budgets.values())
    assert sum(budgets[:-1]) < LLAMA_70B.weight_bytes <= sum(budgets)  # every GPU named is needed
    assert plan.host_weight_bytes == 0
    two_h200 = plan_placement("auto", LLAMA_70B, working_bytes(LLAMA_70B, DEFAULT_SEQ), [141 * 10**9] * 4, POD_MEMORY)
    assert two_h200.path == "several-devices" and two_h200.devices == ("cuda:0", "cuda:1")


def test_a_70b_model_on_one_gpu_goes_layer_by_layer_with_host_memory_bounded() -> None:
    plan = plan_placement("auto", LLAMA_70B, working_bytes(LLAMA_70B, DEFAULT_SEQ), [H100], POD_MEMORY)
    assert plan.path == "layer-by-layer" and plan.devices == ("cuda:0",)
    on_gpu = plan.weight_budgets["cuda:0"]
    assert on_gpu < H100 and on_gpu + plan.host_weight_bytes + plan.disk_weight_bytes == LLAMA_70B.weight_bytes
    # never more than the pod holds, less room to save one checkpoint shard
    assert plan.host_weight_bytes == POD_MEMORY - HOST_RESERVE_BYTES - SAVE_SHARD_BYTES
    assert plan.disk_weight_bytes > 0
    roomy = plan_placement("auto", LLAMA_70B, working_bytes(LLAMA_70B, DEFAULT_SEQ), [H100], 256 * GIB)
    assert roomy.disk_weight_bytes == 0 and roomy.host_weight_bytes == LLAMA_70B.weight_bytes - on_gpu


def test_a_layer_that_fits_no_gpu_is_refused_naming_the_fix() -> None:
    with pytest.raises(InputError, match=r"maxSeqLength"):
        plan_placement("auto", LLAMA_70B, working_bytes(LLAMA_70B, DEFAULT_SEQ), [8 * 10**9], POD_MEMORY)


def test_cpu_calibration_larger_than_the_pod_is_refused_naming_the_memory_limit() -> None:
    with pytest.raises(InputError, match=r"spec\.calibration\.job\.resources\.limits\.memory"):
        plan_placement("auto", LLAMA_8B, working_bytes(LLAMA_8B, DEFAULT_SEQ), [], 16 * GIB)


def work(info: ModelInfo, plan: Placement, flops_per_second: float, samples: int = 512, holdout: int = 57) -> float:
    return estimate_work(info, [DEFAULT_SEQ] * samples, [DEFAULT_SEQ] * holdout, plan, flops_per_second).seconds


def test_deadline_estimate_8b_on_a_gpu_fits_an_hour_on_a_cpu_it_does_not() -> None:
    gpu = plan_placement("auto", LLAMA_8B, working_bytes(LLAMA_8B, DEFAULT_SEQ), [H100], POD_MEMORY)
    seconds = work(LLAMA_8B, gpu, 600e12)  # an H100's dense BF16 matmul rate, about
    assert 60 < seconds < 1200
    check_deadline(estimate_work(LLAMA_8B, [DEFAULT_SEQ] * 512, [DEFAULT_SEQ] * 57, gpu, 600e12), 3600, 10, "cuda:0")
    cpu = Placement("cpu", ("cpu",))
    slow = estimate_work(LLAMA_8B, [DEFAULT_SEQ] * 512, [DEFAULT_SEQ] * 57, cpu, 1e12)
    with pytest.raises(InputError, match=r"activeDeadlineSeconds.*spec\.calibration\.samples"):
        check_deadline(slow, 3600, 10, "cpu")


def test_layer_by_layer_pays_for_onloading_per_sample_and_pass() -> None:
    plan = plan_placement("auto", LLAMA_70B, working_bytes(LLAMA_70B, DEFAULT_SEQ), [H100], 256 * GIB)
    resident = Placement("several-devices", ("cuda:0", "cuda:1"))
    assert work(LLAMA_70B, plan, 600e12) > work(LLAMA_70B, resident, 600e12) + 569 * plan.host_weight_bytes / 20e9
    layerwise = estimate_work(LLAMA_70B, [DEFAULT_SEQ] * 512, [], plan, 600e12, layerwise_calibration=True)
    assert layerwise.onload_bytes == plan.host_weight_bytes
