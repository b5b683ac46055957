"""The smallest valid KVCalibration (PVC model and output, a ConfigMap dataset): enough for the API server to admit
it, nothing an operator could act on."""

from typing import Any


def kvcalibration(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "kvcal.dev/v1alpha1",
        "kind": "KVCalibration",
        "metadata": {"name": name},
        "spec": {
            "model": {"source": "pvc://models/smollm2"},
            "calibration": {"dataset": {"source": "configmap://calib/prompts.jsonl"}, "output": "pvc://models/out"},
            "serving": {"baseline": {"deployment": "smollm2", "service": "smollm2"}},
        },
    }
