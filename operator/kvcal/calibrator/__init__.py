"""The calibration Job and `kvcal calibrate`: FP8 KV-cache scales with llm-compressor, and a report that proves them.

Torch and llm-compressor are imported only by the modules that need them, so `config` stays importable without them.
"""
