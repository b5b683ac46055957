"""Which pod the quality probes talk to, for each role.

Probes go to one ready pod of each role, by pod IP, never through the baseline Service: with the ``replicas`` router
the canary pods carry the baseline's labels, so the baseline Service answers from the canary about `weight`% of the
time and would blur exactly the difference the probes measure. Canary pods are found by kvcal's own labels
(``canary_pod_labels``), which they carry whatever the router; under the other routers they leave out the baseline
Service's selector labels (core.manifests.canary.labels_kept_off_canary). Pure: works on Pod/Service manifests read
by the reconciler.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from kvcal.core.manifests.common import LABEL_CALIBRATION, LABEL_ROLE, label_value

Manifest = dict[str, Any]


class NoEndpoint(LookupError):
    """No ready pod of a role: the interval's probes are an Error, never a pass."""


def pod_ready(pod: Manifest) -> bool:
    """Ready, not terminating, with a pod IP: what an Endpoints controller would route to."""
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp") or not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _port(pod: Manifest, service: Manifest | None) -> int:
    """The Service's first targetPort (a number, or a container port's name), else its port, else 8000 (vLLM's)."""
    ports = ((service or {}).get("spec") or {}).get("ports") or []
    if not ports:
        return 8000
    target = ports[0].get("targetPort", ports[0].get("port"))
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    for container in pod["spec"].get("containers") or []:
        for p in container.get("ports") or []:
            if p.get("name") == target:
                return int(p["containerPort"])
    raise NoEndpoint(f"pod {pod['metadata']['name']} has no container port named {target!r} (the Service's targetPort)")


def _url(pod: Manifest, service: Manifest | None) -> str:
    ip = pod["status"]["podIP"]
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{_port(pod, service)}"


def _pick(pods: Iterable[Manifest], wanted: Mapping[str, str], canary: bool) -> Manifest | None:
    found = [
        p
        for p in pods
        if pod_ready(p)
        and _matches(p["metadata"].get("labels") or {}, wanted)
        and ((p["metadata"].get("labels") or {}).get(LABEL_ROLE) == "canary") == canary
    ]
    return min(found, key=lambda p: str(p["metadata"]["name"])) if found else None  # stable across intervals


def canary_pod_labels(owner_name: str) -> dict[str, str]:
    """The labels every canary pod of `owner_name` carries, whatever the router."""
    return {LABEL_ROLE: "canary", LABEL_CALIBRATION: label_value(owner_name)}


def probe_urls(
    owner_name: str, pods: Iterable[Manifest], baseline: Manifest | None, service: Manifest | None
) -> tuple[str, str]:
    """(baseline URL, canary URL): one ready pod each, addressed by pod IP and the Service's target port."""
    if baseline is None:
        raise NoEndpoint("the baseline workload is gone")
    selector: Mapping[str, str] = baseline["spec"]["selector"].get("matchLabels") or {}
    pods = list(pods)
    base = _pick(pods, selector, canary=False)
    if base is None:
        raise NoEndpoint(f"no ready baseline pod (selector {dict(selector)}, without role=canary)")
    canary = _pick(pods, canary_pod_labels(owner_name), canary=True)
    if canary is None:
        raise NoEndpoint(f"no ready canary pod of {owner_name}")
    return _url(base, service), _url(canary, service)
