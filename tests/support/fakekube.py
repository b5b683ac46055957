"""An in-memory Kube (kvcal.ports.Kube) for the reconciler's unit tests: objects by kind and name, every call
recorded, 409s on demand; and the KVCalibration it reconciles."""

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from kvcal.ports import Conflict, Kind, Manifest
from tests.support.decide import SPEC


class FakeKube:
    def __init__(self, objects: list[Manifest]) -> None:
        self.objects = {(o["kind"], o["metadata"]["name"]): copy.deepcopy(o) for o in objects}
        self.calls: list[str] = []
        self.conflicts = 0  # how many replace_status calls still answer 409
        self.event_names: set[str] = set()

    def get(self, kind: Kind, namespace: str, name: str) -> Manifest | None:
        self.calls.append(f"get {kind}/{name}")
        found = self.objects.get((kind, name))
        return copy.deepcopy(found) if found else None

    def list(self, kind: Kind, namespace: str, labels: Mapping[str, str]) -> list[Manifest]:
        """The objects of `kind` in `namespace` that carry every one of `labels` (an equality selector, as
        KubeClient.list sends it: `a=b,c=d`)."""
        return [
            copy.deepcopy(o)
            for (k, _), o in self.objects.items()
            if k == kind and o["metadata"].get("namespace") == namespace and matches(o, labels)
        ]

    def create(self, manifest: Manifest) -> bool:
        key = (manifest["kind"], manifest["metadata"]["name"])
        self.calls.append(f"create {key[0]}/{key[1]}")
        if key in self.objects:
            return False
        self.objects[key] = copy.deepcopy(manifest)
        return True

    def apply(self, manifest: Manifest) -> None:
        self.calls.append(f"apply {manifest['kind']}/{manifest['metadata']['name']}")

    def patch(self, kind: Kind, namespace: str, name: str, patch: Manifest) -> None:
        self.calls.append(f"patch {kind}/{name}")

    def apply_owned_fields(self, manifest: Manifest, field_manager: str) -> None:
        self.calls.append(f"apply_owned_fields {manifest['kind']}/{manifest['metadata']['name']} as {field_manager}")

    def set_job_deadline(self, namespace: str, name: str, seconds: int) -> bool:
        self.calls.append(f"set_job_deadline {name} {seconds}")
        return ("Job", name) in self.objects

    def scale(self, kind: Kind, namespace: str, name: str, replicas: int) -> bool:
        self.calls.append(f"scale {kind}/{name} {replicas}")
        found = self.objects.get((kind, name))
        if found is not None:
            found["spec"]["replicas"] = replicas
        return found is not None

    def delete(self, kind: Kind, namespace: str, name: str) -> bool:
        self.calls.append(f"delete {kind}/{name}")
        return self.objects.pop((kind, name), None) is not None

    def termination_message(self, namespace: str, job_name: str) -> str | None:
        return None

    def replace_status(self, namespace: str, name: str, resource_version: str, status: Manifest) -> None:
        self.calls.append("replace_status")
        if self.conflicts:
            self.conflicts -= 1
            self.objects[("KVCalibration", name)]["metadata"]["resourceVersion"] += "x"
            raise Conflict("stale")
        obj = self.objects[("KVCalibration", name)]
        assert obj["metadata"]["resourceVersion"] == resource_version
        obj["status"] = status

    def remove_annotations(self, namespace: str, name: str, keys: Sequence[str]) -> None:
        self.calls.append(f"remove_annotations {','.join(keys)}")

    def emit_event(self, involved: Manifest, type_: str, reason: str, message: str, name: str | None = None) -> bool:
        if name is not None and name in self.event_names:
            return False  # AlreadyExists, as the API server answers
        self.event_names.add(name or f"random-{len(self.calls)}")
        self.calls.append(f"event {reason}")
        return True


def kvcal(**meta: Any) -> Manifest:
    return {
        "apiVersion": "kvcal.dev/v1alpha1",
        "kind": "KVCalibration",
        "metadata": {
            "name": "smollm2",
            "namespace": "llm",
            "uid": "u1",
            "generation": 1,
            "resourceVersion": "1",
            **meta,
        },
        "spec": SPEC,
    }


def matches(obj: Manifest, labels: Mapping[str, str]) -> bool:
    """An equality label selector, as the API server reads it: every key present with that value."""
    found = obj["metadata"].get("labels") or {}
    return all(found.get(key) == value for key, value in labels.items())
