"""Traffic routers behind ``kvcal.ports.Router``.

- ``gateway-api``: rewrites the backendRef weights of the HTTPRoute named in ``spec.serving.traffic.httpRoute``:
  every rule that routes to the baseline Service gets the canary Service beside it (same port), weights
  ``100 - w`` and ``w``; weight 0 removes the canary backendRef again (rollback/promotion restore the route as it
  was). Written with the object's resourceVersion, so a concurrent edit is a conflict, not a lost update.
  ``get_weight`` reads the share back from the route (the operator never assumes its write landed).
- ``replicas`` and ``none``: nothing to write — the canary's share follows its replica count, which the operator
  sets from ``kvcal.core.traffic.plan_step``.
"""

import copy
import logging
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kvcal.ports import Router, Target

log = logging.getLogger(__name__)
GROUP, VERSION, PLURAL = "gateway.networking.k8s.io", "v1", "httproutes"


def weighted_rules(
    rules: list[dict[str, Any]], baseline_service: str, canary_service: str, weight: int
) -> list[dict[str, Any]]:
    """The HTTPRoute rules with ``weight`` percent on the canary Service (pure; the input is not modified)."""
    if not 0 <= weight <= 100:
        raise ValueError(f"canary weight {weight}: must be a percentage in [0, 100]")
    out = copy.deepcopy(rules)
    touched = 0
    for rule in out:
        refs: list[dict[str, Any]] = rule.get("backendRefs") or []
        baseline = next(
            (r for r in refs if r.get("name") == baseline_service and r.get("kind", "Service") == "Service"), None
        )
        if baseline is None:
            continue
        touched += 1
        refs[:] = [r for r in refs if r.get("name") != canary_service]
        baseline["weight"] = 100 - weight
        if weight > 0:
            canary = {k: v for k, v in baseline.items() if k in ("group", "kind", "namespace", "port")}
            refs.append({**canary, "name": canary_service, "weight": weight})
        else:
            baseline.pop("weight", None)  # back to the default weight (1) of a lone backend
        rule["backendRefs"] = refs
    if touched == 0:
        raise ValueError(
            f"HTTPRoute has no rule with a backendRef to Service {baseline_service!r}: point "
            "spec.serving.traffic.httpRoute at the route that serves spec.serving.baseline.service"
        )
    return out


def canary_share(rules: list[dict[str, Any]], baseline_service: str, canary_service: str) -> int:
    """The canary's percentage of the rules that route to the baseline (pure): the largest over those rules, so a
    single rule edited to send traffic to the canary is seen. 0 when no rule names the canary."""
    shares = [0]
    for rule in rules:
        refs: list[dict[str, Any]] = rule.get("backendRefs") or []
        if not any(r.get("name") == baseline_service for r in refs):
            continue
        total = sum(int(r.get("weight", 1)) for r in refs)
        canary = sum(int(r.get("weight", 1)) for r in refs if r.get("name") == canary_service)
        shares.append(round(100 * canary / total) if total else 0)
    return max(shares)


class GatewayApiRouter:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api = client.CustomObjectsApi(api_client)

    @staticmethod
    def _route_name(target: Target) -> str:
        name = target.spec.serving.traffic.http_route
        if not name:
            raise ValueError("spec.serving.traffic.httpRoute: required when router is gateway-api")
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
        route = self._route(target)
        if route is None:
            return 0  # no route, so nothing routes to the canary
        rules = route.get("spec", {}).get("rules") or []
        return canary_share(rules, target.spec.serving.baseline.service, target.canary_service)

    def set_weight(self, target: Target, weight: int) -> None:
        name = self._route_name(target)
        route = self._route(target)
        if route is None:
            if weight == 0:
                return  # nothing to take the canary out of
            raise LookupError(f"HTTPRoute {target.namespace}/{name} (spec.serving.traffic.httpRoute) not found")
        rules = route.get("spec", {}).get("rules") or []
        new_rules = weighted_rules(rules, target.spec.serving.baseline.service, target.canary_service, weight)
        if new_rules == rules:
            return
        # A merge patch (the chart grants get/patch, not update) carrying the resourceVersion it read: a concurrent
        # edit answers 409 instead of being overwritten.
        patch = {"metadata": {"resourceVersion": route["metadata"]["resourceVersion"]}, "spec": {"rules": new_rules}}
        self.api.patch_namespaced_custom_object(
            GROUP, VERSION, target.namespace, PLURAL, name, patch, _content_type="application/merge-patch+json"
        )
        log.info("HTTPRoute %s/%s: canary %s at %d%%", target.namespace, name, target.canary_service, weight)


class NopRouter:
    """replicas / none: the weight follows the replica counts the operator already applied."""

    def set_weight(self, target: Target, weight: int) -> None:
        return None

    def get_weight(self, target: Target) -> int | None:
        return None


def router_for(target: Target, kube: Any) -> Router:
    """The router of ``spec.serving.traffic.router``; ``kube`` is the operator's KubeClient (its ``.api``)."""
    if target.spec.serving.traffic.router == "gateway-api":
        api_client = getattr(kube, "api", None)
        if not isinstance(api_client, client.ApiClient):
            raise TypeError("gateway-api router needs a kubernetes ApiClient (KubeClient.api)")
        return GatewayApiRouter(api_client)
    return NopRouter()
