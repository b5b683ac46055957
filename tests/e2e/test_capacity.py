"""The KV capacity check on the real API server: a canary whose FP8 KV silently did not apply (it reports the BF16
baseline's KV tokens) is rolled back, with status and history saying so, and the baseline is left alone.

The operator runs in-process under the chart's ServiceAccount (tests/support/world.py's harness) with
FakeMetrics reporting vLLM's real cache_config_info values (tests/data/vllm-0.32-cpu); the real Prometheus and vLLM
side is proven in tests/integration/test_capacity_vllm.py. The calibrator and verifier are skipped by writing
status (as in test_traffic_drain).
"""

from pathlib import Path

import pytest
import yaml

from kvcal.ctl import render_status
from tests.support.cluster import wait_for
from tests.support.world import (
    BF16_KV,
    World,
    baseline,
    dataset_configmap,
    kvcalibration,
)

pytestmark = pytest.mark.cluster


def test_a_canary_without_effective_fp8_is_rolled_back_by_the_capacity_check(
    world: World,
    tmp_path: Path,
) -> None:
    w, name = world, "no-fp8"
    w.backends.metrics_fake.canary_kv = BF16_KV  # the canary stores BF16 KV although it was asked for FP8
    model = tmp_path / "model"
    model.mkdir()
    for manifest in [*baseline(model, replicas=1), dataset_configmap()]:
        w.apply(manifest)
    before = w.kube.get("Deployment", w.namespace, "llm")
    assert before is not None
    w.kubelet.hold("calibration")
    w.apply(kvcalibration(name, model, w.out))
    obj = w.wait_phase(name, "Calibrating", 30)
    status = {"phase": "Deploying", "verification": {"job": f"{obj['status']['calibration']['job']}-v", "layers": 1,
                                                     "mismatches": 0}}  # fmt: skip
    w.cluster.kubectl("patch", "-n", w.namespace, f"kvcalibration/{name}", "--subresource=status", "--type=merge",
                      "-p", yaml.safe_dump({"status": status}))  # fmt: skip
    obj = w.wait_phase(name, "RolledBack", 90)

    rolling_back = next(h for h in obj["status"]["history"] if h["phase"] == "RollingBack")
    assert rolling_back["reason"] == "AnalysisFailed"
    assert rolling_back["message"].startswith("FailureLimit: 2 failed intervals (limit 1)")
    assert (
        "kvCapacity: FP8 KV did not take effect: canary 93184 KV tokens (auto) vs baseline 93184 (auto): 1.00x, "
        "needs >= 1.80x" in rolling_back["message"]
    )
    capacity = obj["status"]["capacity"]
    assert capacity["tokenRatio"] == 1.0
    assert capacity["canary"] == capacity["baseline"] == {
        "cacheDtype": "auto", "kvTokens": 93184, "kvBytes": 2147483648, "bytesPerToken": 23045.6,
        "maxConcurrency": 45.5,
    }  # fmt: skip
    failed = [m for m in obj["status"]["analysis"]["measurements"] if m["metric"] == "kvCapacity"]
    assert [m["phase"] for m in failed] == ["Failed", "Failed"]
    assert "KV capacity" in render_status(obj) and "1.00x" in render_status(obj)
    wait_for(lambda: w.children("Deployment", name) == [], 30, "the canary removed")
    after = w.kube.get("Deployment", w.namespace, "llm")
    assert after is not None and after["spec"]["template"] == before["spec"]["template"]
