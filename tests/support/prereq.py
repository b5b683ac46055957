"""A test's missing prerequisite: skipped on a workstation, a failure in CI when an install could provide it.

Under CI (the environment variable CI set to anything but "", "false" or "0") a green run must mean every headline
test ran, so a prerequisite CI forgot to install (a binary, a package) fails the run instead of vanishing into the
skip count. The same holds for hardware (`require_hardware`: AVX-512 for vLLM's FP8 KV on CPU, GPUs): under CI a
missing feature fails the run, so a green run never hides untested FP8 paths; on a workstation it skips, unless
KVCAL_REQUIRE_HARDWARE is set.
"""

import importlib
import os
from types import ModuleType

import pytest

HARDWARE_ENV = "KVCAL_REQUIRE_HARDWARE"


def _set(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "false", "0")


def in_ci() -> bool:
    return _set("CI")


def require(available: object, reason: str) -> None:
    """Return when ``available`` is truthy; else fail under CI and skip elsewhere, saying ``reason``."""
    if available:
        return
    if in_ci():
        pytest.fail(f"missing prerequisite (CI is set, so this fails instead of skipping): {reason}", pytrace=False)
    pytest.skip(reason)


def require_hardware(available: object, reason: str) -> None:
    """Return when ``available`` is truthy; else fail under CI or with KVCAL_REQUIRE_HARDWARE, skip elsewhere."""
    if available:
        return
    if in_ci() or _set(HARDWARE_ENV):
        pytest.fail(
            f"missing hardware (CI or {HARDWARE_ENV} is set, so this fails instead of skipping): {reason}",
            pytrace=False,
        )
    pytest.skip(f"this machine's hardware: {reason}")


def require_module(name: str, reason: str) -> ModuleType:
    """The imported module, as pytest.importorskip gives it, through require()."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        require(False, f"{reason} ({error})")
        raise  # unreachable: require() raised
