"""Serve BF16 KV, FP8 with default scales and FP8 with calibrated scales on real vLLM and compare quality, needle
retrieval, KV-cache capacity and latency."""
