"""Session-wide fixtures. Each real component is started once per test session and shared:
one control plane (tests/support/cluster.py), one demo calibration (tests/support/demo.py),
one vLLM server (tests/support/vllm.py), one Prometheus (tests/support/prometheus.py), podman (tests/support/oci.py)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

pytest_plugins = [
    "tests.support.cluster",
    "tests.support.demo",
    "tests.support.vllm",
    "tests.support.prometheus",
    "tests.support.oci",
    "tests.support.argocd",
    "tests.support.scheduling",
]
