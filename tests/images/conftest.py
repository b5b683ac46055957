"""Image tests: `images` (built and run with podman on every `make test`) and `heavy_images` (torch and vLLM images,
tens of minutes cold: `make test-images`, or KVCAL_HEAVY_IMAGES=1). Heavy tests are deselected, not skipped,
unless asked for, so a green `make test` never hides one in the skip count."""

import os

import pytest

HEAVY = "heavy_images"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("KVCAL_HEAVY_IMAGES") == "1":
        return
    heavy = [item for item in items if item.get_closest_marker(HEAVY)]
    if heavy:
        config.hook.pytest_deselected(items=heavy)
        items[:] = [item for item in items if not item.get_closest_marker(HEAVY)]
