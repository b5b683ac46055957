"""An InferencePool baseline for the inference-pool router's unit tests: its pool, endpoint picker and Service."""

from typing import Any

from tests.support.decide import spec

TRAFFIC = {"router": "inference-pool", "httpRoute": "llm", "inferencePool": "llm-pool", "steps": [30, 60]}
POOL_SPEC = spec(serving={"baseline": {"deployment": "llm", "service": "llm"}, "traffic": TRAFFIC})


def baseline_pool() -> dict[str, Any]:
    """The baseline's pool: it selects by `tier` (not the Service's `app`), so the canary must drop that key too."""
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "llm-pool", "namespace": "llm"},
        "spec": {
            "selector": {"matchLabels": {"tier": "serving"}},
            "targetPorts": [{"number": 8000}],
            "appProtocol": "http",
            "endpointPickerRef": {
                "group": "",
                "kind": "Service",
                "name": "llm-epp",
                "port": {"number": 9002},
                "failureMode": "FailClose",
            },
        },
    }


def picker_service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "llm-epp", "namespace": "llm"},
        "spec": {
            "selector": {"app": "llm-epp"},
            "ports": [{"name": "grpc-ext-proc", "port": 9002, "targetPort": 9002}],
        },
    }


def picker() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm-epp", "namespace": "llm"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "llm-epp"}},
            "template": {
                "metadata": {"labels": {"app": "llm-epp"}},
                "spec": {
                    "serviceAccountName": "llm-epp",
                    "containers": [
                        {
                            "name": "epp",
                            "image": "registry.k8s.io/gateway-api-inference-extension/epp:v1.0.0",
                            "args": ["--pool-name", "llm-pool", "--pool-namespace", "llm", "--grpc-port", "9002"],
                            "ports": [{"containerPort": 9002, "name": "grpc"}],
                        }
                    ],
                },
            },
        },
    }
