"""The promotion's apply configuration on the real API server, for each way a baseline Deployment may roll: a
baseline without room to surge (GPU-tight: maxSurge 0, or Recreate) keeps its own strategy, and the API server
accepts the promotion; one with surge rolls without dropping below its ready replicas."""

from typing import Any

import pytest

from kvcal.adapters.kube import KubeClient
from kvcal.core.manifests import FIELD_MANAGER, Owner, build_promoted_baseline
from tests.support.cluster import Cluster
from tests.support.decide import OWNER, baseline_manifest, spec

pytestmark = pytest.mark.cluster

STRATEGIES: dict[str, dict[str, Any]] = {
    "recreate": {"type": "Recreate"},
    "surge-0": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
    "surge-1": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}},
}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_the_api_server_accepts_the_promotion_of_each_strategy(
    control_plane: Cluster, namespace: str, name: str
) -> None:
    kube = KubeClient(control_plane.api_client())
    baseline = baseline_manifest()
    baseline["metadata"] = {"name": "llm", "namespace": namespace, "labels": {"app": "llm"}}
    baseline["spec"]["strategy"] = STRATEGIES[name]
    assert kube.create(baseline)
    owner = Owner(OWNER.name, namespace, OWNER.uid)
    created = kube.get("Deployment", namespace, "llm")
    assert created is not None

    kube.apply_owned_fields(build_promoted_baseline(owner, spec(), "12924712", created), FIELD_MANAGER)

    promoted = kube.get("Deployment", namespace, "llm")
    assert promoted is not None
    args = promoted["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    strategy = promoted["spec"]["strategy"]
    if name == "surge-1":
        assert strategy["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    else:
        assert strategy == created["spec"]["strategy"]  # the owner's, untouched
