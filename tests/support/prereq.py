"""A test's missing prerequisite (a binary, a package, a CPU feature): skipped on a workstation, a failure in CI.

Under CI (the environment variable CI set to anything but "", "false" or "0") a green run must mean every headline
test ran, so a prerequisite CI forgot to install fails the run instead of vanishing into the skip count.
"""

import importlib
import os
from types import ModuleType

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "false", "0")


def require(available: object, reason: str) -> None:
    """Return when ``available`` is truthy; else fail under CI and skip elsewhere, saying ``reason``."""
    if available:
        return
    if in_ci():
        pytest.fail(f"missing prerequisite (CI is set, so this fails instead of skipping): {reason}", pytrace=False)
    pytest.skip(reason)


def require_module(name: str, reason: str) -> ModuleType:
    """The imported module, as pytest.importorskip gives it, through require()."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        require(False, f"{reason} ({error})")
        raise  # unreachable: require() raised
