"""Operator benchmark on a real control plane: apply -> calibration Job created latency with N KVCalibrations
present, and the operator's memory.

    python benchmarks/bench_operator.py [--objects 500 5000] [--probes 40]

For each --objects scale (one column each, side by side): starts etcd + kube-apiserver + kube-controller-manager
(kvcal.devenv), runs `kvcal operator run` as a subprocess (as in production), creates that many KVCalibrations and
waits until each has its calibration Job (nothing plays kubelet, so they stay Calibrating and keep polling), then
applies --probes more one at a time and times each from the create call (the apply) to the Job being readable (polled
every 10 ms: that is the resolution). Creating 5,000 objects and their Jobs costs the API server ~40,000 writes: on 2
quiet cores all 5,000 Jobs existed 230 s after the first create, but on cores shared with other work the column takes
hours (the API server, not the operator, is the bottleneck); `--objects 500` is the quick run.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcal.adapters.kube import KubeClient
from kvcal.core.manifests import calibration_job_name
from kvcal.core.spechash import spec_hash
from kvcal.devenv.controlplane import ControlPlane, default_bin_dir
from kvcal.models.spec import KVCalibrationSpec
from kvcal.ports import Kind

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "bench"
CREATORS = 8


def kvcalibration(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "kvcal.dev/v1alpha1",
        "kind": "KVCalibration",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": {"source": "pvc://models/smollm2"},
            "calibration": {"dataset": {"source": "configmap://prompts/p.jsonl"}, "output": f"pvc://models/{name}"},
            "serving": {"baseline": {"deployment": "llm", "service": "llm"}},
        },
    }


def job_name(name: str) -> str:
    return calibration_job_name(name, spec_hash(KVCalibrationSpec.model_validate(kvcalibration(name)["spec"])))


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def count(kube: KubeClient, kind: Kind) -> int:
    """Objects of a kind in the namespace, from a one-item page: listing 5,000 Jobs every poll would load the API
    server more than the operator does (everything in the namespace is the benchmark's)."""
    page = kube.request("GET", kind, NAMESPACE, query={"limit": "1"})
    return len(page["items"]) + int(page["metadata"].get("remainingItemCount") or 0)


def wait_jobs(kube: KubeClient, expected: int, timeout: float) -> float:
    start = time.monotonic()
    while True:
        jobs = count(kube, "Job")
        if jobs >= expected:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise SystemExit(f"only {jobs}/{expected} Jobs after {timeout:.0f}s")
        time.sleep(1.0)  # benchmark poll of a bulk count


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Run:
    objects: int
    created_s: float
    settle_s: float
    latencies: list[float]
    idle_rss: float
    loaded_rss: float
    final_rss: float
    peak_rss: float


def measure(objects: int, probes: int) -> Run:
    """One fresh control plane and operator: `objects` KVCalibrations, then `probes` timed applies."""
    # No kube-controller-manager: in a cluster it runs on the control plane's nodes, here it would spend the same 2
    # cores on 5,000 Jobs' Pods (no scheduler or kubelet runs them anyway).
    with ControlPlane(default_bin_dir(), controller_manager=False) as plane:
        kubectl = [str(plane.bin_dir / "kubectl"), "--kubeconfig", str(plane.kubeconfig)]
        subprocess.run([*kubectl, "apply", "-f", str(REPO / "crds")], check=True, capture_output=True)
        wait_established(kubectl)
        subprocess.run([*kubectl, "create", "namespace", NAMESPACE], check=True, capture_output=True)
        log = (plane.dir / "operator.log").open("wb")
        operator = subprocess.Popen(  # the operator as in production: its own process
            [
                sys.executable,
                "-m",
                "kvcal",
                "operator",
                "run",
                "--standalone",
                "-n",
                NAMESPACE,
                "--kubeconfig",
                str(plane.kubeconfig),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ},
        )
        try:
            kube = KubeClient(_client(plane.kubeconfig))
            kube.create(kvcalibration("warmup"))  # the operator is up once it has made this Job (start-up not timed)
            wait_jobs(kube, 1, timeout=120)
            idle_rss, _ = rss_mib(operator.pid)
            started = time.monotonic()
            with ThreadPoolExecutor(CREATORS) as pool:  # as fast as the API server takes them (kubectl apply -f dir)
                list(pool.map(lambda i: kube.create(kvcalibration(f"load-{i:05d}")), range(objects)))
            created_s = time.monotonic() - started
            settle_s = wait_jobs(kube, objects + 1, timeout=3600) + created_s
            loaded_rss, _ = rss_mib(operator.pid)
            latencies: list[float] = []
            for i in range(probes):
                name = f"probe-{i:03d}"
                job = job_name(name)
                t0 = time.monotonic()
                kube.create(kvcalibration(name))
                while kube.get("Job", NAMESPACE, job) is None:
                    if time.monotonic() - t0 > 120:
                        raise SystemExit(f"no Job for {name} after 120s")
                    time.sleep(0.01)  # the measurement's resolution
                latencies.append(time.monotonic() - t0)
            rss, hwm = rss_mib(operator.pid)
        finally:
            operator.terminate()
            operator.wait(60)
    return Run(objects, created_s, settle_s, latencies, idle_rss, loaded_rss, rss, hwm)


def wait_established(kubectl: list[str]) -> None:
    """kubectl wait fails outright while the CRD has no status yet: retry it until the condition is there."""
    deadline = time.monotonic() + 60
    while True:
        done = subprocess.run(
            [*kubectl, "wait", "--for=condition=Established", "--timeout=30s", "crd/kvcalibrations.kvcal.dev"],
            capture_output=True,
        )
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise SystemExit(done.stderr.decode())


def table(runs: list[Run], probes: int) -> str:
    rows: list[tuple[str, list[str]]] = [
        ("KVCalibrations present", [f"{r.objects + 1}" for r in runs]),
        ("create them (API calls, 8 clients)", [f"{r.created_s:.0f} s" for r in runs]),
        ("all their Jobs created after", [f"{r.settle_s:.0f} s" for r in runs]),
        (f"apply -> Job p50 ({probes} applies)", [f"{statistics.median(r.latencies) * 1000:.0f} ms" for r in runs]),
        ("apply -> Job p95", [f"{percentile(r.latencies, 0.95) * 1000:.0f} ms" for r in runs]),
        ("apply -> Job max", [f"{max(r.latencies) * 1000:.0f} ms" for r in runs]),
        ("the slowest was apply number", [f"{r.latencies.index(max(r.latencies)) + 1}" for r in runs]),
        ("applies over 1 s", [f"{sum(latency > 1 for latency in r.latencies)}" for r in runs]),
        ("operator RSS idle (1 object)", [f"{r.idle_rss:.0f} MiB" for r in runs]),
        ("operator RSS loaded", [f"{r.loaded_rss:.0f} MiB" for r in runs]),
        ("operator RSS after the applies (peak)", [f"{r.final_rss:.0f} ({r.peak_rss:.0f}) MiB" for r in runs]),
    ]
    width = max(len(label) for label, _ in rows)
    cells = max(len(v) for _, values in rows for v in values)
    header = f"{'objects':<{width}}  " + "  ".join(f"{r.objects:>{cells}}" for r in runs)
    lines = [header] + [f"{label:<{width}}  " + "  ".join(f"{v:>{cells}}" for v in values) for label, values in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, nargs="+", default=[500, 5000], help="one column per scale")
    parser.add_argument("--probes", type=int, default=40)
    args = parser.parse_args()
    runs: list[Run] = []
    for objects in args.objects:
        runs.append(measure(objects, args.probes))
        print(table(runs, args.probes), end="\n\n", flush=True)  # a column so far, in case a later scale fails
    return 0


def _client(kubeconfig: Path) -> Any:
    from kubernetes import config

    return config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    sys.exit(main())
