"""Runs INSIDE vLLM's worker process via `LLM.apply_model(read_kv_scales)`: that pickles the function by reference,
so it must live in an importable module (and needs VLLM_ALLOW_INSECURE_SERIALIZATION=1). Only the standard library
and the loaded torch modules are touched here."""

from typing import Any


def _values(tensor: Any) -> list[float]:
    try:
        return [float(x) for x in tensor.detach().float().flatten().tolist()]
    except AttributeError:  # a plain float
        return [float(tensor)]


def read_kv_scales(model: Any) -> list[list[Any]]:
    """Per attention module: [name, k_scale_float, v_scale_float, kv_cache_dtype, quant method class, k values,
    v values]. The floats are what the CPU and most CUDA kernels use; the tensors keep per-head values when the
    backend supports them."""
    rows: list[list[Any]] = []
    for name, module in model.named_modules():
        if not hasattr(module, "_k_scale_float"):
            continue
        rows.append(
            [
                name,
                float(module._k_scale_float),
                float(module._v_scale_float),
                str(getattr(module, "kv_cache_dtype", "")),
                type(getattr(module, "quant_method", None)).__name__,
                _values(getattr(module, "_k_scale", module._k_scale_float)),
                _values(getattr(module, "_v_scale", module._v_scale_float)),
            ]
        )
    return rows
