"""Shared builders for the operator's unit tests: specs, a baseline Deployment, observations, and the statuses
that decide() starts from."""

import copy
import json
from datetime import UTC, datetime
from typing import Any

from kvcal.core.guard.policy import Policy
from kvcal.core.manifests import Owner, calibration_job_name, canary_name, verification_job_name
from kvcal.core.manifests.canary import PROMOTED_ANNOTATION, fp8_pod_spec, promotion_marker
from kvcal.core.manifests.common import DEFAULT_CALIBRATOR_IMAGE
from kvcal.core.observations import Create, Decision, Delete, DeploymentState, JobState, Observations, SetWeight
from kvcal.core.spechash import spec_hash
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import (
    AnalysisStatus,
    CalibrationStatus,
    CanaryStatus,
    KVCalibrationStatus,
    Measurement,
    Phase,
    VerificationStatus,
)

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
OWNER = Owner("smollm2", "llm", "0a1b2c3d-0000-4000-8000-000000000001")

SPEC: dict[str, Any] = {
    "model": {"source": "pvc://models/smollm2", "revision": "abc123"},
    "calibration": {
        "dataset": {"source": "configmap://calib/prompts.jsonl", "format": "chat"},
        "samples": 64,
        "maxSeqLength": 512,
        "output": "pvc://models/smollm2-fp8kv",
        "job": {
            "image": "ghcr.io/kvcal/calibrator:test",
            "nodeSelector": {"gpu": "h100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "activeDeadlineSeconds": 1800,
            "backoffLimit": 0,
        },
    },
    "serving": {"baseline": {"deployment": "llm", "service": "llm"}, "traffic": {"steps": [50]}},
    "analysis": {"interval": "30s", "warmup": "0s", "successfulIntervals": 2, "failureLimit": 1},
}


# The operator's policy in these tests: SPEC's calibration image is the operator's calibrator image.
POLICY = Policy(calibrator_image=SPEC["calibration"]["job"]["image"])


def spec(**overrides: Any) -> KVCalibrationSpec:
    """SPEC with top-level blocks merged one level deep: spec(analysis={"failureLimit": 1})."""
    data = copy.deepcopy(SPEC)
    for key, value in overrides.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return KVCalibrationSpec.model_validate(data)


def spec_with(**changes: Any) -> KVCalibrationSpec:
    """SPEC with dotted paths set, e.g. spec_with(**{"model.source": "hostpath:///etc"})."""
    data = copy.deepcopy(SPEC)
    data["calibration"]["job"]["image"] = DEFAULT_CALIBRATOR_IMAGE
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[leaf] = value
    return KVCalibrationSpec.model_validate(data)


def baseline_manifest(replicas: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm", "namespace": "llm", "generation": 1, "labels": {"app": "llm"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "llm"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": {"app": "llm", "tier": "serving"}},
                "spec": {
                    "nodeSelector": {"gpu": "h100"},
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.32.0",
                            "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
                            "args": ["--model", "/models/smollm2", "--port", "8000", "--kv-cache-dtype", "auto"],
                            "ports": [{"containerPort": 8000, "name": "http"}],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                            "volumeMounts": [{"name": "models", "mountPath": "/models"}],
                        }
                    ],
                    "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models"}}],
                },
            },
        },
    }


def baseline_service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "llm", "namespace": "llm"},
        "spec": {"selector": {"app": "llm"}, "ports": [{"name": "http", "port": 80, "targetPort": 8000}]},
    }


def baseline(replicas: int = 2, promoted: bool = False, **status: Any) -> DeploymentState:
    """The baseline's observed state; promoted=True: the promotion patch of spec() has landed."""
    fields: dict[str, Any] = {"ready_replicas": replicas, "updated_replicas": replicas, "available_replicas": replicas}
    fields.update(status)
    manifest = baseline_manifest(replicas)
    if promoted:
        manifest["metadata"]["annotations"] = {PROMOTED_ANNOTATION: promotion_marker(OWNER, spec_hash(spec()))}
        manifest["spec"]["template"]["spec"] = fp8_pod_spec(manifest, spec())
    return DeploymentState(manifest=manifest, replicas=replicas, observed_generation=1, **fields)


def job(name: str, state: str = "Running", message: str = "", reason: str = "", deleting: bool = False) -> JobState:
    return JobState(name, state, message, reason, deleting)  # type: ignore[arg-type]


def observations(**fields: Any) -> Observations:
    fields.setdefault("baseline", baseline())
    fields.setdefault("baseline_service", baseline_service())
    if "calibrator_image" in fields:  # the operator's default image (chart value jobImages.calibrator)
        fields["policy"] = POLICY.model_copy(update={"calibrator_image": fields.pop("calibrator_image")})
    fields.setdefault("policy", POLICY)
    return Observations(owner=OWNER, generation=fields.pop("generation", 1), **fields)


def statefulset_manifest(replicas: int = 2) -> dict[str, Any]:
    """baseline_manifest() as a StatefulSet: a governing Service, Parallel pods, OnDelete updates, and a claim template
    that the vLLM container mounts (its compile cache)."""
    manifest = baseline_manifest(replicas)
    manifest["kind"] = "StatefulSet"
    sts = manifest["spec"]
    del sts["strategy"]
    sts.update(serviceName="llm-headless", podManagementPolicy="Parallel", updateStrategy={"type": "OnDelete"})
    claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}
    sts["volumeClaimTemplates"] = [
        {"metadata": {"name": "cache", "labels": {"app": "llm"}}, "spec": claim, "status": {"phase": "Pending"}}
    ]
    sts["template"]["spec"]["containers"][0]["volumeMounts"].append({"name": "cache", "mountPath": "/root/.cache"})
    return manifest


# The statuses decide() starts from: the Jobs and canary named as the operator names them for SPEC.
P = Phase
SPEC_MODEL = spec()  # SPEC as the operator parses it
H = spec_hash(SPEC_MODEL)
CALIB = calibration_job_name(OWNER.name, H)
VERIFY = verification_job_name(OWNER.name, H)
CANARY = canary_name(OWNER.name)
SUMMARY = json.dumps(
    {
        "samples": 64,
        "tokens": 30712,
        "strategy": "tensor",
        "observer": "static_minmax",
        "kScaleMax": 0.41,
        "vScaleMax": 0.07,
        "holdoutClipRateDefault": {"k": 0.012, "v": 0.03},
        "holdoutClipRateCalibrated": {"k": 0.0, "v": 0.0},
        "top1AgreementDefault": 0.906,
        "top1AgreementCalibrated": 0.981,
        "durationSeconds": 61.2,
        "artifact": "/kvcal/pvc/models/smollm2-fp8kv",
        "modelHash": "9f2c" * 16,
        "modelRevision": "abc123",
        "device": "cuda:0,cuda:1",
        "placement": "several-devices",
        "dtype": "bfloat16",
        "peakDeviceMemoryBytes": 71_000_000_000,
        "tokensPerSecond": 41250.5,
        "reportVersion": 1,
    }
)


def status(phase: Phase, **fields: Any) -> KVCalibrationStatus:
    calibration = CalibrationStatus(job=CALIB, spec_hash=H) if phase != P.PENDING else CalibrationStatus()
    fields.setdefault("calibration", calibration)
    return KVCalibrationStatus(phase=phase, **fields)


def canary(replicas: int = 2, ready: int = 2, **kw: Any) -> DeploymentState:
    return DeploymentState(manifest={}, replicas=replicas, ready_replicas=ready, **kw)


def m(phase: str, metric: str = "ttft-p95") -> Measurement:
    return Measurement(metric=metric, phase=phase, at="2026-01-02T03:04:05Z", baseline=0.1, canary=0.1)  # type: ignore[arg-type]


ANALYZING = status(
    P.ANALYZING,
    verification=VerificationStatus(job=VERIFY, layers=30, mismatches=0),
    canary=CanaryStatus(deployment=CANARY, weight=50, ready_replicas=2),
    analysis=AnalysisStatus(started_at="2026-01-02T03:00:00Z"),
)


def started(phase: Phase) -> KVCalibrationStatus:
    """A status as the operator writes it in `phase` (calibrated and verified from Deploying on)."""
    return KVCalibrationStatus(
        phase=phase,
        calibration=CalibrationStatus(job="c", spec_hash=spec_hash(spec()), artifact="pvc://models/smollm2-fp8kv"),
        verification=VerificationStatus(job="v", layers=30, mismatches=0),
        canary=CanaryStatus(deployment="smollm2-canary", step_index=0),
        analysis=AnalysisStatus(started_at="2026-01-02T03:00:00Z"),
    )


def actions(decision: Decision) -> list[str]:
    """The weight, create and delete actions of a decision, in order, as short strings."""
    out = []
    for action in decision.actions:
        if isinstance(action, SetWeight):
            out.append(f"SetWeight {action.weight}")
        elif isinstance(action, Delete):
            out.append(f"Delete {action.kind}/{action.name}")
        elif isinstance(action, Create):
            out.append(f"Create {action.manifest['kind']}/{action.manifest['metadata']['name']}")
    return out
