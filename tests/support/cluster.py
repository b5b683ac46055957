"""pytest fixtures: cluster (see tests/conftest.py)."""
