"""Issue #10 item 7 on the real API server: every status.history entry gets exactly one Event, however often the
operator dies. Lifecycle events are sent from status.history under names fixed by (object uid, entry), so a
restarted operator re-sends what the killed one had not (AlreadyExists: it had).

- deterministic: a Reconciler whose Kube dies right after the status write (before any event), then a fresh one;
- kill -9: `kvcal operator run` as a subprocess under the chart's ServiceAccount, killed each time a status write is
  seen, on several objects going through Calibrating, Analyzing, RollingBack/RolledBack and Promoting/Succeeded
  (the calibrator and verifier are skipped by writing status; the fake kubelet plays the pods).
"""

import copy
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal.adapters.kube import KubeClient
from kvcal.ports import Manifest
from kvcal.services.reconciler import Reconciler
from tests.support.chart import Release, install_chart, release_name, uninstall_chart
from tests.support.cluster import Cluster, wait_for
from tests.support.kubelet import FakeKubelet
from tests.support.world import (
    HOST_PATHS_ALLOWED,
    HOST_PATHS_POLICY,
    DiesAfterStatusWrite,
    Killed,
    baseline,
    kvcalibration,
    setup_namespace,
)

pytestmark = pytest.mark.cluster
TERMINAL = ("RolledBack", "Succeeded")


def operator_events(cluster: Cluster, namespace: str, obj: Manifest) -> Counter[str]:
    """The operator's Events about `obj` whose reason is one of its history entries' (the lifecycle events; the
    others are best effort and not counted)."""
    uid, lifecycle = obj["metadata"]["uid"], set(history_reasons(obj))
    items: list[dict[str, Any]] = cluster.get_json(  # type: ignore[assignment]
        "events", "-n", namespace, "--field-selector", f"involvedObject.uid={uid}"
    )["items"]
    mine = [e for e in items if e.get("source", {}).get("component") == "kvcal-operator"]
    return Counter(e["reason"] for e in mine if e["reason"] in lifecycle)


def history_reasons(obj: Manifest) -> Counter[str]:
    return Counter(h["reason"] for h in obj["status"]["history"])


def own_baseline(name: str, model: Path) -> list[Manifest]:
    """The lifecycle tests' baseline Deployment and Service, renamed to `<name>-llm` with a selector of its own."""
    deployment, service = copy.deepcopy(baseline(model, replicas=1))
    labels = {"app": f"{name}-llm"}
    deployment["metadata"].update(name=f"{name}-llm", labels=labels)
    deployment["spec"]["selector"]["matchLabels"] = labels
    deployment["spec"]["template"]["metadata"]["labels"] = labels
    service["metadata"]["name"] = f"{name}-llm"
    service["spec"]["selector"] = labels
    return [deployment, service]


def test_killed_after_the_status_write_a_restart_sends_the_lost_events_once(
    control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path
) -> None:
    setup_namespace(control_plane, namespace, tmp_path / "model")
    name = "killed"
    control_plane.kubectl("apply", "-n", namespace, "-f", "-",
                          input=yaml.safe_dump(kvcalibration(name, tmp_path / "model", tmp_path / "out")))  # fmt: skip
    api = control_plane.api_client()

    def clock() -> datetime:
        return datetime.now(UTC)

    kube = KubeClient(api)
    for gate in (None, "kvcal.dev/abort"):  # Pending -> Calibrating, then Calibrating -> RollingBack
        if gate:
            control_plane.kubectl("annotate", "-n", namespace, f"kvcalibration/{name}", f"{gate}=e2e")
        with pytest.raises(Killed):
            Reconciler(DiesAfterStatusWrite(api), clock, policy=HOST_PATHS_POLICY).reconcile(namespace, name)
        restarted = Reconciler(kube, clock, policy=HOST_PATHS_POLICY)
        restarted.reconcile(namespace, name)
        restarted.reconcile(namespace, name)
    obj = kube.get("KVCalibration", namespace, name)
    assert obj is not None
    assert [h["phase"] for h in obj["status"]["history"]] == ["Calibrating", "RollingBack", "RolledBack"]
    assert operator_events(control_plane, namespace, obj) == history_reasons(obj)


class OperatorProcess:
    """`kvcal operator run` as its own process, killed with SIGKILL and started again."""

    def __init__(self, cluster: Cluster, release: Release, namespace: str, log: Path) -> None:
        self.argv = [sys.executable, "-m", "kvcal", "operator", "run", "--kubeconfig", str(release.kubeconfig),
                     "-n", namespace, "--standalone", "--allow-hostpath-prefix=/",
                     # The Prometheus the specs name (nothing listens there): the only one they may query.
                     '--prometheus={"name": "default", "address": "http://127.0.0.1:9"}']  # fmt: skip
        self.env = cluster.env(str(release.kubeconfig))
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.kills += 1
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
            self.proc = None


@pytest.fixture
def operator(
    control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path
) -> Iterator[tuple[OperatorProcess, FakeKubelet]]:
    values = {"rbac.scope": "namespace", **HOST_PATHS_ALLOWED}  # the specs mount this machine's folders
    release = install_chart(control_plane, namespace, release_name(), values, tmp_path)
    kubelet = FakeKubelet(KubeClient(control_plane.api_client()), namespace, tmp_path).start()
    kubelet.hold("calibration")
    process = OperatorProcess(control_plane, release, namespace, tmp_path / "operator.log")
    try:
        yield process, kubelet
    finally:
        process.stop()
        kubelet.stop()
        uninstall_chart(control_plane, release)


@pytest.mark.timeout(300)
def test_kill_9_across_phases_loses_no_event_and_sends_none_twice(
    control_plane: Cluster, namespace: str, tmp_path: Path, operator: tuple[OperatorProcess, FakeKubelet]
) -> None:
    process, _ = operator
    cluster, kube = control_plane, KubeClient(control_plane.api_client())
    setup_namespace(cluster, namespace, tmp_path / "model")
    # Analysis against nothing (refused connections): errors roll the `rollback-*` objects back after two intervals.
    analysis = {"interval": "1s", "warmup": "0s", "consecutiveErrorLimit": 1,
                "prometheus": {"address": "http://127.0.0.1:9"}}  # fmt: skip
    names = [f"{path}-{i}" for path in ("rollback", "promote") for i in range(4)]
    for name in names:
        # Each object has its own baseline and output: a promoted baseline serves its output, which no other
        # calibration may overwrite (OutputInUse), and two promotions of one Deployment would contend.
        for manifest in own_baseline(name, tmp_path / "model"):
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))
        serving = {"baseline": {"deployment": f"{name}-llm", "service": f"{name}-llm"}}
        body = kvcalibration(name, tmp_path / "model", tmp_path / "out" / name, analysis=analysis, serving=serving)
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body))
    process.start()

    def objects() -> dict[str, Manifest]:
        return {o["metadata"]["name"]: o for o in kube.list("KVCalibration", namespace, {})}

    def skip_to(name: str, phase: str) -> None:
        """Past the calibrator and the verifier: status as a verified calibration would leave it (no history)."""
        status = {"phase": phase, "verification": {"job": "skipped", "layers": 1, "mismatches": 0}}
        cluster.kubectl("patch", "-n", namespace, f"kvcalibration/{name}", "--subresource=status", "--type=merge",
                        "-p", yaml.safe_dump({"status": status}))  # fmt: skip

    seen: dict[str, Any] = {}  # name -> the status last acted on
    deadline = time.monotonic() + 180
    while True:
        current = objects()
        phases = {n: (o.get("status") or {}).get("phase") for n, o in current.items()}
        if all(p in TERMINAL for p in phases.values()):
            break
        assert time.monotonic() < deadline, f"not all terminal: {phases}, {process.kills} kills"
        written = [n for n, o in current.items() if o.get("status") != seen.get(n)]
        if written:  # a status write just landed: kill the operator now, between that write and its events if we can
            process.kill()
            for n in written:
                seen[n] = current[n].get("status")
                if phases[n] == "Calibrating":
                    skip_to(n, "Deploying" if n.startswith("rollback") else "AwaitingPromotion")
                if phases[n] == "AwaitingPromotion":
                    cluster.kubectl("annotate", "--overwrite", "-n", namespace, f"kvcalibration/{n}",
                                    "kvcal.dev/promote=e2e")  # fmt: skip
            process.start()
        wait_for(lambda before=current: objects() != before, 30, f"the next write (phases: {phases})")  # type: ignore[misc]

    assert process.kills >= 10, process.kills
    final = objects()
    assert {n: o["status"]["phase"] for n, o in final.items()} == {
        n: "RolledBack" if n.startswith("rollback") else "Succeeded" for n in names
    }

    def all_sent() -> bool:
        return all(operator_events(cluster, namespace, o) >= history_reasons(o) for o in final.values())

    wait_for(all_sent, 30, "an Event for every history entry")
    for obj in final.values():
        events = operator_events(cluster, namespace, obj)
        assert events == history_reasons(obj), (obj["metadata"]["name"], events, obj["status"]["history"])
