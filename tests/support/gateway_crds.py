"""The real Gateway API CRDs (standard channel: GatewayClass, Gateway, HTTPRoute, ...) as `make gateway` caches them
beside the gateway it builds (hack/build-gateway.sh), installed into a test control plane."""

import os
from pathlib import Path

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
