"""Issue #10 items 4 and 6 on the real control plane: upgrading the operator never re-runs finished work, a
recalibration never writes into what the baseline serves, a new vLLM image after a promotion is re-verified, and a
baseline scaled to 0 shows up where users look.

The operator runs as in test_lifecycle (the chart's RBAC, the fake kubelet). A calibration is started by the operator
itself (its Job held, so no model is needed); a finished lifecycle is then written into the status the way the
operator writes it (and the baseline promoted with the operator's own patch builder), which stands for the ~10 minutes
of real calibration test_lifecycle already proves.
"""

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kvcal.cli import main as kvcal_cli
from kvcal.core.manifests import FIELD_MANAGER, Owner, build_promoted_baseline
from kvcal.core.spechash import spec_hash
from kvcal.models.spec import KVCalibrationSpec
from tests.support.cluster import wait_for
from tests.support.world import World, baseline, condition, dataset_configmap, kvcalibration

pytestmark = pytest.mark.cluster
OLD_IMAGE, NEW_IMAGE = "ghcr.io/kvcal/kvcal-calibrator:0.1.0", "ghcr.io/kvcal/kvcal-calibrator:0.2.0"


def reconciles_ok(w: World) -> int:
    url = f"http://127.0.0.1:{w.operator.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    found = re.search(r'^kvcal_reconciles_total\{result="ok"\} (\S+)', text, re.M)
    return int(float(found.group(1))) if found else 0


def metric(w: World, sample: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{w.operator.metrics_port}/metrics", timeout=5).read().decode()
    found = re.search(r"^" + re.escape(sample) + r" (\S+)", text, re.M)
    return float(found.group(1)) if found else 0.0


def write_status(w: World, name: str, status: dict[str, Any]) -> None:
    obj = w.kvcal(name)
    w.kube.replace_status(w.namespace, name, obj["metadata"]["resourceVersion"], status)


def succeeded_under_old_operator(w: World, name: str, model: Path) -> tuple[str, dict[str, Any]]:
    """A calibration started by the operator with OLD_IMAGE as its default, then finished and promoted; the
    operator is left stopped. Returns the calibration Job's name and the KVCalibration."""
    model.mkdir(exist_ok=True)
    for m in [*baseline(model, replicas=1), dataset_configmap()]:
        w.apply(m)
    w.kubelet.hold("calibration")
    w.operator.calibrator_image = OLD_IMAGE
    w.operator.restart()
    w.apply(kvcalibration(name, model, w.out))
    obj = w.wait_phase(name, "Calibrating", 60)
    job_name = obj["status"]["calibration"]["job"]
    w.operator.stop()
    status = obj["status"]
    verify_job = job_name.replace("-calib-", "-verify-")
    status.update(
        phase="Succeeded",
        message="llm serves the calibrated checkpoint with FP8 KV on all 1 pods",
        verification={"job": verify_job, "layers": 30, "mismatches": 0},
    )
    write_status(w, name, status)
    spec = KVCalibrationSpec.model_validate(obj["spec"])
    deployment = w.kube.get("Deployment", w.namespace, "llm")
    assert deployment is not None
    owner = Owner(name, w.namespace, obj["metadata"]["uid"])
    w.kube.apply_owned_fields(
        build_promoted_baseline(owner, spec, status["calibration"]["specHash"], deployment), FIELD_MANAGER
    )
    return job_name, w.kvcal(name)


def start_and_wait_for_a_pass(w: World, image: str) -> None:
    w.operator.calibrator_image = image
    w.operator.start()
    wait_for(lambda: reconciles_ok(w) >= 1, 60, "a reconcile pass of the upgraded operator")


def test_operator_upgrade_leaves_a_succeeded_calibration_alone(world: World, tmp_path: Path) -> None:
    """The reproduction: the chart's default calibrator image changed, the operator restarted."""
    w, name = world, "upgraded"
    job_name, _ = succeeded_under_old_operator(w, name, tmp_path / "model")
    start_and_wait_for_a_pass(w, NEW_IMAGE)
    obj = w.kvcal(name)
    assert obj["status"]["phase"] == "Succeeded", obj["status"].get("message")
    assert w.children("Job", name) == [job_name]  # nothing recalibrates
    assert obj["status"]["calibration"]["calibratorImage"] == OLD_IMAGE  # provenance of the scales
    assert condition(obj, "ServingVerified")["status"] == "True"

    # A spec change after the promotion: said where users look, never acted on by itself.
    changed = kvcalibration(name, tmp_path / "model", w.out, calibration={"samples": 6})
    w.apply(changed)

    def spec_current() -> dict[str, Any] | None:
        obj = w.kvcal(name)
        return obj if any(c["type"] == "SpecCurrent" for c in obj["status"]["conditions"]) else None

    obj = wait_for(spec_current, 30, "the SpecCurrent condition")
    current = condition(obj, "SpecCurrent")
    assert current["status"] == "False" and f"kvcal recalibrate {name}" in current["message"]
    assert obj["status"]["phase"] == "Succeeded" and w.children("Job", name) == [job_name]
    assert "SpecChanged" in w.events(name)


def test_recalibrate_refuses_the_served_output_then_uses_a_new_one(world: World, tmp_path: Path) -> None:
    w, name = world, "recal"
    old_job, _ = succeeded_under_old_operator(w, name, tmp_path / "model")
    start_and_wait_for_a_pass(w, NEW_IMAGE)
    assert kvcal_cli(["recalibrate", name, "-n", w.namespace, "--kubeconfig", w.cluster.kubeconfig]) == 0

    def refused() -> dict[str, Any] | None:
        obj = w.kvcal(name)
        calibrated = condition(obj, "Calibrated")
        return obj if obj["status"]["phase"] == "Pending" and calibrated["reason"] == "OutputInUse" else None

    obj = wait_for(refused, 30, "Pending with Calibrated=False/OutputInUse")
    assert "choose a new spec.calibration.output" in condition(obj, "Calibrated")["message"]
    assert "kvcal.dev/recalibrate" not in (obj["metadata"].get("annotations") or {})
    wait_for(lambda: w.children("Job", name) == [], 30, "the old calibration Job deleted")
    events = w.cluster.kubectl(
        "get", "events", "-n", w.namespace, "--field-selector", "reason=OutputInUse", "-o", "name"
    ).stdout
    assert events.strip(), "no OutputInUse event"
    assert w.children("Job", name) == []  # nothing writes into the folder the baseline serves

    new_out = tmp_path / "out-v2"
    w.apply(kvcalibration(name, tmp_path / "model", new_out))
    obj = w.wait_phase(name, "Calibrating", 60)
    (new_job,) = w.children("Job", name)
    assert new_job != old_job  # the new output is another calibration input
    job = w.kube.get("Job", w.namespace, new_job)
    assert job is not None and job["spec"]["template"]["spec"]["containers"][0]["image"] == NEW_IMAGE
    assert obj["status"]["calibration"]["calibratorImage"] == NEW_IMAGE


def test_new_vllm_image_after_promotion_is_reverified(world: World, tmp_path: Path) -> None:
    w, name = world, "reverify"
    succeeded_under_old_operator(w, name, tmp_path / "model")
    start_and_wait_for_a_pass(w, OLD_IMAGE)
    wait_for(lambda: w.kvcal(name)["status"].get("serving", {}).get("image"), 30, "status.serving recorded")
    w.cluster.kubectl("set", "image", "-n", w.namespace, "deploy/llm", "vllm=vllm/vllm-openai:v0.33.0")
    w.cluster.kubectl("annotate", "-n", w.namespace, f"kvcalibration/{name}", "e2e/nudge=1")  # a watch event

    def reverify_job() -> dict[str, Any] | None:
        jobs = [w.kube.get("Job", w.namespace, j) for j in w.children("Job", name)]
        return next(
            (j for j in jobs if j and "v0.33.0" in j["spec"]["template"]["spec"]["containers"][0]["image"]), None
        )

    job = wait_for(reverify_job, 60, "a verification Job in the new vLLM image")
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][:2] == [
        "python3",
        "/kvcal-verifier/kvcal-verifier.pyz",
    ]  # the verifier bundle, in the new image as it is

    def verified() -> dict[str, Any] | None:
        obj = w.kvcal(name)
        serving = condition(obj, "ServingVerified")
        return obj if serving["status"] in ("True", "False") and "v0.33.0" in serving["message"] else None

    # The checkpoint folder is empty here (the calibration Job was held): the re-verification must say False.
    obj = wait_for(verified, 120, "ServingVerified with the result in v0.33.0")
    serving = condition(obj, "ServingVerified")
    assert serving["status"] == "False" and serving["reason"] == "VerificationFailed", serving
    assert obj["status"]["serving"]["image"] == "vllm/vllm-openai:v0.33.0"
    assert obj["status"]["phase"] == "Succeeded"
    assert "ServingVerificationFailed" in w.events(name)


def test_a_chat_template_changed_after_promotion_is_reported_on_the_next_pass(world: World, tmp_path: Path) -> None:
    """On the real API server: the baseline's owner adds --chat-template to the promoted Deployment; the next pass
    (its watch event) says CalibrationCurrent False, reason ChatTemplateChanged, with a Warning event; nothing
    re-rolls."""
    w, name = world, "template"
    succeeded_under_old_operator(w, name, tmp_path / "model")
    start_and_wait_for_a_pass(w, OLD_IMAGE)
    wait_for(lambda: w.kvcal(name)["status"].get("serving", {}).get("chatTemplate") == "", 30, "the template recorded")
    patch = [
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--chat-template=/t/tools.jinja"}
    ]
    w.cluster.kubectl("patch", "-n", w.namespace, "deploy/llm", "--type=json", "-p", json.dumps(patch))

    def reported() -> dict[str, Any] | None:
        obj = w.kvcal(name)
        found = [c for c in obj["status"].get("conditions", []) if c["type"] == "CalibrationCurrent"]
        return obj if found and found[0]["status"] == "False" else None

    obj = wait_for(reported, 60, "CalibrationCurrent False after the template changed")
    current = condition(obj, "CalibrationCurrent")
    assert current["reason"] == "ChatTemplateChanged" and "/t/tools.jinja" in current["message"], current
    assert obj["status"]["phase"] == "Succeeded" and "CalibrationNotCurrent" in w.events(name)


def test_baseline_scaled_to_zero_during_deploying(world: World, tmp_path: Path) -> None:
    """The reproduction: Deploying with the baseline at 0 replicas was a ValueError in the log, forever."""
    w, name = world, "zero"
    model = tmp_path / "model"
    model.mkdir()
    for m in [*baseline(model, replicas=1), dataset_configmap()]:
        w.apply(m)
    w.operator.stop()
    manifest = kvcalibration(name, model, w.out)
    w.apply(manifest)
    h = spec_hash(KVCalibrationSpec.model_validate(manifest["spec"]))
    write_status(
        w,
        name,
        {
            "phase": "Deploying",
            "message": "vLLM loaded the calibrated scales of 30 layers, 0 mismatches",
            "calibration": {
                "job": f"{name}-calib-{h[:8]}",
                "specHash": h,
                "artifact": manifest["spec"]["calibration"]["output"],
            },
            "verification": {"job": f"{name}-verify-{h[:8]}", "layers": 30, "mismatches": 0},
        },
    )
    w.cluster.kubectl("scale", "-n", w.namespace, "deploy/llm", "--replicas=0")
    w.operator.start()

    def blocked() -> dict[str, Any] | None:
        obj = w.kvcal(name)
        ready = [c for c in obj["status"].get("conditions") or [] if c["type"] == "CanaryReady"]
        return obj if ready and ready[0]["reason"] == "BaselineScaledToZero" else None

    obj = wait_for(blocked, 30, "CanaryReady=False/BaselineScaledToZero")
    message = condition(obj, "CanaryReady")["message"]
    assert "kubectl scale deploy/llm" in message and f"kvcal abort {name}" in message
    assert obj["status"]["message"] == message
    shown = w.cluster.get_json("events", "-n", w.namespace, "--field-selector", "reason=BaselineScaledToZero")
    items: list[dict[str, Any]] = shown["items"]  # type: ignore[assignment]
    assert [e["type"] for e in items] == ["Warning"] and "kubectl scale" in items[0]["message"]
    sample = 'kvcal_warning_events_total{reason="BaselineScaledToZero"}'
    wait_for(lambda: metric(w, sample) >= 1, 30, sample)

    w.cluster.kubectl("scale", "-n", w.namespace, "deploy/llm", "--replicas=1")
    w.cluster.kubectl("annotate", "-n", w.namespace, f"kvcalibration/{name}", "e2e/nudge=1")
    wait_for(lambda: w.children("Deployment", name) == [f"{name}-canary"], 60, "the canary once the baseline is back")


def freeze_jobs(w: World) -> list[str]:
    """A ValidatingAdmissionPolicy that denies every Job in the test's namespace (a change freeze, as a platform
    team would set one); returns the cluster-scoped objects to delete."""
    policy, binding = f"freeze-jobs-{w.namespace}", f"freeze-jobs-{w.namespace}"
    w.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["jobs"]}
                    ]
                },
                "validations": [{"expression": "false", "message": "Jobs are frozen in this namespace"}],
            },
        }
    )
    w.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": binding},
            "spec": {
                "policyName": policy,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": w.namespace}}},
            },
        }
    )

    def denied() -> bool:
        probe = w.cluster.kubectl(
            "create", "job", "probe", "--image=x", "-n", w.namespace, "--dry-run=server", check=False
        )
        return probe.returncode != 0 and "frozen" in probe.stderr

    wait_for(denied, 60, "the admission policy to deny Jobs")
    return [f"validatingadmissionpolicybinding/{binding}", f"validatingadmissionpolicy/{policy}"]


def test_failed_pass_is_a_condition_an_event_and_a_metric(world: World, tmp_path: Path) -> None:
    """A pass the API refuses (an admission policy denies the calibration Job) is visible with kubectl and in the
    metrics, and the condition clears once a pass succeeds."""
    w, name = world, "frozen"
    model = tmp_path / "model"
    model.mkdir()
    for m in [*baseline(model, replicas=1), dataset_configmap()]:
        w.apply(m)
    w.kubelet.hold("calibration")
    frozen = freeze_jobs(w)
    try:
        w.apply(kvcalibration(name, model, w.out))

        def failed() -> dict[str, Any] | None:
            obj = w.kvcal(name)
            errors = [c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "ReconcileError"]
            return obj if errors and errors[0]["status"] == "True" else None

        obj = wait_for(failed, 60, "ReconcileError=True")
        error = condition(obj, "ReconcileError")
        assert error["reason"] == "ApiException" and "422" in error["message"], error
        assert "Jobs are frozen in this namespace" in error["message"]
        shown = w.cluster.get_json("events", "-n", w.namespace, "--field-selector", "reason=ReconcileError")
        items: list[dict[str, Any]] = shown["items"]  # type: ignore[assignment]
        assert items and {e["type"] for e in items} == {"Warning"}
        sample = 'kvcal_reconcile_errors_total{reason="ApiException"}'
        wait_for(lambda: metric(w, sample) >= 1, 30, "the error metric")
    finally:
        for kind_name in frozen:
            w.cluster.kubectl("delete", kind_name, "--ignore-not-found")
    obj = w.wait_phase(name, "Calibrating", 90)  # the next pass after the backoff
    recovered = condition(obj, "ReconcileError")
    assert recovered["status"] == "False" and recovered["reason"] == "Recovered"


def test_a_context_raised_after_promotion_is_reported_on_the_next_pass(world: World, tmp_path: Path) -> None:
    """On the real API server: the baseline's owner raises --max-model-len past the context the calibration was
    judged against; the next pass says CalibrationCurrent False, reason ContextRaised, with a Warning event; nothing
    re-rolls, and the condition goes back to True once the context is back within it."""
    w, name = world, "context"
    _, obj = succeeded_under_old_operator(w, name, tmp_path / "model")
    status = obj["status"]
    status["calibration"]["servedContextTokens"] = 2048  # the calibration's summary: the baseline's --max-model-len
    write_status(w, name, status)
    start_and_wait_for_a_pass(w, OLD_IMAGE)

    def served_context(tokens: str) -> None:
        deployment = w.kube.get("Deployment", w.namespace, "llm")
        assert deployment is not None
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        at = args.index("--max-model-len") + 1
        patch = [{"op": "replace", "path": f"/spec/template/spec/containers/0/args/{at}", "value": tokens}]
        w.cluster.kubectl("patch", "-n", w.namespace, "deploy/llm", "--type=json", "-p", json.dumps(patch))

    def current(wanted: str) -> dict[str, Any] | None:
        obj = w.kvcal(name)
        found = [c for c in obj["status"].get("conditions", []) if c["type"] == "CalibrationCurrent"]
        return obj if found and found[0]["status"] == wanted else None

    served_context("8192")
    obj = wait_for(lambda: current("False"), 60, "CalibrationCurrent False after the context was raised")
    condition_now = condition(obj, "CalibrationCurrent")
    assert condition_now["reason"] == "ContextRaised", condition_now
    assert "--max-model-len 8192, beyond the 2048 tokens" in condition_now["message"]
    assert obj["status"]["phase"] == "Succeeded" and "CalibrationNotCurrent" in w.events(name)
    assert w.children("Deployment", name) == []  # nothing re-rolled

    served_context("2048")
    obj = wait_for(lambda: current("True"), 60, "CalibrationCurrent True with the calibrated context back")
    assert condition(obj, "CalibrationCurrent")["reason"] == "Current"
