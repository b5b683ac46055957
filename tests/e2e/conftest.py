"""Fixtures of the e2e tests: a World (tests/support/world.py) with the operator running under the chart's RBAC, and
the BF16 demo model."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster
from tests.support.world import HOST_PATHS_ALLOWED, World, operated_world


@pytest.fixture
def world(
    control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> Iterator[World]:
    # These specs mount this machine's folders (hostpath://), so the chart's policy allows host paths, as for a kind
    # trial (tests/e2e/test_policy.py: the closed default).
    yield from operated_world(
        control_plane, namespace, tmp_path, caplog, values=HOST_PATHS_ALLOWED, kubelet_env={"HF_HUB_OFFLINE": "1"}
    )


@pytest.fixture(scope="session")
def model_dir(request: pytest.FixtureRequest) -> Path:
    """The BF16 demo model: tests.support.demo's `demo_model_dir` when that fixture exists, else kvcal.demo's cache."""
    try:
        found: Path = request.getfixturevalue("demo_model_dir")
        return found
    except pytest.FixtureLookupError:
        from kvcal.demo import demo_model_dir

        return demo_model_dir()


@pytest.fixture
def gateway_world(
    control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> Iterator[World]:
    """The World with the real HTTPRoute router under the chart's ServiceAccount and held metrics (the analysis keeps
    running); the test module installs the Gateway API CRDs it needs."""
    yield from operated_world(
        control_plane, namespace, tmp_path, caplog, values=HOST_PATHS_ALLOWED, gateway_router=True
    )
