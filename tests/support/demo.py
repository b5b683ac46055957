"""pytest fixtures: demo (see tests/conftest.py)."""
