"""build_* against golden YAML (UPDATE_GOLDEN=1 rewrites tests/golden/), plus the rules every child must follow."""

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal.core.manifests import (
    BaselineError,
    Owner,
    build_calibration_configmap,
    build_calibration_job,
    build_canary_service,
    build_canary_workload,
    build_promoted_baseline,
    build_verification_job,
    calibration_job_name,
    canary_name,
    verification_job_name,
)
from kvcal.core.manifests.canary import fp8_container, fp8_pod_spec
from kvcal.core.manifests.jobs import baseline_tensor_parallel_size
from kvcal.core.manifests.pool import build_canary_picker, build_canary_picker_service, build_canary_pool
from kvcal.core.spechash import spec_hash
from tests.support.decide import OWNER, baseline_manifest, baseline_service, spec, statefulset_manifest
from tests.support.pool import POOL_SPEC, baseline_pool, picker, picker_service

GOLDEN = Path(__file__).resolve().parents[3] / "golden"
SPEC = spec()
H = spec_hash(SPEC)
HOSTPATH_SPEC = spec(
    model={"source": "hostpath:///srv/models/smollm2"},
    calibration={
        "dataset": {"source": "hostpath:///srv/data/calib.jsonl", "format": "text"},
        "output": "hostpath:///srv/models/smollm2-fp8kv",
        "strategy": "head",
    },
    serving={
        "baseline": {"deployment": "llm", "service": "llm", "container": "vllm"},
        "canary": {"attentionBackend": "FLASH_ATTN", "extraArgs": ["--enforce-eager"]},
    },
)

STATEFULSET_SPEC = spec(serving={"baseline": {"deployment": "llm", "service": "llm", "kind": "StatefulSet"}})
PROTECTED_SPEC = spec(
    calibration={**SPEC.calibration.model_dump(by_alias=True), "queryScales": True},
    serving={"baseline": {"deployment": "llm", "service": "llm"}, "canary": {"protectedLayers": {"layers": [0, 29]}}},
)


GATEWAY_SPEC = spec(
    serving={**SPEC.serving.model_dump(by_alias=True), "traffic": {"router": "gateway-api", "httpRoute": "llm"}}
)
NONE_STATEFULSET_SPEC = spec(
    serving={"baseline": {"deployment": "llm", "service": "llm", "kind": "StatefulSet"}, "traffic": {"router": "none"}}
)


def _labelled_baseline() -> dict[str, Any]:
    """A baseline whose pods carry a label beside the Service's selector (kept on the canary under every router)."""
    b = baseline_manifest(2)
    b["spec"]["selector"]["matchLabels"]["model"] = "smollm2"
    b["spec"]["template"]["metadata"]["labels"]["model"] = "smollm2"
    return b


def _serve_style_baseline() -> dict[str, Any]:
    b = baseline_manifest(1)
    c = b["spec"]["template"]["spec"]["containers"][0]
    c["command"] = ["vllm", "serve"]
    c["args"] = ["/models/smollm2", "--calculate-kv-scales", "--kv-cache-dtype=fp8", "--tensor-parallel-size", "2"]
    b["spec"]["template"]["spec"]["containers"].insert(0, {"name": "sidecar", "image": "busybox"})
    return b


def _tensor_parallel_baseline() -> dict[str, Any]:
    """A baseline serving on 4 GPUs (-tp 4), with its model's tag pinned by the user."""
    b = baseline_manifest(1)
    c = b["spec"]["template"]["spec"]["containers"][0]
    c["args"] = [*c["args"], "-tp", "4"]
    c["resources"] = {"limits": {"nvidia.com/gpu": "4"}}
    return b


CASES: dict[str, Any] = {
    "canary-inference-pool": lambda: build_canary_pool(OWNER, baseline_pool()),
    "canary-picker-deployment": lambda: build_canary_picker(OWNER, picker()),
    "canary-picker-service": lambda: build_canary_picker_service(OWNER, picker_service()),
    "canary-deployment-inference-pool": lambda: build_canary_workload(
        OWNER, POOL_SPEC, baseline_manifest(), 1, baseline_service(), frozenset({"tier"})
    ),
    "calibration-configmap": lambda: build_calibration_configmap(OWNER, SPEC, H),
    "calibration-job": lambda: build_calibration_job(OWNER, SPEC, H),
    "calibration-job-hostpath": lambda: build_calibration_job(OWNER, HOSTPATH_SPEC, spec_hash(HOSTPATH_SPEC)),
    "verification-job": lambda: build_verification_job(
        OWNER,
        SPEC,
        H,
        baseline_manifest()["spec"]["template"]["spec"]["containers"][0],
        baseline_manifest()["spec"]["template"]["spec"],
    ),
    "canary-deployment": lambda: build_canary_workload(OWNER, SPEC, baseline_manifest(), 2),
    "canary-deployment-serve-style": lambda: build_canary_workload(OWNER, HOSTPATH_SPEC, _serve_style_baseline(), 1),
    "canary-deployment-gateway-api": lambda: build_canary_workload(
        OWNER, GATEWAY_SPEC, _labelled_baseline(), 1, baseline_service()
    ),
    "canary-statefulset-router-none": lambda: build_canary_workload(
        OWNER, NONE_STATEFULSET_SPEC, statefulset_manifest(), 1, baseline_service()
    ),
    "canary-service": lambda: build_canary_service(OWNER, baseline_service()),
    "promoted-baseline-patch": lambda: build_promoted_baseline(OWNER, SPEC, H, baseline_manifest()),
    "canary-deployment-protected": lambda: build_canary_workload(OWNER, PROTECTED_SPEC, baseline_manifest(), 1),
    "verification-job-query-protected": lambda: build_verification_job(
        OWNER,
        PROTECTED_SPEC,
        spec_hash(PROTECTED_SPEC),
        baseline_manifest()["spec"]["template"]["spec"]["containers"][0],
        baseline_manifest()["spec"]["template"]["spec"],
    ),
    "verification-job-tensor-parallel": lambda: build_verification_job(
        OWNER,
        SPEC,
        H,
        _tensor_parallel_baseline()["spec"]["template"]["spec"]["containers"][0],
        _tensor_parallel_baseline()["spec"]["template"]["spec"],
    ),
    "calibration-configmap-query": lambda: build_calibration_configmap(
        OWNER, PROTECTED_SPEC, spec_hash(PROTECTED_SPEC)
    ),
    "canary-statefulset": lambda: build_canary_workload(OWNER, STATEFULSET_SPEC, statefulset_manifest(), 1),
    "promoted-statefulset-patch": lambda: build_promoted_baseline(
        OWNER, STATEFULSET_SPEC, spec_hash(STATEFULSET_SPEC), statefulset_manifest()
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    manifest = CASES[name]()
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(manifest, sort_keys=False, width=120))
    assert path.exists(), f"{path} missing: run with UPDATE_GOLDEN=1 and review the diff"
    assert manifest == yaml.safe_load(path.read_text()), f"{name} differs from {path} (UPDATE_GOLDEN=1 to accept)"


CHILDREN = [n for n in CASES if not n.startswith("promoted-")]


@pytest.mark.parametrize("name", CHILDREN)
def test_children_are_owned_and_labelled(name: str) -> None:
    manifest = CASES[name]()
    meta = manifest["metadata"]
    assert meta["namespace"] == OWNER.namespace
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "kvcal.dev/v1alpha1",
            "kind": "KVCalibration",
            "name": OWNER.name,
            "uid": OWNER.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "kvcal"
    assert meta["labels"]["kvcal.dev/calibration"] == OWNER.name


@pytest.mark.parametrize(
    "name", ["calibration-job", "calibration-job-hostpath", "verification-job", "verification-job-tensor-parallel"]
)
def test_jobs_run_as_non_root_and_report_through_the_termination_message(name: str) -> None:
    job = CASES[name]()
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    (container,) = pod["containers"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["command"][container["command"].index("--termination-log") + 1] == "/dev/termination-log"
    mounted = {m["name"] for m in container["volumeMounts"]}
    assert mounted == {v["name"] for v in pod["volumes"]}


def test_configmap_is_a_valid_calibrator_config() -> None:
    from kvcal.calibrator.config import CalibrationConfig

    cm = build_calibration_configmap(OWNER, SPEC, H)
    config = CalibrationConfig.model_validate_json(cm["data"]["config.json"])
    assert str(config.model_dir) == "/kvcal/pvc/models/smollm2"
    assert str(config.data) == "/kvcal/configmap/calib/prompts.jsonl"
    assert str(config.out) == "/kvcal/pvc/models/smollm2-fp8kv"
    assert (config.samples, config.max_seq_length, config.observer) == (64, 512, "static-minmax")


def test_calibration_job_uses_spec_scheduling_and_gpu() -> None:
    job = build_calibration_job(OWNER, SPEC, H)
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["activeDeadlineSeconds"] == 1800 and job["spec"]["backoffLimit"] == 0
    assert pod["nodeSelector"] == {"gpu": "h100"} and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def test_model_stays_read_only_when_it_shares_the_output_claim() -> None:
    """Issue #10 item 3: model and output on one claim; the claim is mounted once per use, the model read-only."""
    job = build_calibration_job(OWNER, SPEC, H)
    mounts = {m["mountPath"]: m for m in job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    model, output = mounts["/kvcal/pvc/models/smollm2"], mounts["/kvcal/pvc/models/smollm2-fp8kv"]
    assert model["name"] == output["name"] == "kvcal-pvc-models"
    assert model["subPath"] == "smollm2" and model["readOnly"] is True
    assert output["subPath"] == "smollm2-fp8kv" and output["readOnly"] is False
    assert "/kvcal/pvc/models" not in mounts  # no read-write mount of the whole claim
    config = json.loads(build_calibration_configmap(OWNER, SPEC, H)["data"]["config.json"])
    assert config["modelDir"] == model["mountPath"] and config["out"] == output["mountPath"]


@pytest.mark.parametrize("name", ["verification-job", "verification-job-tensor-parallel"])
def test_verification_job_has_a_read_only_root_filesystem(name: str) -> None:
    """Both containers non-root with a read-only root: the init container writes only the bundle's emptyDir, the
    verifier only /tmp (and /dev/shm, vLLM's shared memory between TP workers); the bundle is read-only to it."""
    pod = CASES[name]()["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (verifier,) = pod["containers"]
    scratch = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    for container in (init, verifier):
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert [(m["mountPath"], m.get("readOnly", False)) for m in init["volumeMounts"]] == [("/kvcal-verifier", False)]
    writable = {m["mountPath"] for m in verifier["volumeMounts"] if m["name"] in scratch and not m.get("readOnly")}
    assert writable == ({"/tmp", "/dev/shm"} if name.endswith("parallel") else {"/tmp"})
    assert {m["mountPath"] for m in verifier["volumeMounts"] if m.get("readOnly")} >= {"/kvcal-verifier"}


def test_verification_runs_the_bundle_in_the_baseline_image_unchanged() -> None:
    """Issue 21: a stock vllm/vllm-openai image verifies: the calibrator image writes the bundle, the baseline's
    image runs it with its own python3, at the baseline's tensor-parallel size, the bundle on PYTHONPATH."""
    pod = CASES["verification-job-tensor-parallel"]()["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (verifier,) = pod["containers"]
    assert init["image"] == SPEC.calibration.job.image == "ghcr.io/kvcal/calibrator:test"  # the calibration Job's
    assert init["command"] == ["python", "-m", "kvcal.verify.bundle", "/kvcal-verifier"]
    assert verifier["image"] == "vllm/vllm-openai:v0.32.0"
    command = verifier["command"]
    assert command[:3] == ["python3", "/kvcal-verifier/kvcal-verifier.pyz", "/kvcal/pvc/models/smollm2-fp8kv"]
    assert command[command.index("--tensor-parallel-size") + 1] == "4"
    assert {"name": "PYTHONPATH", "value": "/kvcal-verifier/kvcal-verifier.pyz"} in verifier["env"]
    assert verifier["resources"] == {"limits": {"nvidia.com/gpu": "4"}}
    single = CASES["verification-job"]()["spec"]["template"]["spec"]["containers"][0]["command"]
    assert single[single.index("--tensor-parallel-size") + 1] == "1"


@pytest.mark.parametrize(
    ("args", "size"),
    [
        ([], 1),
        (["--tensor-parallel-size", "8"], 8),
        (["--tensor-parallel-size=2"], 2),
        (["--tensor_parallel_size", "2"], 2),  # vLLM reads _ as -
        (["-tp", "4"], 4),
        (["-tp4"], 4),  # argparse's attached short value
        (["-tp", "2", "--tensor-parallel-size", "4"], 4),  # the last one wins
        (["--pipeline-parallel-size", "2"], 1),
        (["-tp", "two"], 1),  # vLLM refuses it: nothing is served at any size
    ],
)
def test_baseline_tensor_parallel_size(args: list[str], size: int) -> None:
    assert baseline_tensor_parallel_size({"command": ["vllm", "serve", "/models/m"], "args": args}) == size


def test_names_are_deterministic_and_fit_a_label() -> None:
    assert calibration_job_name("smollm2", H) == f"smollm2-calib-{H[:8]}"
    assert verification_job_name("smollm2", H) == f"smollm2-verify-{H[:8]}"
    assert canary_name("smollm2") == "smollm2-canary"
    long = "a" * 200
    names = {calibration_job_name(long, H), verification_job_name(long, H), canary_name(long)}
    assert all(len(n) <= 63 for n in names) and len(names) == 3
    assert calibration_job_name(long, H) != calibration_job_name(long[:-1] + "b", H)


def test_canary_runs_the_checkpoint_with_fp8_kv() -> None:
    canary = build_canary_workload(OWNER, SPEC, baseline_manifest(), 2)
    args = canary["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--model") + 1] == "/kvcal/pvc/models/smollm2-fp8kv"
    assert args[args.index("--served-model-name") + 1] == "/models/smollm2"  # clients keep their model name
    assert args.count("--kv-cache-dtype") == 1 and args[args.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    labels = canary["spec"]["template"]["metadata"]["labels"]
    assert labels["app"] == "llm" and labels["role"] == "canary"  # still behind the baseline Service
    assert canary["spec"]["selector"]["matchLabels"]["role"] == "canary"
    assert canary["spec"]["replicas"] == 2


def test_serve_style_baseline_keeps_other_flags_and_drops_kv_overrides() -> None:
    canary = build_canary_workload(OWNER, HOSTPATH_SPEC, _serve_style_baseline(), 1)
    sidecar, vllm = canary["spec"]["template"]["spec"]["containers"]
    assert sidecar == {"name": "sidecar", "image": "busybox"}
    assert vllm["args"][0] == "/kvcal/host/" + vllm["args"][0].rsplit("/", 1)[1]
    assert "--calculate-kv-scales" not in vllm["args"] and "--kv-cache-dtype=fp8" not in vllm["args"]
    assert vllm["args"][vllm["args"].index("--tensor-parallel-size") + 1] == "2"
    assert vllm["args"][-4:] == ["fp8_e4m3", "--attention-backend", "FLASH_ATTN", "--enforce-eager"]


def test_model_argument_must_be_found() -> None:
    container = {"name": "vllm", "image": "x", "args": ["--port", "8000"]}
    with pytest.raises(BaselineError, match="--model PATH"):
        fp8_container(container, SPEC, "/ckpt", [])


def test_unknown_container_is_named() -> None:
    bad = spec(serving={"baseline": {"deployment": "llm", "service": "llm", "container": "server"}})
    with pytest.raises(BaselineError, match=r"no container 'server'.*vllm"):
        build_canary_workload(OWNER, bad, baseline_manifest(), 1)


def test_promotion_never_drops_below_ready_replicas_and_is_idempotent() -> None:
    applied = build_promoted_baseline(OWNER, SPEC, H, baseline_manifest())
    assert applied["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    promoted = baseline_manifest()
    promoted["spec"]["template"]["spec"] = fp8_pod_spec(promoted, SPEC)  # the API server's merge of `applied`
    # Applied again from the promoted baseline it names the same fields: the checkpoint's volume stays kvcal's.
    assert build_promoted_baseline(OWNER, SPEC, H, promoted) == applied
    assert "ownerReferences" not in applied["metadata"]  # the baseline is never owned (deleting us keeps it)


@pytest.mark.parametrize(
    "strategy",
    [
        {"type": "Recreate"},
        {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
        {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "0%", "maxUnavailable": "25%"}},
    ],
    ids=["recreate", "surge-0", "surge-0-percent"],
)
def test_promotion_keeps_a_baseline_strategy_without_room_to_surge(strategy: dict[str, Any]) -> None:
    """Where GPUs are tight the owner rolls without surge (or recreates): the promotion names no strategy, so the
    baseline rolls as it always does (maxUnavailable 0 beside maxSurge 0 is refused by the API server)."""
    baseline = baseline_manifest()
    baseline["spec"]["strategy"] = strategy
    applied = build_promoted_baseline(OWNER, SPEC, H, baseline)
    assert "strategy" not in applied["spec"] and applied["spec"]["template"]["spec"]["containers"]


def test_promotion_keeps_the_baselines_surge_when_it_has_one() -> None:
    baseline = baseline_manifest()
    baseline["spec"]["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "50%", "maxUnavailable": 2}}
    applied = build_promoted_baseline(OWNER, SPEC, H, baseline)
    assert applied["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "50%"},
    }


def test_promotion_names_only_the_fields_kvcal_owns() -> None:
    """Server-side apply makes every named field kvcal's: the image, ports, resources and the baseline's own volumes
    stay with their owner (Git), so Argo CD's managedFieldsManagers: [kvcal] ignores nothing else."""
    applied = build_promoted_baseline(OWNER, SPEC, H, baseline_manifest())
    assert (applied["apiVersion"], applied["kind"], applied["metadata"]["name"]) == ("apps/v1", "Deployment", "llm")
    pod = applied["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert set(container) == {"name", "args", "volumeMounts", "securityContext"}
    assert [v["name"] for v in pod["volumes"]] == [m["name"] for m in container["volumeMounts"]] == ["kvcal-pvc-models"]
    assert set(applied["spec"]) == {"strategy", "template"} and set(applied["spec"]["template"]) == {"spec"}


def test_owner_reference_points_at_the_kvcalibration() -> None:
    other = Owner("x", "ns", "uid-1")
    job = build_calibration_job(other, SPEC, H)
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert job["metadata"]["namespace"] == "ns"


def test_canary_gets_a_hardened_security_context_where_the_baseline_has_none() -> None:
    pod = build_canary_workload(OWNER, SPEC, baseline_manifest(), 1)["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    vllm = pod["containers"][0]["securityContext"]
    assert vllm == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    own = baseline_manifest()
    own_pod = own["spec"]["template"]["spec"]
    own_pod["securityContext"] = {"runAsUser": 1000, "runAsNonRoot": True}
    own_pod["containers"][0]["securityContext"] = {"readOnlyRootFilesystem": True}
    pod = build_canary_workload(OWNER, SPEC, own, 1)["spec"]["template"]["spec"]
    assert pod["securityContext"] == own_pod["securityContext"]  # the baseline's own choice is kept
    assert pod["containers"][0]["securityContext"] == {"readOnlyRootFilesystem": True}


def test_the_git_patch_is_the_promotion_without_a_namespace() -> None:
    from kvcal.core.manifests.promotion import promotion_patch
    from kvcal.gitpatch import render

    applied = build_promoted_baseline(OWNER, SPEC, H, baseline_manifest())
    patch = promotion_patch(applied)
    assert "namespace" not in patch["metadata"] and patch["spec"] == applied["spec"]
    assert patch["metadata"]["annotations"] == applied["metadata"]["annotations"]  # the marker kvcal waits for
    text = render(patch)
    assert "#   container vllm args: --model /kvcal/pvc/models/smollm2-fp8kv" in text
    assert yaml.safe_load(text) == patch
