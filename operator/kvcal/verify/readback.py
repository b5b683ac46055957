"""Runs INSIDE vLLM's worker process via `LLM.apply_model(read_kv_scales)`: that pickles the function by reference,
so it must live in an importable module (and needs VLLM_ALLOW_INSECURE_SERIALIZATION=1). Only the standard library
and the loaded torch modules are touched here."""

from typing import Any


def _values(tensor: Any) -> list[float]:
    try:
        return [float(x) for x in tensor.detach().float().flatten().tolist()]
    except AttributeError:  # a plain float
        return [float(tensor)]


def _backend(module: Any) -> tuple[str, bool | None]:
    backend = getattr(module, "attn_backend", None)
    if backend is None:
        return "", None
    name = backend.get_name() if hasattr(backend, "get_name") else getattr(backend, "__name__", str(backend))
    per_head = getattr(backend, "supports_per_head_quant_scales", None)
    return str(name), bool(per_head()) if callable(per_head) else None


def _quantizes_query(module: Any) -> bool:
    """Whether this layer's forward quantizes Q to FP8 with `_q_scale` (FP8 attention backends only)."""
    impl = getattr(module, "impl", None)
    return getattr(module, "query_quant", None) is not None and bool(getattr(impl, "supports_quant_query_input", False))


def read_kv_scales(model: Any) -> list[list[Any]]:
    """Per attention module: [name, k_scale_float, v_scale_float, kv_cache_dtype, quant method class, k values,
    v values, attention backend, backend applies per-head scales, q_scale_float, q values, quantizes Q]. vLLM keeps
    per-head values in the `_k_scale` buffer but sets `_k_scale_float` to their max; backends without per-head support
    (CPU) use only the float."""
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
                *_backend(module),
                float(getattr(module, "_q_scale_float", 1.0)),
                _values(getattr(module, "_q_scale", getattr(module, "_q_scale_float", 1.0))),
                _quantizes_query(module),
            ]
        )
    return rows
