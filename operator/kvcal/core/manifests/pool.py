"""Router inference-pool: the canary's own InferencePool and endpoint picker, derived from the baseline's pool.

An InferencePool (inference.networking.k8s.io/v1) selects its pods by matchLabels and names an endpoint picker
(endpointPickerRef, a Service) that the gateway asks, through ext-proc, which pod takes each request. Two pools
behind one HTTPRoute rule split the traffic by backendRef weight; each pool needs a picker of its own, since a
picker serves exactly one pool (its --pool-name flag). So the canary gets:

- a pool selecting only the canary pods (role=canary and the calibration's label, never the baseline's labels),
  with the baseline pool's target ports, app protocol and picker settings (port, failure mode);
- a picker Deployment copied from the one behind the baseline pool's picker Service: its pod template (image,
  args, ServiceAccount, volumes) with --pool-name pointed at the canary pool, one replica, and pod labels of its
  own so that neither the baseline picker's Service nor either pool selects its pods;
- a Service in front of that picker with the baseline picker Service's ports.

docs/security.md says why copying the picker grants nobody anything new.
"""

import copy
from collections.abc import Iterable

from kvcal.core.manifests.canary import canary_selector_labels
from kvcal.core.manifests.common import (
    LABEL_CALIBRATION,
    LABEL_ROLE,
    Manifest,
    Owner,
    canary_name,
    child_name,
    label_value,
    metadata,
    service_in_front_of,
)
from kvcal.core.problems import NeedsFix

POOL_GROUP = "inference.networking.k8s.io"
POOL_API_VERSION = f"{POOL_GROUP}/v1"
POOL_KIND = "InferencePool"
# The endpoint picker's flag naming the one pool it serves (gateway-api-inference-extension's EPP).
POOL_NAME_FLAG = "--pool-name"
PICKER_ROLE = "canary-picker"
POOL_FIELD = "spec.serving.traffic.inferencePool"


def canary_pool_name(owner_name: str) -> str:
    return canary_name(owner_name)


def canary_picker_name(owner_name: str) -> str:
    return child_name(owner_name, "canary-epp")


def picker_pod_labels(owner: Owner) -> dict[str, str]:
    """The canary picker's pods: role canary-picker, so the canary pool (role=canary) never selects them."""
    return {LABEL_ROLE: PICKER_ROLE, LABEL_CALIBRATION: label_value(owner.name)}


def picker_service_name(baseline_pool: Manifest) -> str:
    """The Service the baseline pool's endpointPickerRef names (the only kind of picker reference kvcal copies)."""
    name = baseline_pool["metadata"]["name"]
    ref = baseline_pool.get("spec", {}).get("endpointPickerRef") or {}
    if not ref.get("name"):
        raise NeedsFix(f"{POOL_FIELD}: InferencePool {name} names no endpointPickerRef: kvcal copies its picker")
    if ref.get("group", "") != "" or ref.get("kind", "Service") != "Service":
        raise NeedsFix(
            f"{POOL_FIELD}: InferencePool {name}'s endpointPickerRef is a {ref.get('kind')} of group "
            f"{ref.get('group')!r}; kvcal copies only a picker behind a core Service"
        )
    return str(ref["name"])


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def picker_deployment(picker_service: Manifest, deployments: Iterable[Manifest]) -> Manifest:
    """The one Deployment whose pods the baseline picker Service selects (the picker kvcal copies)."""
    selector: dict[str, str] = picker_service.get("spec", {}).get("selector") or {}
    service = picker_service["metadata"]["name"]
    found = [
        d
        for d in deployments
        if _selects(selector, d.get("spec", {}).get("template", {}).get("metadata", {}).get("labels") or {})
    ]
    if len(found) != 1:
        names = ", ".join(sorted(d["metadata"]["name"] for d in found)) or "none"
        raise NeedsFix(
            f"{POOL_FIELD}: the endpoint picker Service {service} must select the pods of exactly one Deployment "
            f"(found: {names}); kvcal copies that Deployment for the canary's pool"
        )
    return found[0]


def _with_pool_name(args: list[str], pool: str) -> list[str] | None:
    """`args` with --pool-name X (or --pool-name=X) naming `pool`; None when the flag is absent."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg == POOL_NAME_FLAG and i + 1 < len(out):
            out[i + 1] = pool
            return out
        if arg.startswith(POOL_NAME_FLAG + "="):
            out[i] = f"{POOL_NAME_FLAG}={pool}"
            return out
    return None


def build_canary_pool(owner: Owner, baseline_pool: Manifest) -> Manifest:
    """The baseline pool's ports and picker settings, selecting the canary pods and asking the canary's picker."""
    spec = baseline_pool["spec"]
    picker_service_name(baseline_pool)  # a picker kvcal can copy, or NeedsFix
    out: Manifest = {
        "selector": {"matchLabels": canary_selector_labels(owner)},
        "targetPorts": copy.deepcopy(spec["targetPorts"]),
    }
    if "appProtocol" in spec:
        out["appProtocol"] = spec["appProtocol"]
    out["endpointPickerRef"] = {**copy.deepcopy(spec["endpointPickerRef"]), "name": canary_picker_name(owner.name)}
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": POOL_KIND,
        "metadata": metadata(owner, canary_pool_name(owner.name), "canary", {LABEL_ROLE: "canary"}),
        "spec": out,
    }


def build_canary_picker(owner: Owner, baseline_picker: Manifest) -> Manifest:
    """The baseline picker's pod template (image, args, ServiceAccount) serving the canary pool, one replica."""
    template = baseline_picker["spec"]["template"]
    pod: Manifest = copy.deepcopy(template["spec"])
    pool = canary_pool_name(owner.name)
    pointed = False
    for container in pod["containers"]:
        args = _with_pool_name([str(a) for a in container.get("args") or []], pool)
        if args is not None:
            container["args"], pointed = args, True
    if not pointed:
        raise NeedsFix(
            f"{POOL_FIELD}: the endpoint picker Deployment {baseline_picker['metadata']['name']} passes no "
            f"{POOL_NAME_FLAG} in its containers' args: kvcal cannot point a copy at the canary's pool"
        )
    pod_meta: Manifest = {"labels": picker_pod_labels(owner)}
    if template.get("metadata", {}).get("annotations"):
        pod_meta["annotations"] = dict(template["metadata"]["annotations"])
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, canary_picker_name(owner.name), "canary-picker", {LABEL_ROLE: PICKER_ROLE}),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": picker_pod_labels(owner)},
            "template": {"metadata": pod_meta, "spec": pod},
        },
    }


def build_canary_picker_service(owner: Owner, baseline_picker_service: Manifest) -> Manifest:
    """The baseline picker Service's ports, in front of the canary's picker only."""
    meta = metadata(owner, canary_picker_name(owner.name), "canary-picker", {LABEL_ROLE: PICKER_ROLE})
    return service_in_front_of(meta, picker_pod_labels(owner), baseline_picker_service)
