"""The e2e harness that plays kubelet for our own workloads on a control plane without nodes.

The real kube-controller-manager runs: the Job controller creates Pods for our Jobs and turns their Pod status into
Job conditions; the Deployment/ReplicaSet and StatefulSet controllers create Pods and count the ready ones. No kubelet
runs, so this harness does the kubelet's part for Pods in ONE namespace:

- With `scheduled=True` (a real kube-scheduler runs: tests/support/scheduling.py), only pods it bound to a Node
  run; an unplaced pod stays Pending with the scheduler's own PodScheduled condition, as on a full cluster, and a
  deleted pod is removed for good once its container stopped (the Node's GPUs are free again).
- Pods of a Job: the init containers run first, in order, on the same volumes (a failure fails the Pod), then the
  container's command runs as a LOCAL process with the args and env the operator wrote. The Pod
  is marked Running, then Succeeded/Failed with `state.terminated` {exitCode, reason, message}; the message is the
  file at terminationMessagePath, or with FallbackToLogsOnError and an empty file on failure, the log tail (the
  kubelet's rule: last 80 lines, at most 2048 bytes). The Job controller then writes the Job's conditions.
- Pods of a ReplicaSet or a StatefulSet (canary and baseline): marked Running and Ready, as a kubelet would once probes
  pass. For the components named in `serve` (among pods carrying `serve_labels`), the container really runs: the
  image's entrypoint (IMAGE_ENTRYPOINTS: the vLLM OpenAI image runs vLLM's API server from this venv) with the pod's
  args and env, on the pod's OWN loopback address (each served pod gets a podIP 127.0.N.M of its own, so the container
  keeps its port, as in a pod network namespace; or an address of `pod_network`, with `node` the Node each workload
  pod is bound to: what the EndpointSlice controller needs); the pod turns Ready when GET /health answers 200 (the
  readiness probe), and the process is killed when the pod is deleted. `on_serving(pod, address)` runs before the pod
  turns Ready (e.g. to add a scrape target). Like the static CPU manager pinning a Guaranteed pod, each served pod
  gets a core of its own while it runs (VLLM_CPU_OMP_THREADS_BIND, unless the pod sets it): left to "auto", every
  vLLM on this node binds core 0.

Paths. Every volumeMount's mountPath maps to a local directory, explicitly:
- hostPath volume -> the same path on this machine (the e2e specs use hostpath:// URIs);
- persistentVolumeClaim -> `pvc_dirs[claimName]` (a claim without an entry fails the Pod, naming the claim);
- configMap volume -> its keys materialised from the API into a fresh directory; in `*.json` files every string
  that starts with a mountPath is rewritten the same way (the calibrator's config carries in-container paths);
- emptyDir, projected, secret -> a fresh directory (left empty: our Jobs need no token or secret).
A mount with a subPath maps to that entry of its volume (created as a folder when missing, as kubelet does). The
longest matching mountPath wins. The same rewrite applies to the command, args and env values; the
terminationMessagePath maps to a fresh file. A container with readOnlyRootFilesystem runs in a read-only working
directory (the nearest local stand-in for the image's read-only root). `python`/`python3` run this interpreter and
`kvcal` the script beside it (the local equivalent of the image's entrypoints).

`verify_runtime=False` runs the verification Job's `kvcal verify` without `--runtime` (the static variant): loading
vLLM costs ~30-60 s per start on 2 CPU cores, so the lifecycle tests prove the operator's side (command, volumes,
termination message, phases) with the static checks; test_rollout_vllm runs the Job as written (runtime read-back).

`hold(component)` keeps Pods of a component ("calibration", "verification", "canary", "baseline") waiting, so a
test can freeze a phase (e.g. restart the operator while Calibrating) and `release(component)` lets them go.
"""

import contextlib
import ipaddress
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from kvcal.adapters.kube import MERGE_PATCH, KubeClient

log = logging.getLogger(__name__)
Manifest = dict[str, Any]
POLL_SECONDS = 0.2
LOG_TAIL_LINES, LOG_TAIL_BYTES, MESSAGE_BYTES = 80, 2048, 4096
# What an image runs when the container has no `command` (its ENTRYPOINT), as a local argv.
IMAGE_ENTRYPOINTS = {"vllm/vllm-openai": [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]}
SERVE_STARTUP_SECONDS = 900.0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def component(pod: Manifest) -> str:
    labels = pod["metadata"].get("labels") or {}
    if labels.get("kvcal.dev/component") in ("calibration", "verification"):
        return str(labels["kvcal.dev/component"])
    return "canary" if labels.get("role") == "canary" else "baseline"


def _sub_path(volume_dir: Path, mount: Manifest) -> Path:
    if not mount.get("subPath"):
        return volume_dir
    local = volume_dir / mount["subPath"]
    if not local.exists():
        local.mkdir(parents=True)
    return local


def _owner_kind(pod: Manifest) -> str | None:
    refs = pod["metadata"].get("ownerReferences") or []
    return str(refs[0]["kind"]) if refs else None


@dataclass
class Served:
    """A served pod's container running locally."""

    pod: Manifest
    address: str  # podIP:containerPort
    proc: "subprocess.Popen[bytes]"
    log: Path


class PathMap:
    """mountPath -> local directory, longest prefix first."""

    def __init__(self, mounts: dict[str, Path]) -> None:
        self.mounts = sorted(mounts.items(), key=lambda kv: len(kv[0]), reverse=True)

    def local(self, value: str) -> str:
        for mount, local in self.mounts:
            if value == mount or value.startswith(mount.rstrip("/") + "/"):
                return str(local) + value[len(mount.rstrip("/")) :]
        return value

    def rewrite_json(self, data: Any) -> Any:
        if isinstance(data, str):
            return self.local(data)
        if isinstance(data, list):
            return [self.rewrite_json(v) for v in data]
        if isinstance(data, dict):
            return {k: self.rewrite_json(v) for k, v in data.items()}
        return data


class FakeKubelet:
    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        workdir: Path,
        *,
        pvc_dirs: dict[str, Path] | None = None,
        verify_runtime: bool = False,
        extra_env: dict[str, str] | None = None,
        serve: set[str] | None = None,
        serve_labels: dict[str, str] | None = None,
        on_serving: Callable[[Manifest, str], None] | None = None,
        node: str | None = None,
        pod_network: ipaddress.IPv4Network | None = None,
        scheduled: bool = False,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.workdir = workdir
        self.pvc_dirs = pvc_dirs or {}
        self.verify_runtime = verify_runtime
        self.extra_env = extra_env or {}
        self.runs: list[dict[str, Any]] = []  # one record per Job pod run: pod, argv, exit code, message
        self._held: set[str] = set()
        self._serve = set(serve or ())
        self._serve_labels = serve_labels or {}  # e.g. the model server's app label: not the operator's own pod
        self._on_serving = on_serving
        # Bind workload pods to this (existing) Node first, as the scheduler would: the EndpointSlice controller
        # publishes only pods on a Node it knows (tests/support/gateway.py routes to those EndpointSlices).
        self._node = node
        # With a real kube-scheduler: only the pods it bound to a Node run, the rest stay Pending as it left them.
        self._scheduled = scheduled
        # Served pods' IPs: from this network (local on this machine: tests/support/gateway.py) instead of
        # 127.0.N.M, which the API server refuses in an EndpointSlice.
        self._pod_network = pod_network
        self._served: dict[str, Served] = {}  # pod uid -> its running container
        self._next_ip = 0
        self._cores: dict[str, int] = {}  # pod uid -> the core it is pinned to
        self.serve_failures: list[str] = []
        self._started: set[str] = set()  # pod uids already handled
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._loop = threading.Thread(target=self._run_loop, name="fake-kubelet", daemon=True)

    # --- control ---------------------------------------------------------------------------------------------------

    def start(self) -> "FakeKubelet":
        self._loop.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._loop.join(timeout=10)
        for uid in list(self._served):
            self._kill(uid)
        for t in self._threads:
            t.join(timeout=600)

    def hold(self, *components: str) -> None:
        with self._lock:
            self._held.update(components)

    def release(self, *components: str) -> None:
        with self._lock:
            self._held.difference_update(components)

    def serve_only(self, *components: str) -> None:
        """From now on, run the containers of these components' new pods (the others are only marked Ready)."""
        with self._lock:
            self._serve = set(components)

    def served(self) -> dict[str, tuple[Manifest, str]]:
        """Pod name -> (pod, address host:port) of every served pod whose process runs."""
        with self._lock:
            return {
                s.pod["metadata"]["name"]: (s.pod, s.address) for s in self._served.values() if s.proc.poll() is None
            }

    def _is_held(self, pod: Manifest) -> bool:
        with self._lock:
            return component(pod) in self._held

    # --- the sync loop ---------------------------------------------------------------------------------------------

    def _run_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
            except Exception:
                log.exception("fake kubelet sync failed")
            self._stop.wait(POLL_SECONDS)  # the kubelet's sync period, not a test wait

    def _sync(self) -> None:
        pods = self.kube.list("Pod", self.namespace, {})
        alive = {p["metadata"]["uid"] for p in pods if not p["metadata"].get("deletionTimestamp")}
        for uid in [u for u in self._served if u not in alive]:
            self._kill(uid)  # the pod was deleted (scale-down, rollout, canary removed): stop its container
        for pod in pods:
            meta, status = pod["metadata"], pod.get("status") or {}
            if self._scheduled and meta.get("deletionTimestamp") and pod["spec"].get("nodeName"):
                self._finish_deletion(pod)  # its container is stopped: the Node's resources are free again
                continue
            if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
                continue
            if meta["uid"] in self._started or self._is_held(pod):
                continue
            if self._scheduled and not pod["spec"].get("nodeName"):
                continue  # the scheduler has not placed it (yet)
            kind = _owner_kind(pod)
            if kind == "Job":
                self._started.add(meta["uid"])
                self._set_running(pod, ready=False)
                t = threading.Thread(target=self._run_job_pod, args=(pod,), name=f"pod-{meta['name']}", daemon=True)
                self._threads.append(t)
                t.start()
            elif kind in ("ReplicaSet", "StatefulSet"):
                self._started.add(meta["uid"])
                if self._node is not None and not pod["spec"].get("nodeName"):
                    self._bind(pod, self._node)
                labels = meta.get("labels") or {}
                with self._lock:
                    serve = component(pod) in self._serve
                serve = serve and all(labels.get(k) == v for k, v in self._serve_labels.items())
                if serve:
                    t = threading.Thread(target=self._serve_pod, args=(pod,), name=f"pod-{meta['name']}", daemon=True)
                    self._threads.append(t)
                    t.start()
                else:
                    self._set_running(pod, ready=True)

    def _finish_deletion(self, pod: Manifest) -> None:
        """What a kubelet does once a deleted pod's containers stopped: delete it for good (grace period 0), so the
        scheduler stops counting its requests on the Node."""
        self._kill(pod["metadata"]["uid"])
        with contextlib.suppress(Exception):  # already gone
            self.kube.request(
                "DELETE",
                "Pod",
                self.namespace,
                pod["metadata"]["name"],
                body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
            )

    def _bind(self, pod: Manifest, node: str) -> None:
        name = pod["metadata"]["name"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"kind": "Node", "name": node},
        }
        self.kube.request("POST", "Pod", self.namespace, name, subresource="binding", body=binding)

    def _patch_status(self, pod: Manifest, status: Manifest) -> None:
        self.kube.request(
            "PATCH",
            "Pod",
            self.namespace,
            pod["metadata"]["name"],
            subresource="status",
            body={"status": status},
            content_type=MERGE_PATCH,
        )

    def _set_running(self, pod: Manifest, *, ready: bool, ip: str = "127.0.0.1") -> None:
        now = _now()
        flag = "True" if ready else "False"
        self._patch_status(
            pod,
            {
                "phase": "Running",
                "startTime": now,
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
                    {"type": "Ready", "status": flag, "lastTransitionTime": now},
                ],
                "containerStatuses": [
                    {
                        "name": c["name"],
                        "image": c.get("image", ""),
                        "imageID": "",
                        "ready": ready,
                        "started": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": now}},
                    }
                    for c in pod["spec"]["containers"]
                ],
            },
        )

    # --- running a served pod's container locally --------------------------------------------------------------------

    def _serve_pod(self, pod: Manifest) -> None:
        name = pod["metadata"]["name"]
        root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.workdir))
        with self._lock:
            self._next_ip += 1
            if self._pod_network is not None:
                ip = str(self._pod_network[1 + self._next_ip % (self._pod_network.num_addresses - 2)])
            else:
                ip = f"127.0.{1 + self._next_ip // 250}.{1 + self._next_ip % 250}"
        container = pod["spec"]["containers"][0]
        port = (container.get("ports") or [{"containerPort": 8000}])[0]["containerPort"]
        served: Served | None = None
        try:
            pinned = {"VLLM_CPU_OMP_THREADS_BIND": str(self._pin(pod["metadata"]["uid"]))}
            argv, env = self._prepare(pod, root, node_env=pinned)
            argv += ["--host", ip]  # the pod's own address; the container keeps its port
            log_path = root / "container.log"
            with log_path.open("wb") as out:
                proc = subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True
                )
            served = Served(pod, f"{ip}:{port}", proc, log_path)
            with self._lock:
                self._served[pod["metadata"]["uid"]] = served
            self._set_running(pod, ready=False, ip=ip)
            self._wait_healthy(served)
            if self._on_serving is not None:
                self._on_serving(pod, served.address)
            self._set_running(pod, ready=True, ip=ip)
        except Exception as e:
            if self._stop.is_set() or (served is not None and pod["metadata"]["uid"] not in self._served):
                return  # stopped, or the pod was deleted while starting
            with self._lock:
                self._cores.pop(pod["metadata"]["uid"], None)
            message = f"fake kubelet: pod {name}: {type(e).__name__}: {e}"
            log.error("%s", message)
            self.serve_failures.append(message)

    def _wait_healthy(self, served: "Served") -> None:
        url = f"http://{served.address}/health"
        started = time.monotonic()
        while not self._stop.is_set() and served.pod["metadata"]["uid"] in self._served:
            if served.proc.poll() is not None:
                tail = "\n".join(served.log.read_text(errors="replace").splitlines()[-20:])
                raise RuntimeError(f"container exited with {served.proc.returncode} before ready:\n{tail}")
            if time.monotonic() - started > SERVE_STARTUP_SECONDS:
                raise TimeoutError(f"not ready after {SERVE_STARTUP_SECONDS:.0f}s")
            try:
                if httpx.get(url, timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            self._stop.wait(0.5)  # the readiness probe's period
        raise RuntimeError("stopped")

    def _pin(self, uid: str) -> int:
        """A core no other served pod holds (the lowest), else the least shared one."""
        cores = sorted(os.sched_getaffinity(0))
        with self._lock:
            taken = list(self._cores.values())
            core = min(cores, key=lambda c: (taken.count(c), c))
            self._cores[uid] = core
            return core

    def _kill(self, uid: str) -> None:
        with self._lock:
            entry = self._served.pop(uid, None)
            self._cores.pop(uid, None)
        if entry is None:
            return
        proc = entry.proc
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(proc.pid), signal.SIGTERM)
            try:
                proc.wait(timeout=5)  # a short grace period: vLLM's engine process can linger for 30 s
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
                proc.wait(timeout=10)

    # --- running a Job's container locally ---------------------------------------------------------------------------

    def _volume_dirs(self, pod: Manifest, root: Path) -> dict[str, Path]:
        """volume name -> local directory (see the module docstring for the rules)."""
        dirs: dict[str, Path] = {}
        for volume in pod["spec"].get("volumes") or []:
            name = volume["name"]
            if "hostPath" in volume:
                dirs[name] = Path(volume["hostPath"]["path"])
                if volume["hostPath"].get("type") == "DirectoryOrCreate":
                    dirs[name].mkdir(parents=True, exist_ok=True)
            elif "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                if claim not in self.pvc_dirs:
                    raise RuntimeError(f"fake kubelet: no local directory for PersistentVolumeClaim {claim!r}")
                dirs[name] = self.pvc_dirs[claim]
            elif any(k in volume for k in ("configMap", "emptyDir", "projected", "secret")):
                dirs[name] = root / "volumes" / name
                dirs[name].mkdir(parents=True)
            else:
                raise RuntimeError(f"fake kubelet: unsupported volume {volume}")
        return dirs

    def _materialise_config_maps(self, pod: Manifest, dirs: dict[str, Path], paths: PathMap) -> None:
        for volume in pod["spec"].get("volumes") or []:
            if "configMap" not in volume:
                continue
            cm = self.kube.get("ConfigMap", self.namespace, volume["configMap"]["name"])
            if cm is None:
                raise RuntimeError(f"fake kubelet: ConfigMap {volume['configMap']['name']!r} not found")
            for key, text in (cm.get("data") or {}).items():
                if key.endswith(".json"):
                    text = json.dumps(paths.rewrite_json(json.loads(text)), indent=2)
                (dirs[volume["name"]] / key).write_text(text)

    def _prepare(
        self,
        pod: Manifest,
        root: Path,
        extra_mounts: dict[str, Path] | None = None,
        node_env: dict[str, str] | None = None,
        container: Manifest | None = None,
        dirs: dict[str, Path] | None = None,
    ) -> tuple[list[str], dict[str, str]]:
        """A container's (default: the first's) local argv and env: the pod's volumes materialised under `root`
        (or `dirs`, when an init container already did), paths mapped."""
        container = container or pod["spec"]["containers"][0]
        dirs = self._volume_dirs(pod, root) if dirs is None else dirs
        mounts = {m["mountPath"]: _sub_path(dirs[m["name"]], m) for m in container.get("volumeMounts") or []}
        paths = PathMap({**mounts, **(extra_mounts or {})})
        self._materialise_config_maps(pod, dirs, paths)
        env = {**os.environ, **self.extra_env, **(node_env or {})}
        env.update({e["name"]: paths.local(e.get("value", "")) for e in container.get("env") or []})
        env["HOME"] = str(root / "home")  # the container's HOME is an emptyDir: a fresh one per pod
        return self._argv(container, paths), env

    def _argv(self, container: Manifest, paths: PathMap) -> list[str]:
        argv = [paths.local(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
        if not container.get("command"):  # the image's ENTRYPOINT runs the args
            image = str(container.get("image", "")).split(":")[0]
            if image not in IMAGE_ENTRYPOINTS:
                raise RuntimeError(f"fake kubelet: no local entrypoint for image {image!r} (IMAGE_ENTRYPOINTS)")
            argv = [*IMAGE_ENTRYPOINTS[image], *argv]
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        elif argv and argv[0] == "kvcal":
            argv[0] = str(Path(sys.executable).with_name("kvcal"))
        verifier = len(argv) > 1 and (argv[1] == "verify" or argv[1].endswith("kvcal-verifier.pyz"))
        if not self.verify_runtime and verifier and "--runtime" in argv:
            argv.remove("--runtime")
        return argv

    def _run_job_pod(self, pod: Manifest) -> None:
        container = pod["spec"]["containers"][0]
        root = Path(tempfile.mkdtemp(prefix=f"{pod['metadata']['name']}-", dir=self.workdir))
        record: dict[str, Any] = {"pod": pod["metadata"]["name"], "component": component(pod)}
        self.runs.append(record)
        started = _now()
        try:
            termination = root / "termination-log"
            termination.touch()
            path = container.get("terminationMessagePath", "/dev/termination-log")
            dirs = self._volume_dirs(pod, root)
            deadline = pod["spec"].get("activeDeadlineSeconds")
            read_only_root = root / "rootfs"  # the image's working directory: a write there fails as in the pod
            read_only_root.mkdir(mode=0o555)
            code, message = 0, ""
            for init in pod["spec"].get("initContainers") or []:  # in order; the first failure fails the pod
                init_argv, init_env = self._prepare(pod, root, container=init, dirs=dirs)
                record.setdefault("init_argv", []).append(init_argv)
                init_log = root / f"init-{init['name']}.log"
                with init_log.open("wb") as out:
                    code = subprocess.run(
                        init_argv, stdout=out, stderr=subprocess.STDOUT, env=init_env, cwd=read_only_root,
                        timeout=deadline, check=False,
                    ).returncode  # fmt: skip
                if code != 0:
                    tail = b"\n".join(init_log.read_bytes().splitlines()[-LOG_TAIL_LINES:])[-LOG_TAIL_BYTES:]
                    message = f"init container {init['name']} exited {code}: {tail.decode(errors='replace')}"
                    break
            if code == 0:
                code, message = self._run_container(pod, root, container, dirs, termination, path, deadline, record)
        except Exception as e:  # the harness itself could not start the container: a CreateContainerError
            code, message = 128, f"fake kubelet: {type(e).__name__}: {e}"
        record.update({"exit_code": code, "message": message})
        self._terminate(pod, code, message, started)
        if os.environ.get("KVCAL_KEEP_PODS") != "1" and code == 0:
            shutil.rmtree(root / "home", ignore_errors=True)

    def _run_container(
        self,
        pod: Manifest,
        root: Path,
        container: Manifest,
        dirs: dict[str, Path],
        termination: Path,
        termination_path: str,
        deadline: int | None,
        record: dict[str, Any],
    ) -> tuple[int, str]:
        argv, env = self._prepare(pod, root, extra_mounts={termination_path: termination}, dirs=dirs)
        record["argv"] = argv
        log_path = root / "container.log"
        cwd = root
        if (container.get("securityContext") or {}).get("readOnlyRootFilesystem"):
            cwd = root / "rootfs"
        with log_path.open("wb") as out:
            proc = subprocess.run(  # the Job's own command, as the kubelet would run it
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, timeout=deadline, check=False
            )
        code = proc.returncode
        message = termination.read_text(errors="replace")[:MESSAGE_BYTES]
        if not message.strip() and code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            lines = log_path.read_bytes().splitlines()[-LOG_TAIL_LINES:]
            message = b"\n".join(lines)[-LOG_TAIL_BYTES:].decode(errors="replace")
        return code, message

    def _terminate(self, pod: Manifest, code: int, message: str, started: str) -> None:
        now = _now()
        container = pod["spec"]["containers"][0]
        self._patch_status(
            pod,
            {
                "phase": "Succeeded" if code == 0 else "Failed",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": started},
                    {"type": "ContainersReady", "status": "False", "lastTransitionTime": now},
                    {"type": "Ready", "status": "False", "lastTransitionTime": now},
                ],
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "image": container.get("image", ""),
                        "imageID": "",
                        "ready": False,
                        "started": False,
                        "restartCount": 0,
                        "state": {
                            "terminated": {
                                "exitCode": code,
                                "reason": "Completed" if code == 0 else "Error",
                                "message": message,
                                "startedAt": started,
                                "finishedAt": now,
                            }
                        },
                    }
                ],
            },
        )
