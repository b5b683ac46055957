"""The real Gateway API CRDs (standard channel: GatewayClass, Gateway, HTTPRoute, ...) as `make gateway` caches them
beside the gateway it builds (hack/build-gateway.sh), installed into a test control plane."""

import os
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.support import prereq
from tests.support.cluster import Cluster

GATEWAY_API = ("gateway.networking.k8s.io", "v1")


def gateway_api_crds() -> Path:
    cache = Path(os.environ.get("KVCAL_CACHE", Path.home() / ".cache" / "kvcal"))
    crds = cache / "share" / "gateway-api" / "crds"
    prereq.require(crds.is_dir() and any(crds.glob("*.yaml")), f"the Gateway API CRDs in {crds}: run `make gateway`")
    return crds


def install_gateway_api_crds(cluster: Cluster) -> None:
    """Server-side, forced: an earlier test may have installed a hand-written HTTPRoute CRD of the same name."""
    crds = gateway_api_crds()
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    for name in ("gatewayclasses", "gateways", "httproutes"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}.gateway.networking.k8s.io")


def httproute_rules(cluster: Cluster, namespace: str, name: str = "llm") -> list[dict[str, Any]]:
    """An HTTPRoute's rules as the API server stores them (the real schema fills in defaults)."""
    api = client.CustomObjectsApi(cluster.api_client())
    route: dict[str, Any] = api.get_namespaced_custom_object(*GATEWAY_API, namespace, "httproutes", name)  # type: ignore[assignment]
    rules: list[dict[str, Any]] = route["spec"]["rules"]
    return rules
