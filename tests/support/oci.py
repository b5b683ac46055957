"""pytest fixtures: podman with this machine's harness (hack/oci-harness.sh), kvcal's images built from images/, and
containers run as the chart runs them (non-root, read-only root filesystem, a writable /tmp).

`podman` (session): the harness's stand-in bases made (cached: seconds) and CONTAINERS_* set for every podman call.
Under CI a missing podman fails the run (`make oci` installs it).
"""

import os
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvcal.devenv.images import IMAGES, Built, build
from tests.support.prereq import require

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "hack" / "oci-harness.sh"
NON_ROOT = "65532:65532"  # the chart's securityContext.runAsUser (and the Dockerfiles' USER)


def harness(*args: str) -> str:
    proc = subprocess.run(["bash", str(HARNESS), *args], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"hack/oci-harness.sh {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def harness_env() -> dict[str, str]:
    """CONTAINERS_STORAGE_CONF and CONTAINERS_CONF, as `hack/oci-harness.sh env` prints them."""
    words = shlex.split(harness("env").strip().removeprefix("export "))
    return dict(word.split("=", 1) for word in words)


@dataclass
class Container:
    name: str
    podman: "Podman"

    def logs(self) -> str:
        proc = self.podman("logs", self.name, check=False)  # the container's stderr comes back on podman's stderr
        return proc.stdout + proc.stderr

    def wait(self, timeout: float) -> int:
        """The container's exit code once it has stopped."""
        out = self.podman("wait", self.name, timeout=timeout).stdout.strip()
        return int(out.splitlines()[-1])

    def remove(self) -> None:
        self.podman("rm", "--force", "--time", "5", self.name, check=False, timeout=60)


@dataclass
class Podman:
    env: dict[str, str]
    containers: list[Container] = field(default_factory=list)

    def __call__(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=self.env)
        assert not check or proc.returncode == 0, f"podman {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}"
        return proc

    def build(self, name: str, dockerfile: Path | None = None, log: Path | None = None) -> Built:
        """Build images/NAME (or another Dockerfile under its tag) with the layer cache; bases are never pulled."""
        if name == "verifier":  # its base, vllm/vllm-openai, is the harness's stand-in made from the vllm-cpu image
            self.build("vllm-cpu")
            harness("vllm-openai")
        return build(IMAGES[name], pull="never", dockerfile=dockerfile, log=log, env=self.env)

    def run(
        self,
        image: str,
        args: Sequence[str] = (),
        *,
        entrypoint: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
        mounts: Sequence[tuple[Path, str, str]] = (),
        read_only: bool = True,
        network_host: bool = False,
        user: str = NON_ROOT,
        tmp: bool = True,
        extra: Sequence[str] = (),
    ) -> Container:
        """Start a detached container the way the chart's pods run: user 65532, no capabilities, no privilege
        escalation, read-only root filesystem with a writable /tmp (the chart's emptyDir).
        mounts: (host folder, path in the container, "ro" or "rw")."""
        name = f"kvcal-test-{uuid.uuid4().hex[:10]}"
        argv = ["run", "-d", "--name", name, "--user", user, "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        if tmp:
            argv += ["--tmpfs", "/tmp:rw,mode=1777"]
        if read_only:
            argv.append("--read-only")
        if network_host:
            argv += ["--network", "host"]
        if entrypoint is not None:
            argv += ["--entrypoint", "[" + ", ".join(f'"{word}"' for word in entrypoint) + "]"]
        for key, value in (env or {}).items():
            argv += ["--env", f"{key}={value}"]
        for host, path, mode in mounts:
            argv += ["--volume", f"{host}:{path}:{mode}"]
        self(*argv, *extra, image, *args, timeout=120)
        container = Container(name, self)
        self.containers.append(container)
        return container


@pytest.fixture(scope="session")
def podman() -> Iterator[Podman]:
    require(shutil.which("podman"), "podman (Debian package; `make oci` installs it)")
    harness("bases")  # the stand-in bases under the Dockerfiles' FROM names: skipped when present
    engine = Podman({**os.environ, **harness_env()})
    try:
        yield engine
    finally:
        for container in engine.containers:
            container.remove()


@dataclass(frozen=True)
class PodRun:
    exit_code: int
    termination_message: str  # what the kubelet reports: the file at terminationMessagePath
    logs: str


def run_job_pod(
    podman: Podman, job: dict[str, Any], volume_dirs: dict[str, Path], workdir: Path, timeout: float
) -> PodRun:
    """Run a Job the operator built, in its images, as a kubelet would: its init containers in order (a failure
    ends the pod), then its first container. Each with its command, args and env, its volumeMounts at their own
    paths (volume_dirs: volume name -> host folder for PVC and ConfigMap volumes; an emptyDir is a host folder the
    pod's containers share, as in a pod), subPath, readOnly, the pod's runAsUser and the container's
    readOnlyRootFilesystem, and the terminationMessagePath backed by a host file."""
    pod = job["spec"]["template"]["spec"]
    folders = dict(volume_dirs)
    for volume in pod["volumes"]:
        if "emptyDir" in volume:
            folders[volume["name"]] = workdir / "emptydir" / volume["name"]
            folders[volume["name"]].mkdir(parents=True)
            folders[volume["name"]].chmod(0o777)  # fsGroup: the pod user's to write
    termination = workdir / "termination-log"
    termination.write_text("")
    termination.chmod(0o666)
    for init in pod.get("initContainers") or []:
        started = _start_container(podman, pod, init, folders, termination)
        exit_code = started.wait(timeout)
        if exit_code != 0:
            return PodRun(exit_code, termination.read_text(), started.logs())
        termination.write_text("")
    started = _start_container(podman, pod, pod["containers"][0], folders, termination)
    exit_code = started.wait(timeout)
    return PodRun(exit_code, termination.read_text(), started.logs())


def _start_container(
    podman: Podman, pod: dict[str, Any], container: dict[str, Any], folders: dict[str, Path], termination: Path
) -> Container:
    mounts: list[tuple[Path, str, str]] = [(termination, container["terminationMessagePath"], "rw")]
    for mount in container.get("volumeMounts") or []:
        host = folders[mount["name"]] / mount.get("subPath", "")
        if not host.exists():  # kubelet creates a missing subPath; fsGroup makes it the pod user's to write
            host.mkdir(parents=True)
            host.chmod(0o777)
        mounts.append((host, mount["mountPath"], "ro" if mount.get("readOnly") else "rw"))
    security = container.get("securityContext") or {}
    user = pod.get("securityContext", {}).get("runAsUser", 65532)
    return podman.run(
        container["image"],
        container.get("args") or [],
        entrypoint=container.get("command"),
        env={e["name"]: e["value"] for e in container.get("env") or [] if "value" in e},
        mounts=mounts,
        read_only=bool(security.get("readOnlyRootFilesystem")),
        user=f"{user}:{user}",
        tmp=False,  # /tmp is whatever the pod mounts there
    )
