"""The calibration Job (+ its ConfigMap) and the verification Job."""

import json
from typing import Any

from kvcal.core.manifests.common import (
    DEFAULT_CALIBRATOR_IMAGE,
    LABEL_SPEC_HASH,
    TERMINATION_MESSAGE_PATH,
    Location,
    Manifest,
    Owner,
    calibration_job_name,
    container_security_context,
    locate,
    metadata,
    pod_security_context,
    verification_job_name,
    volumes_and_mounts,
)
from kvcal.core.protected import skip_layer_args
from kvcal.models.spec import KVCalibrationSpec

CONFIG_MOUNT = "/kvcal/config"
CONFIG_KEY = "config.json"
# Caches (HF, torch, vLLM) go to an emptyDir: the image's home may not be writable for a non-root user.
SCRATCH_MOUNT = "/tmp"
DEFAULT_CALIBRATION_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "4", "memory": "32Gi"},
    "limits": {"memory": "64Gi", "nvidia.com/gpu": "1"},
}


def _locations(spec: KVCalibrationSpec) -> tuple[Location, Location, Location]:
    model = locate(spec.model.source, field="spec.model.source")
    dataset = locate(spec.calibration.dataset.source, field="spec.calibration.dataset.source", directory=False)
    output = locate(spec.calibration.output, field="spec.calibration.output", writable=True)
    return model, dataset, output


def checkpoint_location(spec: KVCalibrationSpec) -> Location:
    """Where the calibrated checkpoint is, for the verification Job and the canary."""
    return locate(spec.calibration.output, field="spec.calibration.output")


def calibration_config(spec: KVCalibrationSpec, max_model_len: int | None = None) -> dict[str, Any]:
    """The calibrator's config file (camelCase kvcal.calibrator.config.CalibrationConfig) with in-container paths.

    force: a retried pod (backoffLimit) finds the previous attempt's partial output; the output path belongs to
    this calibration, so it is replaced. The data format (chat or text) is detected by the calibrator per record.
    max_model_len: the baseline's --max-model-len, for the length coverage (else the calibrator uses the model's).
    """
    model, dataset, output = _locations(spec)
    cal = spec.calibration
    config: dict[str, Any] = {
        "modelDir": model.path,
        "data": dataset.path,
        "out": output.path,
        "samples": cal.samples,
        "maxSeqLength": cal.max_seq_length,
        "holdoutFraction": cal.holdout_fraction,
        "seed": cal.seed,
        "strategy": cal.strategy,
        "observer": cal.observer,
        "pipeline": cal.pipeline,
        "force": True,
    }
    # Optional keys only when set: a pinned older calibrator reads this config too.
    optional = {"maxModelLen": max_model_len, "queryScales": True if cal.query_scales else None}
    return config | {key: value for key, value in optional.items() if value}


def build_calibration_configmap(
    owner: Owner, spec: KVCalibrationSpec, spec_hash: str, max_model_len: int | None = None
) -> Manifest:
    name = calibration_job_name(owner.name, spec_hash)
    config = calibration_config(spec, max_model_len)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, name, "calibration", {LABEL_SPEC_HASH: spec_hash[:8]}),
        "data": {CONFIG_KEY: json.dumps(config, indent=2, sort_keys=True) + "\n"},
    }


def _job(
    owner: Owner,
    name: str,
    component: str,
    spec_hash: str,
    container: Manifest,
    volumes: list[Manifest],
    *,
    deadline: int,
    backoff: int,
    scheduling: Manifest,
) -> Manifest:
    pod_labels = {**metadata(owner, name, component)["labels"], LABEL_SPEC_HASH: spec_hash[:8]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(owner, name, component, {LABEL_SPEC_HASH: spec_hash[:8]}),
        "spec": {
            "backoffLimit": backoff,
            "activeDeadlineSeconds": deadline,
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,  # neither Job talks to the API server
                    "securityContext": pod_security_context(),
                    **scheduling,
                    "containers": [container],
                    "volumes": [*volumes, {"name": "kvcal-scratch", "emptyDir": {}}],
                },
            },
        },
    }


def _container(name: str, image: str, command: list[str], mounts: list[Manifest], resources: Manifest) -> Manifest:
    return {
        "name": name,
        "image": image,
        "command": command,
        "env": [
            {"name": "HOME", "value": SCRATCH_MOUNT},
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "resources": resources,
        # Writes go to the output mount and to /tmp (an emptyDir holding HOME and every cache), nowhere else.
        "securityContext": {**container_security_context(), "readOnlyRootFilesystem": True},
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [*mounts, {"name": "kvcal-scratch", "mountPath": SCRATCH_MOUNT}],
    }


def build_calibration_job(owner: Owner, spec: KVCalibrationSpec, spec_hash: str) -> Manifest:
    """Runs `python -m kvcal.calibrator --config FILE`; its summary JSON is the container's termination message."""
    model, dataset, output = _locations(spec)
    name = calibration_job_name(owner.name, spec_hash)
    config = {"name": "kvcal-config", "configMap": {"name": name}}
    volumes, mounts = volumes_and_mounts([(model, False), (dataset, False), (output, True)])
    job = spec.calibration.job
    command = [
        "python",
        "-m",
        "kvcal.calibrator",
        "--config",
        f"{CONFIG_MOUNT}/{CONFIG_KEY}",
        "--termination-log",
        TERMINATION_MESSAGE_PATH,
    ]
    container = _container(
        "calibrator",
        job.image or DEFAULT_CALIBRATOR_IMAGE,
        command,
        [*mounts, {"name": "kvcal-config", "mountPath": CONFIG_MOUNT, "readOnly": True}],
        job.resources.to_wire() if job.resources else DEFAULT_CALIBRATION_RESOURCES,
    )
    scheduling: Manifest = {}
    if job.node_selector:
        scheduling["nodeSelector"] = job.node_selector
    if job.tolerations:
        scheduling["tolerations"] = [toleration.to_wire() for toleration in job.tolerations]
    return _job(
        owner,
        name,
        "calibration",
        spec_hash,
        container,
        [*volumes, config],
        deadline=job.active_deadline_seconds,
        backoff=job.backoff_limit,
        scheduling=scheduling,
    )


def build_verification_job(
    owner: Owner,
    spec: KVCalibrationSpec,
    spec_hash: str,
    baseline_container: Manifest,
    baseline_pod: Manifest,
    name: str | None = None,
) -> Manifest:
    """Runs `kvcal verify CHECKPOINT --runtime` in the canary's (= the baseline's) vLLM image on the same hardware:
    same resources, node selector and tolerations as the baseline pod. `name`: after a promotion, the re-verification
    in the baseline's new image (default: the verification before the canary)."""
    checkpoint = checkpoint_location(spec)
    volumes, mounts = volumes_and_mounts([(checkpoint, False)])
    command = [
        "kvcal",
        "verify",
        checkpoint.path,
        "--runtime",
        "--kv-cache-dtype",
        spec.serving.canary.kv_cache_dtype,
        "--json",
        "--termination-log",
        TERMINATION_MESSAGE_PATH,
    ]
    if spec.serving.canary.attention_backend:
        command += ["--attention-backend", spec.serving.canary.attention_backend]
    if spec.calibration.query_scales:
        command += ["--query-scales"]
    command += skip_layer_args(spec)
    container = _container(
        "verify",
        str(baseline_container["image"]),
        command,
        mounts,
        dict(baseline_container.get("resources") or {}),
    )
    scheduling = {k: baseline_pod[k] for k in ("nodeSelector", "tolerations", "affinity") if baseline_pod.get(k)}
    return _job(
        owner,
        name or verification_job_name(owner.name, spec_hash),
        "verification",
        spec_hash,
        container,
        volumes,
        deadline=1800,
        backoff=0,
        scheduling=scheduling,
    )
