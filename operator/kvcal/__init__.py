"""kvcal: calibrate, verify and safely roll out FP8 KV-cache quantization on vLLM."""

__version__ = "0.1.0"
