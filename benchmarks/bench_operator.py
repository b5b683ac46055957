"""Operator benchmark on a real control plane: apply -> calibration Job created latency with N KVCalibrations
present, and the operator's memory.

    python benchmarks/bench_operator.py [--objects 500] [--probes 40]

Starts etcd + kube-apiserver + kube-controller-manager (kvcal.devenv), runs `kvcal operator run` as a subprocess
(as in production), creates --objects KVCalibrations and waits until each has its calibration Job (nothing plays
kubelet, so they stay Calibrating), then applies --probes more one at a time and times each from the create call (the
apply) to the Job being readable (polled every 10 ms: that is the resolution). Prints a table.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kvcal.adapters.kube import KubeClient
from kvcal.core.manifests import calibration_job_name
from kvcal.core.spechash import spec_hash
from kvcal.devenv.controlplane import ControlPlane, default_bin_dir
from kvcal.models.spec import KVCalibrationSpec

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "bench"


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


def wait_jobs(kube: KubeClient, count: int, timeout: float) -> float:
    start = time.monotonic()
    while True:
        jobs = kube.list("Job", NAMESPACE, {"app.kubernetes.io/managed-by": "kvcal"})
        if len(jobs) >= count:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise SystemExit(f"only {len(jobs)}/{count} Jobs after {timeout:.0f}s")
        time.sleep(0.5)  # benchmark poll of a bulk count


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=500)
    parser.add_argument("--probes", type=int, default=40)
    args = parser.parse_args()

    with ControlPlane(default_bin_dir()) as plane:
        kubectl = [str(plane.bin_dir / "kubectl"), "--kubeconfig", str(plane.kubeconfig)]
        subprocess.run([*kubectl, "apply", "-f", str(REPO / "crds")], check=True, capture_output=True)
        subprocess.run([*kubectl, "wait", "--for=condition=Established", "crd/kvcalibrations.kvcal.dev"], check=True)
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
            for i in range(args.objects):
                kube.create(kvcalibration(f"load-{i:04d}"))
            created_s = time.monotonic() - started
            settle_s = wait_jobs(kube, args.objects + 1, timeout=900)
            loaded_rss, _ = rss_mib(operator.pid)
            latencies: list[float] = []
            for i in range(args.probes):
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
            operator.wait(30)
    rows = [
        ("KVCalibrations present", f"{args.objects + 1}"),
        (f"create {args.objects} (API calls)", f"{created_s:.1f} s"),
        (f"all {args.objects} Jobs created after", f"{settle_s:.1f} s"),
        ("apply -> Job p50", f"{statistics.median(latencies) * 1000:.0f} ms"),
        ("apply -> Job p95", f"{percentile(latencies, 0.95) * 1000:.0f} ms"),
        ("apply -> Job max", f"{max(latencies) * 1000:.0f} ms"),
        ("operator RSS idle", f"{idle_rss:.0f} MiB"),
        (f"operator RSS with {args.objects}", f"{loaded_rss:.0f} MiB"),
        (f"operator RSS with {args.objects + args.probes}", f"{rss:.0f} MiB (peak {hwm:.0f} MiB)"),
    ]
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    return 0


def _client(kubeconfig: Path) -> Any:
    from kubernetes import config

    return config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    sys.exit(main())
