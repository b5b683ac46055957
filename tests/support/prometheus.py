"""pytest fixtures: prometheus (see tests/conftest.py)."""
