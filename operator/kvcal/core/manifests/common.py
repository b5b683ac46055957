"""Names, labels, owner references, security context and storage URIs shared by every child manifest."""

import hashlib
import posixpath
import re
from dataclasses import dataclass
from typing import Any

GROUP, VERSION, PLURAL = "kvcal.dev", "v1alpha1", "kvcalibrations"  # the KVCalibration CRD
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "KVCalibration"
MANAGED_BY = "kvcal"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_CALIBRATION = "kvcal.dev/calibration"
LABEL_COMPONENT = "kvcal.dev/component"
LABEL_SPEC_HASH = "kvcal.dev/spec-hash"
LABEL_ROLE = "role"
DEFAULT_CALIBRATOR_IMAGE = "ghcr.io/kvcal/kvcal-calibrator:0.1.0"
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
NON_ROOT_UID = 65532

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Owner:
    """The KVCalibration that owns a child (its ownerReference)."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, object]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def _short(value: str, limit: int) -> str:
    """`value` if it fits in `limit` characters, else a prefix plus 8 hex of its hash (stays unique, stays valid)."""
    if len(value) <= limit:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    return value[: limit - 9].rstrip("-.") + "-" + digest


def label_value(value: str) -> str:
    return _short(value, 63)


def child_name(owner_name: str, suffix: str) -> str:
    """<name>-<suffix>, at most 63 characters: the Job controller copies a Job's name into a pod label."""
    return _short(owner_name, 63 - len(suffix) - 1) + "-" + suffix


def calibration_job_name(owner_name: str, spec_hash: str) -> str:
    return child_name(owner_name, f"calib-{spec_hash[:8]}")


def verification_job_name(owner_name: str, spec_hash: str) -> str:
    return child_name(owner_name, f"verify-{spec_hash[:8]}")


def serving_verification_job_name(owner_name: str, spec_hash: str, image: str, attention_backend: str | None) -> str:
    """The re-verification after a promotion, one per (image, attention backend) the baseline runs."""
    runtime = hashlib.sha256(f"{image}\n{attention_backend or ''}".encode()).hexdigest()[:6]
    return child_name(owner_name, f"verify-{spec_hash[:8]}-{runtime}")


def canary_name(owner_name: str) -> str:
    return child_name(owner_name, "canary")


def labels(owner: Owner, component: str) -> dict[str, str]:
    return {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_CALIBRATION: label_value(owner.name),
        LABEL_COMPONENT: component,
    }


def metadata(owner: Owner, name: str, component: str, extra_labels: dict[str, str] | None = None) -> Manifest:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": {**labels(owner, component), **(extra_labels or {})},
        "ownerReferences": [owner.reference()],
    }


def service_in_front_of(meta: Manifest, selector: dict[str, str], ports_from: Manifest) -> Manifest:
    """A ClusterIP Service with ``ports_from``'s ports (the fields a copy may keep) selecting ``selector``'s pods."""
    kept = ("name", "port", "targetPort", "protocol", "appProtocol")
    ports = [{key: port[key] for key in kept if key in port} for port in ports_from["spec"].get("ports", [])]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {"type": "ClusterIP", "selector": selector, "ports": ports},
    }


def pod_security_context() -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "fsGroup": NON_ROOT_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> Manifest:
    """No privilege escalation, no capabilities: every container the operator writes (the Jobs add a read-only root)."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def clean_path(path: str, *, field: str) -> str:
    """`path` with empty and `.` segments dropped ('/a//b/./' -> '/a/b', 'a/' -> 'a'), so equal folders compare equal.

    A `..` segment is refused, never resolved: it could climb out of a folder a check has just allowed.
    """
    segments = [s for s in path.split("/") if s not in ("", ".")]
    if ".." in segments:
        raise ValueError(f"{field}: {path!r} has a '..' path segment; name the folder without '..'")
    return ("/" if path.startswith("/") else "") + "/".join(segments)


_DNS_UNSAFE = re.compile(r"[^a-z0-9-]+")


def _volume_name(prefix: str, key: str) -> str:
    cleaned = _DNS_UNSAFE.sub("-", key.lower()).strip("-") or "x"
    return _short(f"kvcal-{prefix}-{cleaned}", 63)


# The storage URI schemes locate() mounts into the Jobs and vLLM pods; nothing fetches anything else (no s3://).
SCHEMES = ("pvc", "hostpath", "configmap")
_SCHEMES_HINT = "pvc://CLAIM/PATH, hostpath:///ABS/PATH or configmap://NAME/KEY"


@dataclass(frozen=True)
class Location:
    """Where a storage URI appears inside a container: the volume to add and the path to pass."""

    uri: str
    path: str
    volume: Manifest
    mount_path: str
    sub_path: str = ""  # the folder or file inside the volume ('' = the whole volume)


def locate(uri: str, *, field: str, directory: bool = True, writable: bool = False) -> Location:
    """Map pvc://CLAIM/PATH, hostpath:///PATH or configmap://NAME/KEY (SCHEMES) to a volume and a path.

    Each volume is mounted under /kvcal/<kind>/...; a file on a hostPath mounts its parent directory. Paths are
    cleaned first (clean_path): the policy checks and the mounts see the same folder. Any other scheme is refused:
    the pods read only what is mounted, so an object store (s3://) would reach no one.
    """
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise ValueError(f"{field}: {uri!r} has no scheme; use {_SCHEMES_HINT}")
    if scheme not in SCHEMES:
        raise ValueError(
            f"{field}: scheme {scheme}:// of {uri!r} is not supported; use {_SCHEMES_HINT}: kvcal mounts volumes and "
            "fetches nothing, so copy the files from an object store (s3://) to a PVC first"
        )
    if scheme == "pvc":
        claim, _, raw_sub = rest.partition("/")
        if not claim:
            raise ValueError(f"{field}: {uri!r} names no claim; use pvc://CLAIM/PATH")
        sub = clean_path(raw_sub, field=field)
        mount = f"/kvcal/pvc/{claim}"
        volume = {"name": _volume_name("pvc", claim), "persistentVolumeClaim": {"claimName": claim}}
        return Location(uri, posixpath.join(mount, sub) if sub else mount, volume, mount, sub)
    if scheme == "hostpath":
        if not rest.startswith("/"):
            raise ValueError(f"{field}: {uri!r} must be absolute; use hostpath:///ABSOLUTE/PATH")
        rest = clean_path(rest, field=field)
        host_dir = rest if directory else posixpath.dirname(rest)
        digest = hashlib.sha256(host_dir.encode()).hexdigest()[:8]
        mount = f"/kvcal/host/{digest}"
        host_path: dict[str, str] = {"path": host_dir}
        if writable:
            host_path["type"] = "DirectoryOrCreate"
        volume = {"name": _volume_name("host", digest), "hostPath": host_path}
        path = mount if directory else posixpath.join(mount, posixpath.basename(rest))
        return Location(uri, path, volume, mount)
    name, _, key = rest.partition("/")  # configmap://
    if not name or not key:
        raise ValueError(f"{field}: {uri!r} must be configmap://NAME/KEY")
    key = clean_path(key, field=field)
    mount = f"/kvcal/configmap/{name}"
    volume = {"name": _volume_name("cm", name), "configMap": {"name": name}}
    return Location(uri, posixpath.join(mount, key), volume, mount)


def volumes_and_mounts(locations: list[tuple[Location, bool]]) -> tuple[list[Manifest], list[Manifest]]:
    """Volumes and mounts for (location, writable) pairs.

    A volume only read is mounted once, whole and read-only. A volume written anywhere is mounted once per location,
    through subPath, each mount read-only unless written: the output's claim may hold the model too, and the model
    must stay read-only. Where two locations land on one mount path, read-only wins.
    """
    volumes: dict[str, Manifest] = {}
    uses: dict[str, list[tuple[Location, bool]]] = {}
    for loc, writable in locations:
        volumes[loc.volume["name"]] = loc.volume
        uses.setdefault(loc.volume["name"], []).append((loc, writable))
    mounts: dict[str, Manifest] = {}  # by mountPath
    for name, entries in uses.items():
        if not any(writable for _, writable in entries):
            mount_path = str(entries[0][0].mount_path)
            mounts[mount_path] = {"name": name, "mountPath": mount_path, "readOnly": True}
            continue
        for loc, writable in entries:
            mount: Manifest = {"name": name, "mountPath": str(loc.mount_path), "readOnly": not writable}
            if loc.sub_path:
                mount.update(mountPath=posixpath.join(str(loc.mount_path), loc.sub_path), subPath=loc.sub_path)
            previous = mounts.get(mount["mountPath"])
            mount["readOnly"] = mount["readOnly"] or (previous is not None and previous["readOnly"])
            mounts[mount["mountPath"]] = mount
    return list(volumes.values()), list(mounts.values())


def match_labels(obj: Manifest | None) -> dict[str, str]:
    """``spec.selector.matchLabels`` of a workload or an InferencePool (empty when absent)."""
    return dict((((obj or {}).get("spec") or {}).get("selector") or {}).get("matchLabels") or {})
