"""A control plane with a real kube-scheduler and GPU Nodes, for the tests where placement is the question.

`scheduled_plane` (module): etcd + kube-apiserver + kube-controller-manager + kube-scheduler (the same Go module as the
session's control plane), the KVCalibration CRD installed. Nodes are what the test adds (`gpu_nodes`): Ready, with
`nvidia.com/gpu` as an extended resource, labelled for one test so no other test's pods land there. The kubelet harness
(`scheduled=True`) runs only the pods the scheduler bound; the others stay Pending with the scheduler's reason.
"""

from collections.abc import Callable, Iterator

import pytest

from kvcal.devenv.controlplane import ControlPlane, default_bin_dir, missing_binaries
from tests.support.cluster import CRD_DIR, Cluster, fresh_namespace
from tests.support.prereq import require

GPU = "nvidia.com/gpu"
NODE_LABEL = "kvcal.dev/test-node-pool"  # the test's Nodes carry it, its baseline's pods select it


@pytest.fixture(scope="module")
def scheduled_plane() -> Iterator[Cluster]:
    bin_dir = default_bin_dir()
    missing = missing_binaries(bin_dir)
    require(not missing, f"control-plane binaries missing in {bin_dir}: {', '.join(missing)} (make control-plane)")
    plane = ControlPlane(bin_dir, crds=sorted(CRD_DIR.glob("*.yaml")), scheduler=True).start()
    try:
        yield Cluster(plane)
    finally:
        plane.stop()


@pytest.fixture
def scheduled_namespace(scheduled_plane: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from fresh_namespace(scheduled_plane, request)


NodeAdder = Callable[[int], str]


@pytest.fixture
def gpu_nodes(scheduled_plane: Cluster, scheduled_namespace: str) -> Iterator[NodeAdder]:
    """`add(gpus)` adds a Ready Node with that many GPUs in this test's pool and returns its name; removed after."""
    added: list[str] = []

    def add(gpus: int) -> str:
        name = f"gpu-{len(added)}-{scheduled_namespace}"[:63].rstrip("-")
        scheduled_plane.plane.add_node(name, {GPU: str(gpus)}, {NODE_LABEL: scheduled_namespace})
        added.append(name)
        return name

    yield add
    for name in added:
        scheduled_plane.kubectl("delete", "node", name, "--wait=false", check=False)


def on_gpu_nodes(manifest: dict[str, object], pool: str, gpus: int = 1) -> dict[str, object]:
    """A baseline Deployment whose vLLM container asks for `gpus` GPUs on the test's Nodes (as a GPU fleet's does)."""
    template = manifest["spec"]["template"]["spec"]  # type: ignore[index]
    template["nodeSelector"] = {NODE_LABEL: pool}
    template["containers"][0]["resources"] = {"limits": {GPU: str(gpus)}, "requests": {GPU: str(gpus)}}
    return manifest


def gpu_use(cluster: Cluster, namespace: str) -> dict[str, int]:
    """GPUs requested per Node by the namespace's pods bound there (what the scheduler counts)."""
    pods = cluster.get_json("pods", "-n", namespace)["items"]
    used: dict[str, int] = {}
    for pod in pods:  # type: ignore[attr-defined]
        node = pod["spec"].get("nodeName")
        if not node:
            continue
        asks = sum(int((c.get("resources") or {}).get("requests", {}).get(GPU, 0)) for c in pod["spec"]["containers"])
        used[node] = used.get(node, 0) + asks
    return used
