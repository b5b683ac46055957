"""The KVCalibration CRD on a real kube-apiserver: examples are admitted and defaulted exactly as the pydantic models
default them; malformed resources are rejected at admission with a message naming the field; explain teaches."""

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import KVCalibrationStatus
from tests.support.cluster import Cluster

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
MINIMAL = yaml.safe_load((REPO / "examples" / "minimal-per-tensor.yaml").read_text())

Spec = dict[str, Any]


@pytest.fixture(scope="module")
def admission_ns(control_plane: Cluster, crd_installed: str) -> Iterator[str]:
    """One namespace for the many rejection cases (a rejected object creates nothing to clean up)."""
    control_plane.kubectl("create", "namespace", "crd-admission")
    yield "crd-admission"
    control_plane.kubectl("delete", "namespace", "crd-admission", "--wait=false", check=False)


def _create(cluster: Cluster, namespace: str, doc: dict[str, Any]) -> Any:
    return cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "json", input=json.dumps(doc), check=False)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_is_admitted_and_defaulted_like_the_model(
    control_plane: Cluster, crd_installed: str, namespace: str, path: Path
) -> None:
    control_plane.kubectl("apply", "-n", namespace, "-f", str(path))
    doc = yaml.safe_load(path.read_text())
    stored = control_plane.get_json("kvcalibration", doc["metadata"]["name"], "-n", namespace)
    # The API server filled in every default; pydantic fills in the same ones.
    assert stored["spec"] == KVCalibrationSpec.model_validate(doc["spec"]).to_wire()
    assert "status" not in stored  # the spec is the user's; status is the operator's (status subresource)


def test_minimal_example_gets_the_documented_defaults(
    control_plane: Cluster, crd_installed: str, namespace: str
) -> None:
    created = json.loads(_create(control_plane, namespace, MINIMAL).stdout)
    spec = created["spec"]
    assert spec["calibration"]["samples"] == 512
    assert spec["calibration"]["observer"] == "static-minmax"
    assert spec["calibration"]["job"] == {"activeDeadlineSeconds": 3600, "backoffLimit": 1}
    assert spec["serving"]["traffic"] == {"router": "replicas", "steps": [10, 50], "drainDelay": "30s"}
    assert [c["metric"] for c in spec["analysis"]["latency"]] == ["ttft", "itl", "e2e"]
    assert spec["promotion"] == {"mode": "auto"}


def _set(path: str, value: Any) -> Callable[[Spec], None]:
    def change(spec: Spec) -> None:
        *parents, leaf = path.split(".")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value

    return change


def _delete(path: str) -> Callable[[Spec], None]:
    def change(spec: Spec) -> None:
        *parents, leaf = path.split(".")
        node = spec
        for key in parents:
            node = node[key]
        del node[leaf]

    return change


def _all(*changes: Callable[[Spec], None]) -> Callable[[Spec], None]:
    def change(spec: Spec) -> None:
        for c in changes:
            c(spec)

    return change


# (id, change to the minimal spec, field path the API server must name, a word of the fix or rule)
MALFORMED: list[tuple[str, Callable[[Spec], None], str, str]] = [
    ("no-model", _delete("model"), "spec.model", "Required value"),
    ("model-source-scheme", _set("model.source", "http://hub/llama"), "spec.model.source", "pvc://"),
    (
        "dataset-no-key",
        _set("calibration.dataset.source", "configmap://calib"),
        "spec.calibration.dataset.source",
        "configmap://NAME/KEY",
    ),
    ("dataset-format", _set("calibration.dataset.format", "parquet"), "spec.calibration.dataset.format", "chat"),
    ("samples-zero", _set("calibration.samples", 0), "spec.calibration.samples", "greater than or equal to 1"),
    ("seq-too-short", _set("calibration.maxSeqLength", 8), "spec.calibration.maxSeqLength", "16"),
    ("seq-too-long", _set("calibration.maxSeqLength", 4_000_000), "spec.calibration.maxSeqLength", "1048576"),
    ("holdout-zero", _set("calibration.holdoutFraction", 0), "spec.calibration.holdoutFraction", "(0, 0.5]"),
    ("holdout-too-big", _set("calibration.holdoutFraction", 0.6), "spec.calibration.holdoutFraction", "(0, 0.5]"),
    ("head-no-backend", _set("calibration.strategy", "head"), "spec.calibration.strategy", "FLASH_ATTN"),
    (
        "head-wrong-backend",
        _all(_set("calibration.strategy", "head"), _set("serving.canary.attentionBackend", "TRITON_ATTN")),
        "spec.calibration.strategy",
        "FLASH_ATTN",
    ),
    ("observer-unknown", _set("calibration.observer", "ema"), "spec.calibration.observer", "static-minmax"),
    (
        "output-is-source",
        _set("calibration.output", MINIMAL["spec"]["model"]["source"]),
        "spec.calibration.output",
        "must differ",
    ),
    ("output-scheme", _set("calibration.output", "/models/out"), "spec.calibration.output", "hostpath:///"),
    # Issue #10: '..' segments could climb out of a folder the operator's policy allows; the same folder spelt with a
    # trailing or doubled slash is still the model's folder.
    ("model-dot-dot", _set("model.source", "hostpath:///../../etc"), "spec.model.source", "'..'"),
    (
        "dataset-dot-dot",
        _set("calibration.dataset.source", "pvc://data/../../prompts.jsonl"),
        "spec.calibration.dataset.source",
        "'..'",
    ),
    ("output-dot-dot", _set("calibration.output", "hostpath:///var/../etc"), "spec.calibration.output", "'..'"),
    (
        "output-is-source-trailing-slash",
        _set("calibration.output", MINIMAL["spec"]["model"]["source"] + "/"),
        "spec.calibration.output",
        "must differ",
    ),
    (
        "output-is-source-double-slash",
        _set("calibration.output", "pvc://models//llama-3.1-8b-instruct/."),
        "spec.calibration.output",
        "must differ",
    ),
    ("no-output", _delete("calibration.output"), "spec.calibration.output", "Required value"),
    ("steps-decreasing", _set("serving.traffic.steps", [50, 10]), "spec.serving.traffic.steps", "strictly increasing"),
    ("steps-repeated", _set("serving.traffic.steps", [10, 10]), "spec.serving.traffic.steps", "strictly increasing"),
    ("step-zero", _set("serving.traffic.steps", [0, 50]), "spec.serving.traffic.steps", "(0, 100]"),
    ("step-over-100", _set("serving.traffic.steps", [10, 150]), "spec.serving.traffic.steps", "(0, 100]"),
    ("steps-empty", _set("serving.traffic.steps", []), "spec.serving.traffic.steps", "at least 1"),
    ("gateway-no-route", _set("serving.traffic.router", "gateway-api"), "spec.serving.traffic.httpRoute", "HTTPRoute"),
    ("router-unknown", _set("serving.traffic.router", "istio"), "spec.serving.traffic.router", "gateway-api"),
    ("kv-dtype", _set("serving.canary.kvCacheDtype", "int8"), "spec.serving.canary.kvCacheDtype", "fp8_e4m3"),
    (
        "extra-args-dtype",
        _set("serving.canary.extraArgs", ["--kv-cache-dtype=auto"]),
        "spec.serving.canary.extraArgs",
        "kvCacheDtype",
    ),
    ("replicas-zero", _set("serving.canary.replicas", 0), "spec.serving.canary.replicas", "greater than or equal to 1"),
    (
        "deployment-name",
        _set("serving.baseline.deployment", "Llama_BF16"),
        "spec.serving.baseline.deployment",
        "should match",
    ),
    ("no-service", _delete("serving.baseline.service"), "spec.serving.baseline.service", "Required value"),
    (
        "suite-no-configmap",
        _set("analysis.quality", {"suite": "configmap"}),
        "spec.analysis.quality.configMap",
        "ConfigMap",
    ),
    (
        "quantile-one",
        _set("analysis.latency", [{"metric": "ttft", "quantile": 1.0}]),
        "spec.analysis.latency[0].quantile",
        "(0, 1)",
    ),
    ("metric-unknown", _set("analysis.latency", [{"metric": "tpot"}]), "spec.analysis.latency[0].metric", "ttft"),
    (
        "latency-repeated",
        _set("analysis.latency", [{"metric": "ttft"}, {"metric": "ttft", "quantile": 0.95}]),
        "spec.analysis.latency",
        "must not repeat",
    ),
    ("interval-words", _set("analysis.interval", "1 minute"), "spec.analysis.interval", "should match"),
    ("interval-zero", _set("analysis.interval", "0s"), "spec.analysis.interval", "at least 1s"),
    ("warmup-empty", _set("analysis.warmup", ""), "spec.analysis.warmup", "at least 2 chars"),
    ("drain-words", _set("serving.traffic.drainDelay", "soon"), "spec.serving.traffic.drainDelay", "should match"),
    ("error-rate", _set("analysis.maxErrorRate", 2), "spec.analysis.maxErrorRate", "less than or equal to 1"),
    (
        "prometheus-url",
        _set("analysis.prometheus.address", "prometheus:9090"),
        "spec.analysis.prometheus.address",
        "should match",
    ),
    ("promotion-mode", _set("promotion.mode", "yolo"), "spec.promotion.mode", "manual"),
    ("typo-field", _set("calibration.sample", 64), "spec.calibration.sample", "unknown field"),
]


@pytest.mark.parametrize(("change", "field", "hint"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_kvcalibration_is_rejected_naming_the_field(
    control_plane: Cluster, admission_ns: str, change: Callable[[Spec], None], field: str, hint: str
) -> None:
    doc = copy.deepcopy(MINIMAL)
    doc["metadata"]["name"] = "malformed"
    change(doc["spec"])
    proc = _create(control_plane, admission_ns, doc)
    assert proc.returncode != 0, f"the API server admitted a malformed KVCalibration: {proc.stdout}"
    assert field in proc.stderr, proc.stderr
    assert hint in proc.stderr, proc.stderr


def test_dots_inside_a_name_are_admitted(control_plane: Cluster, admission_ns: str) -> None:
    """Only a whole '..' segment is refused: llama..v2 is an ordinary folder name."""
    doc = copy.deepcopy(MINIMAL)
    doc["metadata"]["name"] = "dots-in-names"
    doc["spec"]["model"]["source"] = "pvc://models/llama..v2"
    doc["spec"]["calibration"]["output"] = "pvc://models/llama..v2-fp8kv/"
    proc = _create(control_plane, admission_ns, doc)
    assert proc.returncode == 0, proc.stderr


def test_explain_teaches_the_calibration_fields(control_plane: Cluster, crd_installed: str) -> None:
    out = control_plane.kubectl("explain", "kvcalibration.spec.calibration").stdout
    prose = " ".join(out.split())  # explain wraps descriptions at the terminal width
    assert "How to calibrate" in prose
    for field in ("dataset", "samples", "maxSeqLength", "holdoutFraction", "strategy", "observer", "output", "job"):
        assert f"  {field}\t" in out or f"  {field} " in out, f"{field} missing from:\n{out}"
    assert "static-minmax tracks the true max" in prose
    assert "FLASH_ATTN" in prose
    steps = control_plane.kubectl("explain", "kvcal.spec.serving.traffic.steps").stdout
    assert "strictly increasing" in " ".join(steps.split())


def test_status_written_by_the_operator_round_trips_and_prints(
    control_plane: Cluster, crd_installed: str, namespace: str
) -> None:
    """What the pydantic status model emits is what the typed status schema stores, and the columns show it."""
    _create(control_plane, namespace, MINIMAL)
    name = MINIMAL["metadata"]["name"]
    status = KVCalibrationStatus.model_validate(
        {
            "phase": "Analyzing",
            "observedGeneration": 1,
            "conditions": [
                {
                    "type": "Calibrated",
                    "status": "True",
                    "reason": "JobSucceeded",
                    "lastTransitionTime": "2026-12-02T10:00:00Z",
                }
            ],
            "calibration": {
                "job": "llama-3-1-8b-calibrate",
                "kScaleMax": 0.21,
                "holdoutClipRateDefault": {"k": 0.01, "v": 0.02},
                "top1AgreementCalibrated": 0.991,
                "longestSampleTokens": 512,
                "servedContextTokens": 8192,
                "contextWarning": "calibration stops at 512 tokens, under 25% of the 8192-token context served",
            },
            "verification": {"layers": 32, "mismatches": 0},
            "canary": {"deployment": "llama-bf16-kvcal", "weight": 10},
            "analysis": {
                "ttftP95Delta": "+3.1%",
                "measurements": [
                    {
                        "metric": "ttft-p95",
                        "phase": "Successful",
                        "at": "2026-12-02T10:05:00Z",
                        "baseline": 0.2,
                        "canary": 0.206,
                    }
                ],
            },
            "history": [{"phase": "Analyzing", "at": "2026-12-02T10:04:00Z", "reason": "CanaryReady"}],
        }
    )
    patch = json.dumps({"status": status.to_wire()})
    control_plane.kubectl("patch", "kvcal", name, "-n", namespace, "--subresource=status", "--type=merge", "-p", patch)
    stored = control_plane.get_json("kvcal", name, "-n", namespace)
    assert KVCalibrationStatus.model_validate(stored["status"]) == status

    table = control_plane.kubectl("get", "kvcal", name, "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "MODEL", "STRATEGY", "WEIGHT", "TTFT-P95-DELTA", "AGE"]
    assert table[1].split()[:6] == [name, "Analyzing", "pvc://models/llama-3.1-8b-instruct", "tensor", "10", "+3.1%"]


def test_status_schema_rejects_an_unknown_phase(control_plane: Cluster, crd_installed: str, namespace: str) -> None:
    _create(control_plane, namespace, MINIMAL)
    patch = json.dumps({"status": {"phase": "Exploded"}})
    proc = control_plane.kubectl(
        "patch",
        "kvcal",
        MINIMAL["metadata"]["name"],
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        patch,
        check=False,
    )
    assert proc.returncode != 0
    assert "status.phase" in proc.stderr and "Unsupported value" in proc.stderr, proc.stderr
