"""Two `kvcal operator run --leader-elect` processes (the chart's command line) under the chart's ServiceAccount on the
real API server: only the Lease holder acts, a SIGKILLed leader is replaced within 30 s and the lifecycle continues,
and a graceful stop hands the Lease over at once."""

import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal.adapters.kube import KubeClient
from kvcal.core.manifests import calibration_job_name
from kvcal.core.spechash import spec_hash
from kvcal.local import free_port
from kvcal.models.spec import KVCalibrationSpec
from kvcal.services.leader import ElectionTiming
from tests.support.chart import Release, helm, install_chart, release_name, uninstall_chart
from tests.support.cluster import Cluster, wait_for

pytestmark = pytest.mark.cluster
TAKEOVER_LIMIT = 30.0  # the goal: a standby leads within 30 s of the leader's death


@dataclass
class Replica:
    identity: str
    process: subprocess.Popen[bytes]
    metrics_port: int
    health_port: int
    log: Path

    def metric(self, name: str) -> float:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return -1.0
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False


@dataclass
class Election:
    cluster: Cluster
    namespace: str
    release: Release
    lease_name: str
    kube: KubeClient
    workdir: Path
    replicas: list[Replica]

    def start(self, identity: str) -> Replica:
        """The chart's Deployment command line, with this test's ports and the chart ServiceAccount's kubeconfig."""
        metrics_port, health_port = free_port(), free_port()
        log = self.workdir / f"{identity}.log"
        argv = [
            sys.executable,
            "-m",
            "kvcal",
            "operator",
            "run",
            *self.chart_args(),
            f"--identity={identity}",
            f"--lease-namespace={self.namespace}",
            f"--metrics-port={metrics_port}",
            f"--liveness=http://127.0.0.1:{health_port}/healthz",
            "--kubeconfig",
            str(self.release.kubeconfig),
        ]
        with log.open("w") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.cluster.env())
        replica = Replica(identity, process, metrics_port, health_port, log)
        self.replicas.append(replica)
        return replica

    def chart_args(self) -> list[str]:
        manifest = helm(self.cluster, "get", "manifest", self.release.name, "--namespace", self.namespace).stdout
        (deployment,) = [d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "Deployment"]
        args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        return [a for a in args if not a.startswith(("--metrics-port", "--liveness", "--identity"))]

    def holder(self) -> str | None:
        lease = self.cluster.get_json("lease", self.lease_name, "-n", self.namespace)
        holder: str | None = (lease.get("spec") or {}).get("holderIdentity")  # type: ignore[union-attr]
        return holder

    def lease_time(self, field: str) -> datetime:
        """A MicroTime of the Lease's spec (renewTime, acquireTime), as its holder wrote it."""
        lease = self.cluster.get_json("lease", self.lease_name, "-n", self.namespace)
        value: str = lease["spec"][field]  # type: ignore[index]
        return datetime.fromisoformat(value)

    def lease_exists(self) -> bool:
        return self.cluster.kubectl("get", "lease", self.lease_name, "-n", self.namespace, check=False).returncode == 0

    def apply(self, name: str) -> str:
        """A KVCalibration; returns the name of the calibration Job the leader must create for it."""
        manifest: dict[str, Any] = {
            "apiVersion": "kvcal.dev/v1alpha1",
            "kind": "KVCalibration",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "model": {"source": "pvc://models/smollm2"},
                "calibration": {"dataset": {"source": "configmap://prompts/p.jsonl"}, "output": f"pvc://out/{name}"},
                "serving": {"baseline": {"deployment": "llm", "service": "llm"}},
            },
        }
        assert self.kube.create(manifest)
        return calibration_job_name(name, spec_hash(KVCalibrationSpec.model_validate(manifest["spec"])))

    def job_exists(self, job: str) -> bool:
        return self.kube.get("Job", self.namespace, job) is not None


@pytest.fixture
def election(control_plane: Cluster, crd_installed: str, namespace: str, tmp_path: Path) -> Iterator[Election]:
    release = install_chart(control_plane, namespace, release_name(), {"rbac.scope": "namespace"}, tmp_path)
    manifest = helm(control_plane, "get", "manifest", release.name, "--namespace", namespace).stdout
    (role,) = [
        d
        for d in yaml.safe_load_all(manifest)
        if d and d["metadata"]["name"].endswith("-leader-election") and d["kind"] == "Role"
    ]
    (lease_name,) = {n for rule in role["rules"] for n in rule.get("resourceNames", [])}
    found = Election(
        control_plane, namespace, release, lease_name, KubeClient(control_plane.api_client()), tmp_path, []
    )
    try:
        yield found
    finally:
        for replica in found.replicas:
            if replica.process.poll() is None:
                replica.process.kill()
                replica.process.wait(30)
        uninstall_chart(control_plane, release)
    for replica in found.replicas:
        denied = [line for line in replica.log.read_text().splitlines() if "forbidden" in line.lower()]
        assert denied == [], f"{replica.identity}: {denied[:3]}"


def test_only_the_leader_acts_and_a_standby_takes_over(election: Election) -> None:
    first = election.start("replica-a")
    wait_for(lambda: election.lease_exists() and election.holder() == "replica-a", 60, "replica-a to lead")
    second = election.start("replica-b")
    wait_for(second.healthy, 60, "the standby's liveness endpoint")
    wait_for(lambda: second.metric("kvcal_leader") == 0.0, 30, "the standby's metrics (kvcal_leader 0)")

    job = election.apply("before")
    wait_for(lambda: election.job_exists(job), 60, "the leader to create the first Job")
    assert first.metric("kvcal_leader") == 1.0
    wait_for(lambda: first.metric("kvcal_reconciles_total") > 0, 30, "the leader's pass to end")
    assert second.metric("kvcal_reconciles_total") == 0.0, "the standby reconciled"
    assert election.holder() == "replica-a"

    # The leader dies without a word: the standby waits out the lease, then leads and continues the lifecycle.
    first.process.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    first.process.wait(30)
    job = election.apply("after")
    wait_for(lambda: election.holder() == "replica-b", TAKEOVER_LIMIT, "replica-b to take over")
    wait_for(lambda: election.job_exists(job), TAKEOVER_LIMIT - (time.monotonic() - killed), "the new leader's Job")
    took = time.monotonic() - killed
    assert took <= TAKEOVER_LIMIT
    assert second.metric("kvcal_leader") == 1.0
    print(f"takeover after SIGKILL: {took:.1f} s (lease {ElectionTiming().lease_seconds} s)")

    # A graceful stop releases the lease: a fresh standby leads long before the lease would have expired.
    third = election.start("replica-c")
    wait_for(third.healthy, 60, "the third replica standing by")
    second.process.send_signal(signal.SIGTERM)
    assert second.process.wait(60) == 0
    assert election.holder() != "replica-b", "the lease was not released on a graceful stop"
    released = election.lease_time("renewTime")  # the release writes it; the lease is unchanged until replica-c acts
    wait_for(lambda: election.holder() == "replica-c", TAKEOVER_LIMIT, "replica-c to take the released lease")
    # By the Lease's own timestamps, not the test's wall clock: an expired lease is taken no sooner than
    # lease_seconds after its last change, a released one at replica-c's next retry.
    handover = (election.lease_time("acquireTime") - released).total_seconds()
    assert handover < ElectionTiming().lease_seconds, f"{handover:.1f} s: the lease expired, not released"
    job = election.apply("handed-over")
    wait_for(lambda: election.job_exists(job), 60, "replica-c's Job")
