"""`kvcal status|promote|abort|retry` and the gateway-api router against the real API server."""

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kvcal.adapters.router import GatewayApiRouter
from kvcal.cli import main
from kvcal.core.analysis.fleetnoise import FleetNoise, noise_status
from kvcal.models.spec import KVCalibrationSpec
from kvcal.ports import Conflict, Target
from tests.support.cluster import Cluster
from tests.support.gateway_api import HTTPROUTE_CRD

pytestmark = pytest.mark.cluster
EXAMPLE = Path(__file__).parents[2] / "examples" / "demo-cpu.yaml"
GROUP, VERSION, PLURAL = "kvcal.dev", "v1alpha1", "kvcalibrations"


def example() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return data


def test_status_and_gate_annotations(control_plane: Cluster, crd_installed: str, namespace: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    api = client.CustomObjectsApi(control_plane.api_client())
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, example())
    name = example()["metadata"]["name"]
    status = {"phase": "AwaitingPromotion", "canary": {"weight": 50, "stepIndex": 0, "readyReplicas": 1},
              "analysis": {"consecutiveSuccesses": 2, "ttftP95Delta": "+1.5%", "measurements": [
                  {"metric": "ttft-p95", "phase": "Successful", "at": "2026-12-02T10:00:00Z", "baseline": 0.2,
                   "canary": 0.203, "threshold": 0.25}]}}  # fmt: skip
    api.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, {"status": status})
    args = ["-n", namespace, "--kubeconfig", control_plane.kubeconfig]
    assert main(["status", name, *args]) == 0
    out = capsys.readouterr().out
    assert f"KVCalibration {namespace}/{name}" in out and "Phase: AwaitingPromotion" in out
    assert "steps: 50%, step 1/1, weight now 50%" in out and "ttft-p95" in out and "203.0ms" in out

    assert main(["promote", name, *args]) == 0
    retry_rc = main(["retry", name, *args])
    captured = capsys.readouterr()
    assert retry_rc == 0 and "the operator acts on retry in Failed, RolledBack" in captured.err
    obj: dict[str, Any] = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)  # type: ignore[assignment]
    annotations = obj["metadata"]["annotations"]
    assert annotations["kvcal.dev/promote"].endswith("Z") and "kvcal.dev/retry" in annotations
    assert main(["abort", "missing", *args]) == 1
    assert "not found" in capsys.readouterr().err


def test_plan_sizes_the_canary_with_the_noise_in_the_status(
    control_plane: Cluster, crd_installed: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The status the API server stores (status.noise, as the operator writes it) is what `kvcal plan` reads."""
    api = client.CustomObjectsApi(control_plane.api_client())
    body = example()
    body["metadata"]["name"] = "planned"
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    learned = FleetNoise(node=1e-4, own=6e-4, node_degrees=8, own_degrees=760, pods=9, intervals=96, requests=300,
                         slowdown=0.047)  # fmt: skip
    checks = KVCalibrationSpec.model_validate(body["spec"]).analysis.latency
    noise = [noise_status(check.metric, learned, "2026-12-07T00:00:00Z").to_wire() for check in checks]
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "planned", {"status": {"phase": "Verifying", "noise": noise}}
    )
    args = ["-n", namespace, "--kubeconfig", control_plane.kubeconfig]
    assert main(["plan", "planned", *args, "--canary-pods", "1,4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{noise[0]['metric']}: noise learned from 96 intervals of 9 baseline pods"), lines
    assert [line.split()[0] for line in lines[2:4]] == ["1", "4"], lines
    assert main(["status", "planned", *args]) == 0
    assert "Latency noise (kvcal plan sizes the canary with it)" in capsys.readouterr().out


def test_gateway_router_sets_and_restores_weights(control_plane: Cluster, namespace: str) -> None:
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(HTTPROUTE_CRD))
    control_plane.kubectl("wait", "--for=condition=Established", "crd/httproutes.gateway.networking.k8s.io")
    api_client = control_plane.api_client()
    api = client.CustomObjectsApi(api_client)
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "smollm2"},
             "spec": {"rules": [{"backendRefs": [{"name": "smollm2", "port": 8000}]}]}}  # fmt: skip
    api.create_namespaced_custom_object("gateway.networking.k8s.io", "v1", namespace, "httproutes", route)
    spec_data = example()["spec"]
    spec_data["serving"]["traffic"] = {"router": "gateway-api", "httpRoute": "smollm2", "steps": [10, 50]}
    target = Target(namespace=namespace, name="smollm2-demo", spec=KVCalibrationSpec.model_validate(spec_data),
                    canary_deployment="smollm2-demo-canary", canary_service="smollm2-demo-canary")  # fmt: skip
    router = GatewayApiRouter(api_client)

    def refs() -> list[dict[str, Any]]:
        obj: dict[str, Any] = api.get_namespaced_custom_object(  # type: ignore[assignment]
            "gateway.networking.k8s.io", "v1", namespace, "httproutes", "smollm2"
        )
        result: list[dict[str, Any]] = obj["spec"]["rules"][0]["backendRefs"]
        return result

    router.set_weight(target, 10)
    assert refs() == [{"name": "smollm2", "port": 8000, "weight": 90},
                      {"name": "smollm2-demo-canary", "port": 8000, "weight": 10}]  # fmt: skip
    router.set_weight(target, 0)
    assert refs() == [{"name": "smollm2", "port": 8000}]

    # An edit that landed after the pass read the route (0%) is not undone unseen: Conflict, and the pass re-reads.
    router.set_weight(target, 10)
    with pytest.raises(Conflict, match=rf"HTTPRoute {namespace}/smollm2 changed since this pass read it"):
        router.set_weight(target, 0, seen=(0, 0))
    assert router.get_weight(target) == 10
    router.set_weight(target, 0, seen=(10, 0))
    assert refs() == [{"name": "smollm2", "port": 8000}]

    # An edit between the router's own read and its patch: the API's 409 on the stale resourceVersion is a Conflict.
    class ReadsBeforeTheEdit(GatewayApiRouter):
        def _route(self, target: Target) -> dict[str, Any] | None:
            return stale

    stale = router._route(target)
    router.set_weight(target, 10)
    with pytest.raises(Conflict, match="changed since this pass read it"):
        ReadsBeforeTheEdit(api_client).set_weight(target, 50)
    assert router.get_weight(target) == 10
