"""Traffic routers behind ``kvcal.ports.Router``.

- ``gateway-api``: rewrites the backendRef weights of the HTTPRoute named in ``spec.serving.traffic.httpRoute``:
  every rule that routes to the baseline Service gets the canary Service beside it (same port), weights
  ``100 - w`` and ``w``; weight 0 removes the canary backendRef again (rollback/promotion restore the route as it
  was). Written with the object's resourceVersion, so a concurrent edit is a conflict, not a lost update, and
  only while the route shows the share the pass read (``seen``): an edit is judged (WeightDrift) before it is undone.
  ``get_weight`` reads the share back from the route (the operator never assumes its write landed). The shadow
  stage adds a RequestMirror filter to the same rules (``get_mirror`` reads it back), after ``gateway_features``
  showed the route's Gateway class supports it.
- ``inference-pool``: the same router with InferencePool backendRefs (group inference.networking.k8s.io): the
  baseline's pool (``spec.serving.traffic.inferencePool``) and the canary's own (core.manifests.pool).
- ``replicas`` and ``none``: nothing to write — the canary's share follows its replica count, which the operator
  sets from ``kvcal.core.manifests.traffic.plan_step``.
"""

import copy
import logging
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kvcal.core.manifests.pool import POOL_GROUP, POOL_KIND, canary_pool_name
from kvcal.ports import Conflict, Router, Routing, Target

log = logging.getLogger(__name__)
GROUP, VERSION, PLURAL = "gateway.networking.k8s.io", "v1", "httproutes"


@dataclass(frozen=True)
class BackendKind:
    """What a backendRef points at: a core Service (the defaults of a backendRef) or an InferencePool."""

    group: str = ""
    kind: str = "Service"

    def names(self, ref: dict[str, Any], name: str) -> bool:
        return bool(
            ref.get("name") == name and ref.get("group", "") == self.group and ref.get("kind", "Service") == self.kind
        )


SERVICE = BackendKind()
INFERENCE_POOL = BackendKind(POOL_GROUP, POOL_KIND)


def weighted_rules(
    rules: list[dict[str, Any]],
    baseline: str,
    canary: str,
    weight: int,
    backend: BackendKind = SERVICE,
    mirror: int = 0,
) -> list[dict[str, Any]]:
    """The HTTPRoute rules with ``weight`` percent on the ``canary`` backend beside ``baseline`` and ``mirror`` percent
    of their requests mirrored to it (pure; the input is not modified)."""
    if not 0 <= weight <= 100 or not 0 <= mirror <= 100:
        raise ValueError(f"canary weight {weight}, mirror {mirror}: each must be a percentage in [0, 100]")
    out = copy.deepcopy(rules)
    touched = 0
    for rule in out:
        refs: list[dict[str, Any]] = rule.get("backendRefs") or []
        baseline_ref = next((r for r in refs if backend.names(r, baseline)), None)
        if baseline_ref is None:
            continue
        touched += 1
        refs[:] = [r for r in refs if not backend.names(r, canary)]
        if weight > 0:
            baseline_ref["weight"] = 100 - weight
            canary_ref = {k: v for k, v in baseline_ref.items() if k in ("group", "kind", "namespace", "port")}
            refs.append({**canary_ref, "name": canary, "weight": weight})
        elif baseline_ref.get("weight", 1) != 1:
            # Back to the default weight (1) of a lone backend; a weight of 1 is left as it is: a CRD that defaults
            # the field stores 1 where it was left out, and rewriting it every pass would change nothing.
            baseline_ref.pop("weight", None)
        rule["backendRefs"] = refs
        _set_mirror(rule, baseline_ref, canary, mirror)
    if touched == 0:
        if weight == 0 and mirror == 0:
            return out  # no rule routes to the baseline, so none routes to the canary either
        field = "spec.serving.baseline.service" if backend == SERVICE else "spec.serving.traffic.inferencePool"
        raise ValueError(
            f"HTTPRoute has no rule with a backendRef to {backend.kind} {baseline!r}: point "
            f"spec.serving.traffic.httpRoute at the route that serves {field}"
        )
    return out


def _is_mirror_to(entry: dict[str, Any], canary_service: str) -> bool:
    return (
        entry.get("type") == "RequestMirror"
        and ((entry.get("requestMirror") or {}).get("backendRef") or {}).get("name") == canary_service
    )


def _set_mirror(rule: dict[str, Any], baseline: dict[str, Any], canary_service: str, mirror: int) -> None:
    """Our RequestMirror filter on the rule (percent omitted at 100%: plain mirroring is the wider-supported
    feature); 0 removes it, and the rule's other filters are kept as they were."""
    filters = [f for f in rule.get("filters") or [] if not _is_mirror_to(f, canary_service)]
    if mirror > 0:
        ref = {k: v for k, v in baseline.items() if k in ("group", "kind", "namespace", "port")}
        request_mirror: dict[str, Any] = {"backendRef": {**ref, "name": canary_service}}
        if mirror < 100:
            request_mirror["percent"] = mirror
        filters.append({"type": "RequestMirror", "requestMirror": request_mirror})
    if filters:
        rule["filters"] = filters
    else:
        rule.pop("filters", None)


def mirror_share(rules: list[dict[str, Any]], canary_service: str) -> int:
    """The percent of requests any rule mirrors to the canary (pure; 0 when none does)."""
    shares = [0]
    for rule in rules:
        for entry in rule.get("filters") or []:
            if _is_mirror_to(entry, canary_service):
                request_mirror = entry.get("requestMirror") or {}
                fraction = request_mirror.get("fraction")
                if fraction:
                    shares.append(round(100 * int(fraction["numerator"]) / int(fraction.get("denominator", 100))))
                else:
                    shares.append(int(request_mirror.get("percent", 100)))
    return max(shares)


def supported_features(gateway_class: dict[str, Any]) -> frozenset[str]:
    """A GatewayClass's status.supportedFeatures as names (v1.2 lists strings, v1.3+ objects with a name)."""
    listed = (gateway_class.get("status") or {}).get("supportedFeatures") or []
    return frozenset(entry["name"] if isinstance(entry, dict) else str(entry) for entry in listed)


def canary_share(rules: list[dict[str, Any]], baseline: str, canary: str, backend: BackendKind = SERVICE) -> int:
    """The canary's percentage of the rules that route to the baseline (pure): the largest over those rules, so a
    single rule edited to send traffic to the canary is seen. 0 when no rule names the canary."""
    shares = [0]
    for rule in rules:
        refs: list[dict[str, Any]] = rule.get("backendRefs") or []
        if not any(backend.names(r, baseline) for r in refs):
            continue
        total = sum(int(r.get("weight", 1)) for r in refs)
        on_canary = sum(int(r.get("weight", 1)) for r in refs if backend.names(r, canary))
        shares.append(round(100 * on_canary / total) if total else 0)
    return max(shares)


def _routing(route: dict[str, Any] | None, target: Target) -> tuple[int, int]:
    """(the canary's weight, the percent mirrored to it) as the route shows them; (0, 0) without a route."""
    if route is None:
        return 0, 0  # no route, so nothing routes or mirrors to the canary
    rules = route.get("spec", {}).get("rules") or []
    return canary_share(rules, *backends(target)), mirror_share(rules, target.canary_service)


def backends(target: Target) -> tuple[str, str, BackendKind]:
    """(baseline, canary, what they are) in the HTTPRoute: the two Services, or the two InferencePools."""
    traffic = target.spec.serving.traffic
    if traffic.router == "inference-pool" and traffic.inference_pool:
        return traffic.inference_pool, canary_pool_name(target.name), INFERENCE_POOL
    return target.spec.serving.baseline.service, target.canary_service, SERVICE


class GatewayApiRouter:
    """Routers gateway-api and inference-pool: weights on the HTTPRoute's backendRefs (``backends``)."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api = client.CustomObjectsApi(api_client)

    @staticmethod
    def _route_name(target: Target) -> str:
        name = target.spec.serving.traffic.http_route
        if not name:
            raise ValueError(
                f"spec.serving.traffic.httpRoute: required when router is {target.spec.serving.traffic.router}"
            )
        return name

    def _route(self, target: Target) -> dict[str, Any] | None:
        name = self._route_name(target)
        try:
            route: dict[str, Any] = dict(
                self.api.get_namespaced_custom_object(GROUP, VERSION, target.namespace, PLURAL, name)
            )  # type: ignore[call-overload]
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return route

    def get_weight(self, target: Target) -> int | None:
        return _routing(self._route(target), target)[0]

    def get_mirror(self, target: Target) -> int | None:
        return _routing(self._route(target), target)[1]

    def gateway_features(self, target: Target) -> frozenset[str] | None:
        """The features every parent Gateway's class supports (a mirror must work on each); None if any is unread."""
        route = self._route(target)
        parents = [
            p for p in (route or {}).get("spec", {}).get("parentRefs") or [] if p.get("kind", "Gateway") == "Gateway"
        ]
        if not parents:
            return None
        common: frozenset[str] | None = None
        for parent in parents:
            namespace = parent.get("namespace") or target.namespace
            gateway = self._get(namespace, "gateways", parent["name"])
            class_name = (gateway or {}).get("spec", {}).get("gatewayClassName")
            gateway_class = self._get(None, "gatewayclasses", class_name) if class_name else None
            if gateway_class is None:
                return None
            features = supported_features(gateway_class)
            common = features if common is None else common & features
        return common

    def _get(self, namespace: str | None, plural: str, name: str) -> dict[str, Any] | None:
        found: Any
        try:
            if namespace is None:
                found = self.api.get_cluster_custom_object(GROUP, VERSION, plural, name)
            else:
                found = self.api.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
        except ApiException as e:
            if e.status in (403, 404):  # not granted (chart value) or absent: the stage is refused, not crashed
                return None
            raise
        return found if isinstance(found, dict) else None

    def set_weight(self, target: Target, weight: int, mirror: int = 0, seen: Routing | None = None) -> None:
        name = self._route_name(target)
        route = self._route(target)
        changed = f"HTTPRoute {target.namespace}/{name} changed since this pass read it"
        if seen is not None and _routing(route, target) != seen:
            raise Conflict(changed)  # an edit the pass has not judged: it re-reads, reports it and puts it back
        if route is None:
            if weight == 0 and mirror == 0:
                return  # nothing to take the canary out of
            raise LookupError(f"HTTPRoute {target.namespace}/{name} (spec.serving.traffic.httpRoute) not found")
        rules = route.get("spec", {}).get("rules") or []
        baseline, canary, backend = backends(target)
        new_rules = weighted_rules(rules, baseline, canary, weight, backend, mirror)
        if new_rules == rules:
            return
        # A merge patch (the chart grants get/patch, not update) carrying the resourceVersion it read: a concurrent
        # edit answers 409 instead of being overwritten, and the pass re-reads.
        patch = {"metadata": {"resourceVersion": route["metadata"]["resourceVersion"]}, "spec": {"rules": new_rules}}
        try:
            self.api.patch_namespaced_custom_object(
                GROUP, VERSION, target.namespace, PLURAL, name, patch, _content_type="application/merge-patch+json"
            )
        except ApiException as e:
            if e.status == 409:
                raise Conflict(changed) from e
            raise
        log.info(
            "HTTPRoute %s/%s: canary %s %s at %d%%, mirrored %d%%",
            target.namespace,
            name,
            backend.kind,
            canary,
            weight,
            mirror,
        )


class NopRouter:
    """replicas / none: the weight follows the replica counts the operator already applied."""

    def set_weight(self, target: Target, weight: int, mirror: int = 0, seen: Routing | None = None) -> None:
        return None

    def get_weight(self, target: Target) -> int | None:
        return None

    def get_mirror(self, target: Target) -> int | None:
        return None

    def gateway_features(self, target: Target) -> frozenset[str] | None:
        return None


def router_for(target: Target, kube: Any) -> Router:
    """The router of ``spec.serving.traffic.router``; ``kube`` is the operator's KubeClient (its ``.api``)."""
    if target.spec.serving.traffic.routes:
        api_client = getattr(kube, "api", None)
        if not isinstance(api_client, client.ApiClient):
            raise TypeError("the HTTPRoute routers need a kubernetes ApiClient (KubeClient.api)")
        return GatewayApiRouter(api_client)
    return NopRouter()
