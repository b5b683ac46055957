"""Pods run in their real images: the kubelet's part for the operator's own pod, through podman.

The control plane here has no node. `ImageKubelet` watches the pods of one namespace that match a label selector
(e.g. the operator Deployment a Helm chart made) and runs each pod's first container in its image as kubelet would:
its command and args ($(VAR) expanded), env (`value` and the fieldRefs metadata.namespace / metadata.name), the
pod's runAsUser and the container's readOnlyRootFilesystem, emptyDir volumes as tmpfs, and the pod's kube-api-access
volume (the ServiceAccount admission plugin's: a TokenRequest bound to the pod, ca.crt, namespace), plus
KUBERNETES_SERVICE_HOST/PORT for the in-cluster config. Host network: the API server listens on loopback. The pod
turns Running, and Ready once its readiness probe (httpGet on 127.0.0.1) answers 200; a container that exits marks
the pod not ready with its exit code and log tail (as CrashLoopBackOff would). A deleted pod's container gets
SIGTERM, and SIGKILL after the pod's terminationGracePeriodSeconds, as kubelet does. Anything else in a pod spec it
cannot honour fails loudly (`check()`), never silently.

A pod no node was assigned to is removed at once when deleted; a kubelet's pod stays, with its deletionTimestamp, until
its containers stopped. That matters: the API server rejects a token bound to a pod that is gone, so an operator
stopping on SIGTERM (handing its Lease back) would get 401 where a real cluster answers. `ImageKubelet` therefore puts
its finalizer on each pod it runs and takes it off once the container stopped.
"""

import base64
import json
import logging
import re
import threading
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvcal.adapters.kube import MERGE_PATCH, KubeClient
from tests.support.cluster import Cluster
from tests.support.oci import Container, Podman

log = logging.getLogger(__name__)
POLL_SECONDS = 0.5  # the kubelet's sync period here
DEFAULT_GRACE_SECONDS = 30  # a pod's terminationGracePeriodSeconds when it sets none
FINALIZER = "test.kvcal.dev/image-kubelet"  # the pod stays while its container stops (see above)
FIELD_REFS = {"metadata.namespace": ("metadata", "namespace"), "metadata.name": ("metadata", "name")}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def service_account_volume(
    cluster: Cluster, namespace: str, service_account: str, folder: Path, pod: dict[str, Any] | None = None
) -> Path:
    """The files of a kube-api-access volume (/var/run/secrets/kubernetes.io/serviceaccount): token (bound to `pod`
    when given), ca.crt, namespace."""
    bound = [] if pod is None else ["--bound-object-kind", "Pod", "--bound-object-name", pod["metadata"]["name"],
                                    "--bound-object-uid", pod["metadata"]["uid"]]  # fmt: skip
    token = cluster.kubectl("create", "token", service_account, "-n", namespace, "--duration=1h", *bound).stdout.strip()
    admin = json.loads(cluster.plane.kubeconfig.read_text())
    ca = base64.b64decode(admin["clusters"][0]["cluster"]["certificate-authority-data"])
    folder.mkdir(mode=0o755, parents=True)
    for name, content in (("token", token.encode()), ("ca.crt", ca), ("namespace", namespace.encode())):
        (folder / name).write_bytes(content)
        (folder / name).chmod(0o644)  # the container runs as 65532, not as the owner
    return folder


def container_env(container: dict[str, Any], pod: dict[str, Any], server: str) -> dict[str, str]:
    """The container's env as the kubelet resolves it (values and the fieldRefs above) plus the in-cluster API."""
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
            continue
        field_path = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        assert field_path in FIELD_REFS, f"env {entry['name']}: only {sorted(FIELD_REFS)} are supported here"
        section, key = FIELD_REFS[field_path]
        env[entry["name"]] = pod[section][key]
    host, port = server.removeprefix("https://").rsplit(":", 1)
    return {**env, "KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion in command and args: a defined variable is replaced, $$ is a literal $, and an
    undefined reference is left as written."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), text)


def readiness_url(container: dict[str, Any]) -> str | None:
    probe = (container.get("readinessProbe") or {}).get("httpGet")
    if probe is None:
        return None
    port = probe["port"]
    if isinstance(port, str):  # a named port
        port = next(p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port)
    return f"http://127.0.0.1:{port}{probe.get('path', '/')}"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@dataclass
class ImageKubelet:
    cluster: Cluster
    kube: KubeClient
    podman: Podman
    namespace: str
    selector: dict[str, str]
    workdir: Path
    running: dict[str, Container] = field(default_factory=dict)  # pod uid -> its container
    _ready: set[str] = field(default_factory=set)
    _crashed: set[str] = field(default_factory=set)
    failures: dict[str, str] = field(default_factory=dict)  # pod uid -> why it could not be started
    stopped_logs: dict[str, str] = field(default_factory=dict)  # container name -> its log, once its pod was deleted
    _grace: dict[str, int] = field(default_factory=dict)  # pod uid -> terminationGracePeriodSeconds
    _held: dict[str, str] = field(default_factory=dict)  # pod uid -> name, for the pods that carry FINALIZER
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> "ImageKubelet":
        self._thread = threading.Thread(target=self._loop, name="image-kubelet", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for container in self.running.values():
            container.remove()
        for uid in list(self._held):
            self._release(uid)

    def replaced(self, old: Container) -> Container | None:
        """The one container running once `old`'s pod is gone and its successor is Ready (a rollout), else None."""
        self.check()
        running = dict(self.running)  # a snapshot: the sync thread changes it
        ready = [container for uid, container in running.items() if uid in self._ready]
        if old in running.values() or len(running) != 1 or len(ready) != 1:
            return None
        return ready[0]

    def check(self) -> None:
        """Fail the test when a pod could not be started or its container exited."""
        exited = [f"container {self.running[uid].name} exited" for uid in self._crashed]
        problems = [*self.failures.values(), *exited]
        assert not problems, f"{problems}\n{self.logs()}"

    def logs(self) -> str:
        logs = {**self.stopped_logs, **{c.name: c.logs() for c in dict(self.running).values()}}
        return "\n".join(f"--- {name}\n{text[-4000:]}" for name, text in logs.items())

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
            except Exception:
                log.exception("image kubelet sync failed")
            self._stop.wait(POLL_SECONDS)

    def _sync(self) -> None:
        pods = self.kube.list("Pod", self.namespace, self.selector)
        alive = {p["metadata"]["uid"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}
        for uid in [uid for uid in self.running if uid not in alive]:
            self._terminate(uid)
        for uid, pod in alive.items():
            if uid in self.failures:
                continue
            if uid not in self.running:
                try:
                    self._hold(pod)
                    self.running[uid] = self._run(pod)
                except Exception as error:  # once per pod: check() reports it to the test
                    self.failures[uid] = f"pod {pod['metadata']['name']}: {error}"
                    raise
                self._set_status(pod, ready=False)
                continue
            self._probe(pod, self.running[uid])

    def _terminate(self, uid: str) -> None:
        """As kubelet stops a deleted pod: SIGTERM, SIGKILL after terminationGracePeriodSeconds; the log is kept."""
        container = self.running.pop(uid)
        grace = self._grace.pop(uid, DEFAULT_GRACE_SECONDS)
        container.podman("stop", "--time", str(grace), container.name, check=False, timeout=grace + 60)
        self.stopped_logs[container.name] = container.logs()
        container.remove()
        self._ready.discard(uid)
        self._crashed.discard(uid)
        self._release(uid)

    def _hold(self, pod: dict[str, Any]) -> None:
        finalizers = [*(pod["metadata"].get("finalizers") or []), FINALIZER]
        self.kube.request("PATCH", "Pod", self.namespace, pod["metadata"]["name"],
                          body={"metadata": {"finalizers": finalizers}}, content_type=MERGE_PATCH)  # fmt: skip
        self._held[pod["metadata"]["uid"]] = pod["metadata"]["name"]

    def _release(self, uid: str) -> None:
        """As kubelet ends a deleted pod once its containers stopped: the pod may go now."""
        name = self._held.pop(uid, None)
        pod = None if name is None else self.kube.get("Pod", self.namespace, name)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        finalizers = [f for f in pod["metadata"].get("finalizers") or [] if f != FINALIZER]
        self.kube.request("PATCH", "Pod", self.namespace, name,
                          body={"metadata": {"finalizers": finalizers}}, content_type=MERGE_PATCH)  # fmt: skip

    def _run(self, pod: dict[str, Any]) -> Container:
        spec = pod["spec"]
        container = spec["containers"][0]
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        workdir = self.workdir / pod["metadata"]["uid"]
        account = spec.get("serviceAccountName", "default")
        token_dir = service_account_volume(self.cluster, self.namespace, account, workdir / "sa", pod)
        mounts: list[tuple[Path, str, str]] = []
        tmpfs: list[str] = []
        for mount in container.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            if "emptyDir" in volume:
                tmpfs += ["--tmpfs", f"{mount['mountPath']}:rw,mode=1777"]
                continue
            # The ServiceAccount admission plugin's kube-api-access volume: token, kube-root-ca.crt, namespace.
            sources = (volume.get("projected") or {}).get("sources") or []
            assert any("serviceAccountToken" in s for s in sources), f"volume {mount['name']}: not supported here"
            mounts.append((token_dir, mount["mountPath"], "ro"))
        security = container.get("securityContext") or {}
        user = security.get("runAsUser", spec.get("securityContext", {}).get("runAsUser"))
        assert user is not None, "the pod must say which user it runs as (runAsUser)"
        self._grace[pod["metadata"]["uid"]] = int(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))
        env = container_env(container, pod, self.cluster.server)
        command = container.get("command")
        return self.podman.run(
            container["image"],
            [expand(arg, env) for arg in container.get("args") or []],
            entrypoint=None if command is None else [expand(word, env) for word in command],
            env=env,
            mounts=mounts,
            read_only=bool(security.get("readOnlyRootFilesystem")),
            network_host=True,
            user=f"{user}:{user}",
            tmp=False,  # /tmp is whatever the pod mounts there
            extra=tmpfs,
        )

    def _probe(self, pod: dict[str, Any], container: Container) -> None:
        uid = pod["metadata"]["uid"]
        state = container.podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", container.name)
        status, exit_code = state.stdout.split()
        if status != "running":
            if uid not in self._crashed:  # reported once; kubelet would restart it, a test should fail instead
                self._crashed.add(uid)
                self._ready.discard(uid)
                self._set_status(pod, ready=False, exit_code=int(exit_code), message=container.logs()[-2048:])
            return
        url = readiness_url(pod["spec"]["containers"][0])
        if uid not in self._ready and (url is None or _answers(url)):
            self._ready.add(uid)
            self._set_status(pod, ready=True)

    def _set_status(self, pod: dict[str, Any], *, ready: bool, exit_code: int | None = None, message: str = "") -> None:
        now, flag = _now(), "True" if ready else "False"
        container = pod["spec"]["containers"][0]
        container_status: dict[str, Any] = {"name": container["name"], "image": container["image"], "imageID": "",
                                            "ready": ready, "started": exit_code is None, "restartCount": 0,
                                            "state": {"running": {"startedAt": now}}}  # fmt: skip
        if exit_code is not None:
            container_status["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
            container_status["lastState"] = {"terminated": {"exitCode": exit_code, "message": message}}
        status = {
            "phase": "Running",
            "startTime": pod.get("status", {}).get("startTime") or now,
            "podIP": "127.0.0.1",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
                {"type": "Ready", "status": flag, "lastTransitionTime": now},
            ],
            "containerStatuses": [container_status],
        }
        self.kube.request("PATCH", "Pod", self.namespace, pod["metadata"]["name"], subresource="status",
                          body={"status": status}, content_type=MERGE_PATCH)  # fmt: skip
