"""The attention implementation llm-compressor's oneshot runs the model with.

llm-compressor forces eager attention for every calibration pipeline: its sequential pipeline needs it (the traced
graph adds the causal mask unconditionally). Eager materialises a heads x tokens x tokens score matrix, so its time and
memory grow with the square of the sample length (benchmarks/bench_calibrate.py measures both paths at 4,096 and
8,192 tokens per sample). The basic pipeline has no traced graph, so kvcal keeps the model's attention there; the K/V
llm-compressor observes are then those of a plain forward pass, bit for bit (tests/integration/test_calib_speed.py).
"""

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def _keep_attention(_model: object) -> Iterator[None]:
    """Stands in for llm-compressor's `use_eager_attention`: leaves the model's attention as it is."""
    yield


@contextmanager
def model_attention(pipeline: str) -> Iterator[None]:
    """Within this context a basic-pipeline oneshot keeps the model's own attention implementation."""
    import llmcompressor.utils.helpers as helpers

    forced = getattr(helpers, "use_eager_attention", None)
    if pipeline != "basic" or forced is None:  # sequential needs eager; a newer llm-compressor may not force it
        yield
        return
    helpers.use_eager_attention = _keep_attention  # type: ignore[assignment]  # monkeypatch of a typed function
    try:
        yield
    finally:
        helpers.use_eager_attention = forced
