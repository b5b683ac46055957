"""Issue #10 item 5 on the real API server: with router gateway-api, deleting a KVCalibration mid-Analyzing, or
rolling it back, first puts the HTTPRoute at 100% on the baseline, and only a drainDelay later deletes the canary
Service; an HTTPRoute edited behind the operator's back is reported and put back.

The operator runs in-process under the chart's ServiceAccount (tests/support/world.py's harness) with the real
GatewayApiRouter; the phases before Deploying are skipped by writing status (the calibrator and verifier are proven
in test_lifecycle): the operator only ever acts on what it reads.
"""

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kvcal.adapters.router import GatewayApiRouter, canary_share
from kvcal.ports import Target
from tests.support.cluster import Cluster, wait_for
from tests.support.gateway_api import HTTPROUTE_CRD
from tests.support.gateway_crds import GATEWAY_API, httproute_rules
from tests.support.recorder import PollingRecorder
from tests.support.world import (
    GatewayBackends,
    World,
    baseline,
    dataset_configmap,
    kvcalibration,
)

pytestmark = pytest.mark.cluster
DRAIN_SECONDS = 3
TRAFFIC = {"router": "gateway-api", "httpRoute": "llm", "steps": [30], "drainDelay": f"{DRAIN_SECONDS}s"}


@pytest.fixture
def world(gateway_world: World, control_plane: Cluster) -> World:
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(HTTPROUTE_CRD))
    control_plane.kubectl("wait", "--for=condition=Established", "crd/httproutes.gateway.networking.k8s.io")
    return gateway_world


def routes(w: World) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(w.cluster.api_client())


def route_rules(w: World) -> list[dict[str, Any]]:
    return httproute_rules(w.cluster, w.namespace)


def canary_weight(w: World, name: str) -> int:
    return canary_share(route_rules(w), "llm", f"{name}-canary")


def analyzing(w: World, name: str, tmp_path: Path) -> None:
    """Baseline, HTTPRoute and a KVCalibration brought to Analyzing at 30% on the canary."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    for m in [*baseline(model, replicas=1), dataset_configmap()]:
        w.apply(m)
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "llm"},
             "spec": {"rules": [{"backendRefs": [{"name": "llm", "port": 80}]}]}}  # fmt: skip
    routes(w).create_namespaced_custom_object(*GATEWAY_API, w.namespace, "httproutes", route)
    w.kubelet.hold("calibration")
    serving = {"baseline": {"deployment": "llm", "service": "llm"}, "traffic": TRAFFIC}
    w.apply(kvcalibration(name, model, w.out, serving=serving))
    obj = w.wait_phase(name, "Calibrating", 30)
    # Skip the calibrator and the verifier: the scales are "verified", the operator deploys the canary next.
    status = {"phase": "Deploying", "verification": {"job": f"{obj['status']['calibration']['job']}-v", "layers": 1,
                                                     "mismatches": 0}}  # fmt: skip
    w.cluster.kubectl("patch", "-n", w.namespace, f"kvcalibration/{name}", "--subresource=status", "--type=merge",
                      "-p", yaml.safe_dump({"status": status}))  # fmt: skip
    obj = w.wait_phase(name, "Analyzing", 60)
    assert obj["status"]["canary"]["weight"] == 30
    assert canary_weight(w, name) == 30


class Recorder(PollingRecorder):
    """Polls the HTTPRoute and the canary Service and records when each change was first seen."""

    def __init__(self, w: World, name: str) -> None:
        super().__init__()
        self.w, self.name = w, name
        self.route_zero_at: float | None = None
        self.service_gone_at: float | None = None
        self.weight_when_service_gone: int | None = None

    def poll(self) -> None:
        weight = canary_weight(self.w, self.name)
        service = self.w.kube.get("Service", self.w.namespace, f"{self.name}-canary")
        now = time.monotonic()
        if weight == 0 and self.route_zero_at is None:
            self.route_zero_at = now
        if service is None and self.service_gone_at is None:
            self.service_gone_at, self.weight_when_service_gone = now, weight

    def assert_routed_away_then_drained(self) -> None:
        assert self.route_zero_at is not None and self.service_gone_at is not None
        assert self.weight_when_service_gone == 0
        # The Service went only after the route had shown 0% for the drain delay (less the recorder's poll period).
        assert self.service_gone_at - self.route_zero_at >= DRAIN_SECONDS - 0.5, (
            self.route_zero_at,
            self.service_gone_at,
        )


def test_delete_mid_analysis_routes_to_the_baseline_before_deleting_the_canary(world: World, tmp_path: Path) -> None:
    w, name = world, "gw-delete"
    analyzing(w, name, tmp_path)
    with Recorder(w, name) as recorder:
        w.cluster.kubectl("delete", "-n", w.namespace, f"kvcalibration/{name}", "--wait=true", "--timeout=60s")
        wait_for(lambda: recorder.service_gone_at is not None, 10, "the recorder to see the canary Service gone")
    recorder.assert_routed_away_then_drained()
    assert w.kube.get("KVCalibration", w.namespace, name) is None
    assert route_rules(w) == [{"backendRefs": [{"name": "llm", "port": 80}]}]  # the route as it was
    assert w.children("Deployment", name) == [] and w.children("Job", name) == []
    assert w.kube.get("Deployment", w.namespace, "llm") is not None


def test_spec_change_mid_analysis_drains_the_canary_before_starting_over(world: World, tmp_path: Path) -> None:
    w, name = world, "gw-respec"
    analyzing(w, name, tmp_path)
    serving = {"baseline": {"deployment": "llm", "service": "llm"}, "traffic": TRAFFIC}
    with Recorder(w, name) as recorder:
        w.apply(kvcalibration(name, tmp_path / "model", w.out, serving=serving, calibration={"samples": 9}))
        wait_for(lambda: recorder.service_gone_at is not None, 60, "the recorder to see the canary Service gone")
    recorder.assert_routed_away_then_drained()
    assert route_rules(w) == [{"backendRefs": [{"name": "llm", "port": 80}]}]  # the route as it was
    obj = w.wait_phase(name, "Calibrating", 60)  # then it starts over, with the new inputs
    assert [h["reason"] for h in obj["status"]["history"]][-2:] == ["SpecChanged", "CalibrationStarted"]


def test_rollback_routes_to_the_baseline_before_deleting_the_canary(world: World, tmp_path: Path) -> None:
    w, name = world, "gw-abort"
    analyzing(w, name, tmp_path)
    with Recorder(w, name) as recorder:
        w.cluster.kubectl("annotate", "-n", w.namespace, f"kvcalibration/{name}", "kvcal.dev/abort=e2e")
        obj = w.wait_phase(name, "RolledBack", 60)
    recorder.assert_routed_away_then_drained()
    assert obj["status"]["canary"]["weight"] == 0 and w.children("Deployment", name) == []
    assert [h["phase"] for h in obj["status"]["history"]][-2:] == ["RollingBack", "RolledBack"]


def edit_route_to_40(w: World, name: str) -> None:
    """Someone else's edit of the HTTPRoute: 40% to the canary instead of the step's 30%."""
    rules = route_rules(w)
    for ref in rules[0]["backendRefs"]:
        ref["weight"] = 40 if ref["name"] == f"{name}-canary" else 60
    patch = {"spec": {"rules": rules}}
    routes(w).patch_namespaced_custom_object(*GATEWAY_API, w.namespace, "httproutes", "llm", patch,
                                             _content_type="application/merge-patch+json")  # fmt: skip


def assert_drift_reported_and_put_back(w: World, name: str) -> None:
    wait_for(lambda: "WeightDrift" in w.events(name), 30, "a WeightDrift event")
    wait_for(lambda: canary_weight(w, name) == 30, 30, "the HTTPRoute back at 30% on the canary")
    drift = w.cluster.get_json("events", "-n", w.namespace, "--field-selector", "reason=WeightDrift")["items"]
    event: dict[str, Any] = drift[0]  # type: ignore[index]
    assert event["type"] == "Warning" and "sent 40% to the canary, not 30%" in event["message"]
    assert w.phase(name) == "Analyzing"


def test_route_edited_during_analysis_is_reported_and_put_back(world: World, tmp_path: Path) -> None:
    w, name = world, "gw-drift"
    analyzing(w, name, tmp_path)
    edit_route_to_40(w, name)
    assert_drift_reported_and_put_back(w, name)


class EditedAfterItsRead(GatewayApiRouter):
    """The operator's real router, with someone else's edit landing right after the pass has read the route and before
    it writes: the race a 1 s analysis pass sometimes loses to a person's (or a GitOps tool's) edit."""

    def __init__(self, router: GatewayApiRouter, edit: Callable[[], None]) -> None:
        self.api, self.edit = router.api, edit

    def get_mirror(self, target: Target) -> int | None:  # the pass reads the weight, then the mirror
        mirror = super().get_mirror(target)
        edit, self.edit = self.edit, lambda: None
        edit()
        return mirror


def test_route_edited_between_the_pass_read_and_its_write_is_reported(world: World, tmp_path: Path) -> None:
    """CI on stop 33: the pass read 30%, the edit to 40% landed, the pass put 30% back without a WeightDrift event."""
    w, name = world, "gw-race"
    analyzing(w, name, tmp_path)
    backends = w.backends
    assert isinstance(backends, GatewayBackends) and backends.router_fake is not None
    backends.router_fake = EditedAfterItsRead(backends.router_fake, lambda: edit_route_to_40(w, name))
    assert_drift_reported_and_put_back(w, name)
