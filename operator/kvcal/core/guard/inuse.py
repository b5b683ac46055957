"""Whether a calibration output would overwrite the model the baseline Deployment serves.

The calibrator replaces its output folder (force: a retried pod must not trip over a partial attempt), so an output
that is, contains or sits inside the folder the baseline's vLLM loads would rewrite a live model under running pods;
after a promotion the baseline loads exactly the previous output. The served folder is the container's model path
(`--model PATH` or `vllm serve PATH`) resolved through its volumeMounts to a hostPath directory or a place in a PVC;
siblings on the same volume (a models PVC holding the base model and the outputs) are fine.
"""

import posixpath

from kvcal.core.manifests.canary import baseline_container_index
from kvcal.core.manifests.common import Manifest, locate
from kvcal.models.spec import KVCalibrationSpec


def _overlaps(a: str, b: str) -> bool:
    a, b = (posixpath.normpath("/" + path.lstrip("/")) for path in (a, b))
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def model_path(container: Manifest) -> str | None:
    """The folder vLLM loads: `--model X`, `--model=X` or `serve X` in the command or args."""
    argv = [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
    for i, arg in enumerate(argv):
        if arg == "--model" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
        if arg == "serve" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None


def served_location(baseline: Manifest, container_name: str | None) -> tuple[Manifest, str] | None:
    """(volume, path inside that volume) of the model the baseline serves; None when it is not on a volume."""
    pod: Manifest = baseline["spec"]["template"]["spec"]
    container = pod["containers"][baseline_container_index(baseline, container_name)]
    path = model_path(container)
    if path is None:
        return None
    mounts = [
        m
        for m in container.get("volumeMounts") or []
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    if not mounts:
        return None
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    volume = next((v for v in pod.get("volumes") or [] if v.get("name") == mount["name"]), None)
    if volume is None:
        return None
    inside = posixpath.join(str(mount.get("subPath") or ""), path[len(mount["mountPath"].rstrip("/")) :].lstrip("/"))
    return volume, inside


def output_in_use(spec: KVCalibrationSpec, baseline: Manifest | None) -> str | None:
    """What the output would overwrite (a phrase naming it), or None when it is safe."""
    if baseline is None:
        return None
    try:
        output = locate(spec.calibration.output, field="spec.calibration.output")
        served = served_location(baseline, spec.serving.baseline.container)
    except (ValueError, LookupError):
        return None  # an invalid output or container is reported where it is used (InvalidSpec, BaselineUnusable)
    if served is None:
        return None
    volume, inside = served
    if "hostPath" in volume and "hostPath" in output.volume:
        folder = posixpath.join(str(volume["hostPath"].get("path", "/")), inside)
        if _overlaps(folder, output.volume["hostPath"]["path"]):
            return f"the model folder it serves (hostPath {folder})"
    claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
    if claim and claim == (output.volume.get("persistentVolumeClaim") or {}).get("claimName"):
        sub = output.path[len(output.mount_path) :].lstrip("/")
        if _overlaps(inside, sub):
            return f"the model folder it serves (PersistentVolumeClaim {claim}, path /{inside})"
    return None
