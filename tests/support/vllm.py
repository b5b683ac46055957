"""pytest fixtures: vllm (see tests/conftest.py)."""
