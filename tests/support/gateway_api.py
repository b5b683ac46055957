"""The Gateway API's HTTPRoute CRD, reduced to what the API server needs to store HTTPRoutes (kvcal's router writes
their backendRefs' weights)."""

HTTPROUTE_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    # The real Gateway API CRDs carry this annotation too: *.k8s.io groups need it.
    "metadata": {"name": "httproutes.gateway.networking.k8s.io",
                 "annotations": {"api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/gateway-api/pull/3328"}},
    "spec": {
        "group": "gateway.networking.k8s.io",
        "names": {"kind": "HTTPRoute", "plural": "httproutes", "singular": "httproute", "listKind": "HTTPRouteList"},
        "scope": "Namespaced",
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
            "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
    },
}  # fmt: skip
