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
from kvcal.core.manifests.protected import skip_layer_args
from kvcal.models.spec import KVCalibrationSpec
from kvcal.vllm_flags import Flag, denotes

CONFIG_MOUNT = "/kvcal/config"
CONFIG_KEY = "config.json"
# Caches (HF, torch, vLLM) go to an emptyDir: the image's home may not be writable for a non-root user.
SCRATCH_MOUNT = "/tmp"
DEADLINE_ENV = "KVCAL_DEADLINE_SECONDS"  # read by kvcal.calibrator.cli
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
    optional = {
        "maxModelLen": max_model_len,
        "queryScales": True if cal.query_scales else None,
        "modelRevision": spec.model.revision,
    }
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
    # Preflight refuses a calibration estimated to outlast the Job (an env var: older calibrator images ignore it,
    # where an unknown config key would fail them).
    container["env"].append({"name": DEADLINE_ENV, "value": str(job.active_deadline_seconds)})
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


# The verifier is delivered, not installed: an init container writes kvcal's verifier bundle (kvcal.verify.bundle)
# into this emptyDir and the baseline's own vLLM image runs it with its own python3, so a stock vllm/vllm-openai works.
VERIFIER_MOUNT = "/kvcal-verifier"
VERIFIER_BUNDLE = f"{VERIFIER_MOUNT}/kvcal-verifier.pyz"  # kvcal.verify.bundle.BUNDLE_NAME
VERIFIER_BUNDLE_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "100m", "memory": "64Mi"},
    "limits": {"memory": "256Mi"},
}
# The verification Job's run time: loading the checkpoint in vLLM and reading back its scales (core.artifact.waiting
# gives back any time its pod waits for a Node).
VERIFICATION_DEADLINE_SECONDS = 1800
# vLLM's workers talk through shared memory (NCCL, the engine's message queues): more than the runtime's 64 MiB.
SHARED_MEMORY_LIMIT = "2Gi"
TENSOR_PARALLEL_SIZE = Flag(("--tensor-parallel-size", "-tp"), "read only: the verification runs at the baseline's")


def baseline_tensor_parallel_size(container: Manifest) -> int:
    """The baseline vLLM container's `--tensor-parallel-size`/`-tp` (last occurrence wins); 1 when absent, or a
    value vLLM itself would refuse (then the baseline serves nothing to compare with). Its pipeline-parallel size is
    not copied: that places whole layers on different GPUs and changes no layer's scales, where TP slices every
    layer's per-head scales across the ranks."""
    args = [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
    for index in reversed(range(len(args))):
        if not denotes(args[index], TENSOR_PARALLEL_SIZE):
            continue
        written = args[index].strip()
        if "=" in written:
            value = written.split("=", 1)[1]
        elif written.startswith("-tp") and len(written) > len("-tp"):
            value = written[len("-tp") :]  # argparse's attached short-option value: -tp4
        else:
            value = args[index + 1] if index + 1 < len(args) else ""
        return int(value) if value.strip().isdigit() and int(value) > 0 else 1
    return 1


def _verifier_bundle_container(image: str) -> Manifest:
    """Writes the verifier bundle into the shared emptyDir and exits. `image` is the calibration Job's (the chart's
    jobImages.calibrator, or spec.calibration.job.image where the policy allows it): the one image the chart already
    configures for Jobs that has kvcal installed, and the kvcal that calibrated this checkpoint (the operator's own
    image has kvcal too, but the operator does not know its image's name)."""
    return {
        "name": "verifier-bundle",
        "image": image,
        "command": ["python", "-m", "kvcal.verify.bundle", VERIFIER_MOUNT],
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "resources": VERIFIER_BUNDLE_RESOURCES,
        "securityContext": {**container_security_context(), "readOnlyRootFilesystem": True},
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "kvcal-verifier", "mountPath": VERIFIER_MOUNT}],
    }


def build_verification_job(
    owner: Owner,
    spec: KVCalibrationSpec,
    spec_hash: str,
    baseline_container: Manifest,
    baseline_pod: Manifest,
    name: str | None = None,
) -> Manifest:
    """Runs the verifier (`kvcal verify CHECKPOINT --runtime`, as a bundle) in the canary's (= the baseline's) vLLM
    image, unchanged, on the same hardware: same resources, node selector and tolerations as the baseline pod, and
    its tensor-parallel size, so every worker's scales are read back as the baseline's ranks load them. `name`: after
    a promotion, the re-verification in the baseline's new image (default: the verification before the canary)."""
    checkpoint = checkpoint_location(spec)
    volumes, mounts = volumes_and_mounts([(checkpoint, False)])
    tensor_parallel_size = baseline_tensor_parallel_size(baseline_container)
    command = [
        "python3",  # the image's own: the one its vLLM is installed for
        VERIFIER_BUNDLE,
        checkpoint.path,
        "--runtime",
        "--kv-cache-dtype",
        spec.serving.canary.kv_cache_dtype,
        "--tensor-parallel-size",
        str(tensor_parallel_size),
        "--json",
        "--termination-log",
        TERMINATION_MESSAGE_PATH,
    ]
    if spec.serving.canary.attention_backend:
        command += ["--attention-backend", spec.serving.canary.attention_backend]
    if spec.calibration.query_scales:
        command += ["--query-scales"]
    command += skip_layer_args(spec)
    volumes.append({"name": "kvcal-verifier", "emptyDir": {}})
    mounts.append({"name": "kvcal-verifier", "mountPath": VERIFIER_MOUNT, "readOnly": True})
    if tensor_parallel_size > 1:
        volumes.append({"name": "kvcal-shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHARED_MEMORY_LIMIT}})
        mounts.append({"name": "kvcal-shm", "mountPath": "/dev/shm"})
    container = _container(
        "verify",
        str(baseline_container["image"]),
        command,
        mounts,
        dict(baseline_container.get("resources") or {}),
    )
    # vLLM's worker processes unpickle the read-back function by reference: they import it from the bundle too.
    container["env"].append({"name": "PYTHONPATH", "value": VERIFIER_BUNDLE})
    scheduling = {k: baseline_pod[k] for k in ("nodeSelector", "tolerations", "affinity") if baseline_pod.get(k)}
    job = _job(
        owner,
        name or verification_job_name(owner.name, spec_hash),
        "verification",
        spec_hash,
        container,
        volumes,
        deadline=VERIFICATION_DEADLINE_SECONDS,
        backoff=0,
        scheduling=scheduling,
    )
    pod = job["spec"]["template"]["spec"]
    init = [_verifier_bundle_container(spec.calibration.job.image or DEFAULT_CALIBRATOR_IMAGE)]
    job["spec"]["template"]["spec"] = {
        **{k: v for k, v in pod.items() if k not in ("containers", "volumes")},
        "initContainers": init,
        "containers": pod["containers"],
        "volumes": pod["volumes"],
    }
    return job
