"""Where the model computes: the CPU, one accelerator, several, or layer by layer through one.

`plan_placement` is pure (sizes in, a Placement out) so that every branch is unit-tested without the hardware;
`load_model` carries the plan out with compressed-tensors' offloading (the same machinery llm-compressor's own
pipelines use): the weights load straight onto the accelerators (accelerate's device_map "auto" bounded by
`max_memory`), what does not fit stays in host memory (then on local disk) and is onloaded to its accelerator one
module at a time during the forward pass. Inputs are placed on `execution_device`; every module moves its own
inputs to where its weights are.
"""

import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from kvcal.calibrator.preflight import InputError, ModelInfo

log = logging.getLogger(__name__)

RequestedDevice = Literal["auto", "cpu", "cuda"]
PlacementPath = Literal["cpu", "one-device", "several-devices", "layer-by-layer"]
# Share of an accelerator's memory the weights and the working set may take (the CUDA context, the allocator's
# fragmentation and NCCL-free kernels' workspaces need the rest).
DEVICE_MEMORY_SHARE = 0.9
# Host memory kept free beside the weights (Python, torch, tokenizer, the dataset, the report).
HOST_RESERVE_BYTES = 4 << 30
# The checkpoint's largest safetensors file: saving a model with offloaded layers gathers one whole shard in host
# memory (transformers warns of it), so layer by layer keeps that much free too.
SAVE_SHARD_BYTES = 20 * 10**9
DTYPE = "bfloat16"
GIB = 1 << 30


@dataclass(frozen=True)
class Placement:
    """The plan: which path, on which devices, how much of each the weights may take, and what the host needs."""

    path: PlacementPath
    devices: tuple[str, ...]  # where the layers compute, first = where the inputs go
    # device -> bytes the weights may take there (accelerate's max_memory: it fills the devices in order, module by
    # module; a budget of exactly the weights' bytes would leave no slack for its own accounting)
    weight_budgets: dict[str, int] = field(default_factory=dict)
    host_weight_bytes: int = 0  # weights kept in host memory (layer by layer: onloaded per forward)
    disk_weight_bytes: int = 0  # weights beyond the host budget, read from local disk per forward
    why: str = ""

    @property
    def execution_device(self) -> str:
        return self.devices[0]

    def describe(self) -> str:
        where = ", ".join(self.devices)
        extra = ""
        if self.host_weight_bytes or self.disk_weight_bytes:
            extra = f"; {self.host_weight_bytes / GIB:.1f} GiB of weights onloaded from host memory"
            if self.disk_weight_bytes:
                extra += f", {self.disk_weight_bytes / GIB:.1f} GiB from local disk"
        return f"{self.path} on {where}{extra}"


def working_bytes(info: ModelInfo, max_seq_length: int) -> int:
    """Memory one sample's forward pass needs beside the weights (batch 1, SDPA attention, no KV cache): the
    hidden states and the MLP's intermediate activations of one layer at a time, the K/V the taps observe, and the
    report's float32 copy of the LM head with a chunk of logits."""
    hidden = max(info.hidden_size, 1)
    intermediate = max(info.intermediate_size, hidden)
    per_token = (8 * hidden + 4 * intermediate) * 2  # bf16
    lm_head_f32 = info.vocab_size * hidden * 4
    return max_seq_length * per_token + lm_head_f32 + (1 << 30)  # + the kept hold-out K/V (KEEP_BUDGET_BYTES)


def plan_placement(
    requested: RequestedDevice,
    info: ModelInfo,
    working: int,
    accelerators: Sequence[int],
    host_bytes: int,
) -> Placement:
    """accelerators: total memory of each visible accelerator, in order; host_bytes: the pod's memory limit."""
    weights = info.weight_bytes
    if requested == "cpu" or (requested == "auto" and not accelerators):
        why = "asked for (--device cpu)" if requested == "cpu" else "no accelerator visible"
        need = weights + working + HOST_RESERVE_BYTES
        if need > host_bytes:
            raise InputError(
                f"calibrating on the CPU needs about {need / GIB:.1f} GiB of memory (weights {weights / GIB:.1f} GiB, "
                f"one sample's working set {working / GIB:.1f} GiB), the pod has {host_bytes / GIB:.1f} GiB: raise "
                "spec.calibration.job.resources.limits.memory, or give the Job a GPU (resources.limits nvidia.com/gpu)"
            )
        return Placement("cpu", ("cpu",), {"cpu": weights}, why=why)
    if not accelerators:
        raise InputError(
            "--device cuda: no CUDA device is visible; give the Job a GPU (spec.calibration.job.resources.limits "
            "nvidia.com/gpu) or calibrate with --device cpu"
        )
    budgets = [max(int(total * DEVICE_MEMORY_SHARE) - working, 0) for total in accelerators]
    names = tuple(f"cuda:{index}" for index in range(len(accelerators)))
    if weights <= budgets[0]:
        return Placement("one-device", names[:1], {names[0]: budgets[0]}, why="the weights fit one accelerator")
    if len(accelerators) > 1 and weights <= sum(budgets):
        used = _devices_filled(weights, names, budgets)
        return Placement(
            "several-devices",
            used,
            dict(zip(used, budgets, strict=False)),
            why=f"the weights fit {len(used)} accelerators together, not one",
        )
    return _layer_by_layer(info, working, names, budgets, host_bytes)


def _devices_filled(weights: int, names: tuple[str, ...], budgets: list[int]) -> tuple[str, ...]:
    """The devices accelerate's device_map 'auto' fills, in order, until the weights are placed."""
    used: list[str] = []
    left = weights
    for name, budget in zip(names, budgets, strict=True):
        if left <= 0:
            break
        used.append(name)
        left -= budget
    return tuple(used)


def _layer_by_layer(
    info: ModelInfo, working: int, names: tuple[str, ...], budgets: list[int], host_bytes: int
) -> Placement:
    largest_layer = info.weight_bytes // max(info.layers, 1)
    if largest_layer * 2 > budgets[0]:  # the onloaded layer and the next one's prefetch
        raise InputError(
            f"one decoder layer ({largest_layer / GIB:.1f} GiB) with one sample's working set ({working / GIB:.1f} "
            f"GiB) does not fit {names[0]}: lower spec.calibration.maxSeqLength, or use GPUs with more memory"
        )
    left = info.weight_bytes - sum(budgets)
    host_budget = max(host_bytes - HOST_RESERVE_BYTES - SAVE_SHARD_BYTES, 0)
    host = min(left, host_budget)
    return Placement(
        "layer-by-layer",
        names,
        dict(zip(names, budgets, strict=True)),
        host_weight_bytes=host,
        disk_weight_bytes=left - host,
        why=f"the weights ({info.weight_bytes / GIB:.1f} GiB) exceed the accelerators' memory",
    )


def visible_accelerators() -> list[int]:
    """Total memory of each visible CUDA device (the Job's nvidia.com/gpu limit decides which are visible)."""
    if not torch.cuda.is_available():
        return []
    return [int(torch.cuda.get_device_properties(index).total_memory) for index in range(torch.cuda.device_count())]


def host_memory_bytes() -> int:
    """The pod's memory limit (cgroup v2, then v1), else the machine's memory."""
    physical = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text(encoding="ascii").strip()
        except OSError:
            continue
        if text.isdigit():
            return min(int(text), physical)
    return physical


def load_model(model_dir: Path, placement: Placement, offload_dir: Path | None = None) -> torch.nn.Module:
    """The BF16 model, placed. The plain CPU path loads as transformers does by default (no offloading hooks)."""
    from transformers import AutoModelForCausalLM

    if placement.path == "cpu":
        model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    else:
        from compressed_tensors.offload import load_offloaded_model

        max_memory: dict[int | str, int] = {_accelerate_key(name): 0 for name in placement.devices}
        max_memory.update({_accelerate_key(name): budget for name, budget in placement.weight_budgets.items()})
        if "cpu" not in placement.devices:  # host memory: what the accelerators do not hold, onloaded per forward
            max_memory["cpu"] = placement.host_weight_bytes
        folder = offload_dir or Path(tempfile.mkdtemp(prefix="kvcal-offload-"))
        with load_offloaded_model():
            model = AutoModelForCausalLM.from_pretrained(
                model_dir,
                dtype=torch.bfloat16,
                device_map="auto",
                max_memory=max_memory,
                offload_folder=str(folder),
            )
    model.eval()
    return model


def _accelerate_key(device: str) -> int | str:
    """accelerate's max_memory keys: an int for a CUDA index, "cpu" / "disk" by name."""
    kind, _, index = device.partition(":")
    return int(index) if kind == "cuda" and index else device


def input_device(model: torch.nn.Module) -> torch.device:
    """Where the input ids must be: the embedding's execution device."""
    from compressed_tensors.offload import get_execution_device

    embeddings: Any = model.get_input_embeddings()  # type: ignore[operator]
    return torch.device(get_execution_device(embeddings))


def peak_device_memory(placement: Placement) -> int | None:
    """Largest peak allocation on any accelerator this placement used (None on the CPU)."""
    cuda = [name for name in placement.devices if name.startswith("cuda")]
    if not cuda or not torch.cuda.is_available():
        return None
    return max(int(torch.cuda.max_memory_allocated(torch.device(name))) for name in cuda)


def reset_peak_memory(placement: Placement) -> None:
    for name in placement.devices:
        if name.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats(torch.device(name))


def measure_flops_per_second(
    device: str, size: int | None = None, timer: Callable[[], float] = time.perf_counter
) -> float:
    """BF16 matmul rate of the device (the calibration pass's dominant work), measured, not looked up: CPUs differ
    by 10x with and without BF16 instructions, and GPUs by generation."""
    side = size or (4096 if device.startswith("cuda") else 512)
    first = torch.randn(side, side, dtype=torch.bfloat16, device=device)
    second = torch.randn(side, side, dtype=torch.bfloat16, device=device)
    torch.matmul(first, second)  # warm-up: kernel selection, CUDA context
    _synchronize(device)
    repeats = 20 if device.startswith("cuda") else 3
    started = timer()
    for _ in range(repeats):
        torch.matmul(first, second)
    _synchronize(device)
    elapsed = max(timer() - started, 1e-9)
    return 2.0 * side**3 * repeats / elapsed


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


# A batch-1 forward pass reaches about half the device's plain matmul rate (measured on the CPU here: 0.4-0.7x);
# the deadline check refuses only what would not finish even at that rate.
FORWARD_EFFICIENCY = 0.5
# Onloading a layer: host memory -> accelerator (PCIe 4 x16 sustains ~20 GB/s; pageable copies about half) and
# local disk -> host.
HOST_TO_DEVICE_BYTES_PER_SECOND = 10e9
DISK_BYTES_PER_SECOND = 1e9
HOLDOUT_PASSES = 4  # BF16, FP8 at scale 1.0, per tensor, per head (evaluate.VARIANTS)


@dataclass(frozen=True)
class WorkEstimate:
    flops: float
    onload_bytes: float
    seconds: float


def estimate_work(
    info: ModelInfo,
    calibration_lengths: Sequence[int],
    holdout_lengths: Sequence[int],
    placement: Placement,
    flops_per_second: float,
    layerwise_calibration: bool = False,
) -> WorkEstimate:
    """Time of the calibration pass and the held-out report: 2 FLOPs per weight per token, causal attention's
    2 x layers x hidden x length^2 per sample, the report's LM head per held-out token and pass, and for layer by
    layer the weights onloaded once per sample and pass (once in all for a layerwise calibration pass: llm-compressor's
    sequential pipeline runs every sample through one layer before onloading the next)."""
    params = info.weight_bytes / 2  # bf16
    hidden = info.hidden_size or info.kv_heads * info.head_dim

    def pass_flops(lengths: Sequence[int]) -> float:
        return sum(2 * params * n + 2 * info.layers * hidden * n * n for n in lengths)

    head = 2.0 * info.vocab_size * hidden * sum(holdout_lengths) * HOLDOUT_PASSES
    flops = pass_flops(calibration_lengths) + HOLDOUT_PASSES * pass_flops(holdout_lengths) + head
    passes = (1 if layerwise_calibration else len(calibration_lengths)) + HOLDOUT_PASSES * len(holdout_lengths)
    seconds = flops / (flops_per_second * FORWARD_EFFICIENCY)
    seconds += passes * placement.host_weight_bytes / HOST_TO_DEVICE_BYTES_PER_SECOND
    seconds += passes * placement.disk_weight_bytes / DISK_BYTES_PER_SECOND
    onload = float(passes * (placement.host_weight_bytes + placement.disk_weight_bytes))
    return WorkEstimate(flops, onload, seconds)


def check_deadline(estimate: WorkEstimate, deadline_seconds: float, elapsed_seconds: float, where: str) -> None:
    left = deadline_seconds - elapsed_seconds
    if estimate.seconds > left:
        raise InputError(
            f"this calibration needs about {estimate.seconds:,.0f} s on {where} ({estimate.flops:.2g} FLOPs at half "
            f"the device's measured matmul rate"
            + (f", {estimate.onload_bytes / GIB:,.0f} GiB onloaded layer by layer" if estimate.onload_bytes else "")
            + f"), but {left:,.0f} s are left of the Job's {deadline_seconds:,.0f} s deadline: raise "
            "spec.calibration.job.activeDeadlineSeconds, lower spec.calibration.samples or maxSeqLength, or give "
            "the Job more or faster GPUs (spec.calibration.job.resources)"
        )
