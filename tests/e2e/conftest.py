"""Fixtures of the e2e tests: a World (tests/support/world.py) with the operator running under the chart's RBAC, and
the BF16 demo model."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import config

from kvcal.adapters.kube import KubeClient
from kvcal.adapters.router import GatewayApiRouter
from tests.support.chart import install_chart, operator_policy, release_name, uninstall_chart
from tests.support.cluster import Cluster
from tests.support.kubelet import FakeKubelet
from tests.support.world import HOST_PATHS_ALLOWED, FakeBackends, GatewayBackends, OperatorThread, World


@pytest.fixture
def world(
    control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> Iterator[World]:
    # The operator authenticates as the ServiceAccount of charts/kvcal installed with namespace-scoped RBAC; the
    # harness (playing kubelet and the test's user) keeps the admin client. These specs mount this machine's folders
    # (hostpath://), so the chart's policy allows host paths, as for a kind trial (tests/e2e/test_policy.py: the
    # closed default).
    values = {"rbac.scope": "namespace", **HOST_PATHS_ALLOWED}
    release = install_chart(control_plane, namespace, release_name(), values, tmp_path)
    kube = KubeClient(control_plane.api_client())
    kubelet = FakeKubelet(kube, namespace, tmp_path, extra_env={"HF_HUB_OFFLINE": "1"}).start()
    backends = FakeBackends()
    operator = OperatorThread(release.kubeconfig, namespace, backends, operator_policy(control_plane, release))
    operator.start()
    try:
        yield World(control_plane, namespace, kube, kubelet, operator, backends, tmp_path / "out")
        forbidden = [r.getMessage() for r in caplog.records if "forbidden" in r.getMessage().lower()]
        assert not forbidden, f"the chart's RBAC refused the operator: {forbidden[:3]}"
    finally:
        operator.stop()
        kubelet.stop()
        uninstall_chart(control_plane, release)


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
    values = {"rbac.scope": "namespace", **HOST_PATHS_ALLOWED}  # the specs mount this machine's folders
    release = install_chart(control_plane, namespace, release_name(), values, tmp_path)
    kube = KubeClient(control_plane.api_client())
    kubelet = FakeKubelet(kube, namespace, tmp_path).start()
    sa_api = config.new_client_from_config(config_file=str(release.kubeconfig))  # type: ignore[no-untyped-call]
    backends = GatewayBackends(router_fake=GatewayApiRouter(sa_api))
    backends.metrics_fake.held.set()
    operator = OperatorThread(release.kubeconfig, namespace, backends, operator_policy(control_plane, release))
    operator.start()
    try:
        yield World(control_plane, namespace, kube, kubelet, operator, backends, tmp_path / "out")
        forbidden = [r.getMessage() for r in caplog.records if "forbidden" in r.getMessage().lower()]
        assert not forbidden, f"the chart's RBAC refused the operator: {forbidden[:3]}"
    finally:
        operator.stop()
        kubelet.stop()
        uninstall_chart(control_plane, release)
