"""The torch and vLLM images (make test-images): each built from its Dockerfile and run as its workload runs.

- calibrator: the calibration Job the operator builds (build_calibration_job + its ConfigMap), run in the image by
  tests.support.oci.run_job_pod: the demo model on a read-only mount, the output where the Job writes it, and a
  termination message the operator's own parser accepts.
- verifier: the verification Job the operator builds on that checkpoint: the calibrator image's init container
  writes the verifier bundle, the stock vllm/vllm-openai image (the harness's stand-in) runs it.
- vllm-cpu: `vllm serve` of that checkpoint with an FP8 KV cache, answering /v1/completions and /metrics.
"""

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvcal.core.artifact.verification import verification_result
from kvcal.core.manifests import (
    Owner,
    build_calibration_configmap,
    build_calibration_job,
    build_verification_job,
)
from kvcal.core.observations import JobState
from kvcal.core.spechash import spec_hash
from kvcal.devenv.images import IMAGES
from kvcal.local import free_port
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import CALIBRATION_SUMMARY_FIELDS, CalibrationStatus
from tests.support.oci import Podman, PodRun, harness, run_job_pod
from tests.support.prometheus import wait_until

# A cold build of these images alone takes 15-30 min on 2 cores: longer than the suite's per-test timeout.
pytestmark = [
    pytest.mark.images,
    pytest.mark.heavy_images,
    pytest.mark.model,
    pytest.mark.slow,
    pytest.mark.timeout(5400),
]
OWNER = Owner("smollm2", "llm", "0a1b2c3d-0000-4000-8000-000000000001")
PROMPTS = Path(__file__).resolve().parents[2] / "operator" / "kvcal" / "data" / "calibration.jsonl"
JOB_TIMEOUT = 1200.0  # the calibrator on 2 shared cores, or vLLM's start-up and read-back


def demo_spec(calibrator_image: str) -> KVCalibrationSpec:
    """The smallest calibration that still scores a holdout; the PVC `models` holds the model and the output."""
    return KVCalibrationSpec.model_validate(
        {
            "model": {"source": "pvc://models/smollm2"},
            "calibration": {
                "dataset": {"source": "configmap://calib/prompts.jsonl"},
                "samples": 6,
                "maxSeqLength": 128,
                "holdoutFraction": 0.25,
                "output": "pvc://models/smollm2-fp8kv",
                "job": {"image": calibrator_image},
            },
            "serving": {"baseline": {"deployment": "llm", "service": "llm"}},
        }
    )


@pytest.fixture(scope="module")
def models_pvc(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The PVC `models`: smollm2/ (the BF16 demo model) and, once calibrated, smollm2-fp8kv/ written by 65532."""
    pvc = tmp_path_factory.mktemp("pvc-models")
    pvc.chmod(0o777)  # the volume's fsGroup: the Job's user 65532 creates the output folder here
    (pvc / "smollm2").symlink_to(demo_model_dir)  # kubelet-style subPath; podman binds the target
    return pvc


@pytest.fixture(scope="module")
def calibration(podman: Podman, models_pvc: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodRun]:
    podman.build("calibrator")
    spec = demo_spec(IMAGES["calibrator"].tag)
    digest = spec_hash(spec)
    job, configmap = build_calibration_job(OWNER, spec, digest), build_calibration_configmap(OWNER, spec, digest)
    work = tmp_path_factory.mktemp("calibration-pod")
    config, dataset = work / "config", work / "calib"
    config.mkdir(), dataset.mkdir()
    for name, text in configmap["data"].items():
        (config / name).write_text(text)
    (dataset / "prompts.jsonl").write_text("\n".join(PROMPTS.read_text().splitlines()[:12]) + "\n")
    volumes = {"kvcal-pvc-models": models_pvc, "kvcal-cm-calib": dataset, "kvcal-config": config}
    yield run_job_pod(podman, job, volumes, work, JOB_TIMEOUT)


def test_calibrator_image_runs_the_calibration_job(calibration: PodRun, models_pvc: Path) -> None:
    assert calibration.exit_code == 0, calibration.logs[-4000:]
    summary = json.loads(calibration.termination_message)
    # The operator's reading of the termination message (core/artifact/machine.py, Calibrating -> Verifying).
    status = CalibrationStatus.model_validate({k: v for k, v in summary.items() if k in CALIBRATION_SUMMARY_FIELDS})
    assert status.samples and status.k_scale_max and status.v_scale_max
    checkpoint = models_pvc / "smollm2-fp8kv"
    assert (checkpoint / "kvcal-report.json").is_file() and list(checkpoint.glob("*.safetensors"))
    assert (checkpoint / "kvcal-report.json").stat().st_uid == 65532, "written by the Job's non-root user"


def test_stock_vllm_image_reads_back_the_scales_with_the_bundle(
    podman: Podman, calibration: PodRun, models_pvc: Path, fp8_vllm: None, tmp_path: Path
) -> None:
    assert calibration.exit_code == 0, "needs the calibrator image's checkpoint"
    podman.build("vllm-cpu")
    harness("vllm-openai")  # the stand-in for the stock vllm/vllm-openai:v0.32.0; the verifier image is not built
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('kvcal') is not None)"
    no_kvcal = podman("run", "--rm", "--entrypoint", "python3", "docker.io/vllm/vllm-openai:v0.32.0", "-c", probe,
                      check=False, timeout=300)  # fmt: skip
    assert no_kvcal.returncode == 0, f"the stock image's stand-in must not contain kvcal: {no_kvcal.stderr[-2000:]}"
    spec = demo_spec(IMAGES["calibrator"].tag)
    baseline_container: dict[str, Any] = {"name": "vllm", "image": "vllm/vllm-openai:v0.32.0"}
    job = build_verification_job(OWNER, spec, spec_hash(spec), baseline_container, {"containers": [baseline_container]})
    run = run_job_pod(podman, job, {"kvcal-pvc-models": models_pvc}, tmp_path, JOB_TIMEOUT)
    verification, ok = verification_result(
        JobState("verify", "Succeeded" if run.exit_code == 0 else "Failed", run.termination_message)
    )
    assert ok, f"{verification}\n{run.logs[-4000:]}"
    assert verification.layers == 30 and verification.mismatches == 0


def http(url: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except OSError:
        return 0, ""


def test_vllm_cpu_image_serves_with_an_fp8_kv_cache(
    podman: Podman, calibration: PodRun, models_pvc: Path, fp8_vllm: None
) -> None:
    assert calibration.exit_code == 0, "needs the calibrator image's checkpoint"
    podman.build("vllm-cpu")
    port = free_port()
    # As docs/local-trial/smollm2.yaml runs it (user 65532, the model on a volume, a 1 GiB /dev/shm: vLLM's engine
    # queue needs 160 MiB, the runtime's default is 64 MiB), with the canary's FP8 KV flag; --enforce-eager skips
    # torch.compile's minutes of warm-up on 2 cores.
    args = ["/models/smollm2-fp8kv", "--served-model-name", "smollm2", "--dtype", "bfloat16", "--max-model-len", "512"]
    args += ["--kv-cache-dtype", "fp8", "--host", "127.0.0.1", "--port", str(port), "--enforce-eager"]
    server = podman.run(
        IMAGES["vllm-cpu"].tag,
        args,
        mounts=[(models_pvc / "smollm2-fp8kv", "/models/smollm2-fp8kv", "ro")],
        read_only=False,
        network_host=True,
        extra=["--shm-size", "1g"],
    )
    try:
        wait_until(lambda: http(f"http://127.0.0.1:{port}/health")[0] == 200, 900, "vllm-cpu image /health")
        status, text = http(
            f"http://127.0.0.1:{port}/v1/completions",
            {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
        )
        assert status == 200 and json.loads(text)["choices"][0]["text"], text
        status, metrics = http(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and "vllm:time_to_first_token_seconds" in metrics
        assert "Using fp8 data type to store kv cache" in server.logs()  # vLLM allocated an FP8 KV cache
    finally:
        server.remove()
