"""core.guard.policy.check: the operator's security policy on a spec (issue #10 item 1), and decide() refusing it."""

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal.core.decide import decide
from kvcal.core.guard.policy import (
    HOST_PATH_ENABLED_VALUE,
    HOST_PATH_PREFIXES_VALUE,
    IMAGE_PREFIXES_VALUE,
    Policy,
    check,
    host_path_allowed,
    image_allowed,
)
from kvcal.core.manifests.common import DEFAULT_CALIBRATOR_IMAGE
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import KVCalibrationStatus, Phase
from tests.support.decide import NOW, observations, spec_with

REPO = Path(__file__).resolve().parents[4]
CHART_VALUES = yaml.safe_load((Path(__file__).resolve().parents[4] / "charts/kvcal/values.yaml").read_text())
SECURE = Policy()  # the defaults: hostpath:// off, only the default calibrator image


def stored_with(spec: KVCalibrationSpec, source: str | None = None, output: str | None = None) -> KVCalibrationSpec:
    """`spec` with model.source / calibration.output set unvalidated: an object stored before the CRD (and the
    model) refused it, which the policy still refuses."""
    model = spec.model.model_copy(update={"source": source or spec.model.source})
    calibration = spec.calibration.model_copy(update={"output": output or spec.calibration.output})
    return spec.model_copy(update={"model": model, "calibration": calibration})


# The reproduction of issue #10: a user who may only edit KVCalibrations names host folders and any image.
ATTACK = {
    "model.source": "hostpath:///etc",
    "calibration.dataset.source": "hostpath:///root/.ssh/id_rsa",
    "calibration.output": "hostpath:///var/lib/x",
    "calibration.job.image": "docker.io/attacker/tools:1",
}


def test_the_attackers_spec_is_refused_field_by_field_naming_the_chart_values() -> None:
    violations = check(spec_with(**ATTACK), SECURE)
    assert [v.field for v in violations] == [
        "spec.model.source",
        "spec.calibration.dataset.source",
        "spec.calibration.output",
        "spec.calibration.job.image",
    ]
    assert str(violations[0]) == (
        "spec.model.source: hostpath:// is disabled by the operator's policy; a cluster admin can allow it with the "
        "chart value policy.hostPath.enabled=true (and policy.hostPath.allowedPrefixes)"
    )
    assert "docker.io/attacker/tools:1" in str(violations[3]) and IMAGE_PREFIXES_VALUE in str(violations[3])


def test_the_defaults_allow_an_ordinary_spec() -> None:
    assert check(spec_with(), SECURE) == []
    assert check(spec_with(**{"calibration.job.image": None}), SECURE) == []  # the operator's image is filled in


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/data", True),
        ("/data/models/llama", True),
        ("/database", False),
        ("/dat", False),
        ("/", False),
        ("/etc", False),
    ],
)
def test_host_path_prefixes_match_whole_segments(path: str, allowed: bool) -> None:
    assert host_path_allowed(path, Policy(host_path_prefixes=("/data/",)).host_path_prefixes) is allowed


def test_allowed_prefix_opens_host_paths_under_it_only() -> None:
    policy = Policy(host_path_prefixes=("/srv/kvcal",))
    inside = {
        "model.source": "hostpath:///srv/kvcal/models/llama/",
        "calibration.dataset.source": "hostpath:///srv/kvcal//data/./calib.jsonl",
        "calibration.output": "hostpath:///srv/kvcal/out",
    }
    assert check(spec_with(**inside), policy) == []
    (outside,) = check(spec_with(**{**inside, "calibration.output": "hostpath:///srv/kvcal-other/out"}), policy)
    assert outside.field == "spec.calibration.output" and outside.chart_value == HOST_PATH_PREFIXES_VALUE
    assert "/srv/kvcal-other/out" in str(outside) and "(/srv/kvcal)" in str(outside)
    # A file mounts its folder: the folder must be allowed, not only the file.
    (dataset,) = check(spec_with(**{**inside, "calibration.dataset.source": "hostpath:///srv/kvcal.jsonl"}), policy)
    assert dataset.field == "spec.calibration.dataset.source"


@pytest.mark.parametrize(
    "uri",
    ["hostpath:///srv/kvcal/../../etc", "hostpath:///../../etc", "pvc://models/a/../../b", "pvc://models/.."],
)
def test_dot_dot_segments_are_refused_whatever_the_policy(uri: str) -> None:
    policy = Policy(host_path_prefixes=("/",))
    (violation,) = check(stored_with(spec_with(), source=uri), policy)
    assert violation.field == "spec.model.source" and "'..'" in str(violation) and violation.chart_value is None


@pytest.mark.parametrize(
    ("model", "output"),
    [
        ("pvc://models/llama", "pvc://models/llama/"),
        ("pvc://models/llama", "pvc://models/llama/fp8"),
        ("pvc://models/llama/bf16", "pvc://models/llama"),
        ("hostpath:///m/llama", "hostpath:///m//llama/."),
    ],
)
def test_output_must_be_a_folder_of_its_own(model: str, output: str) -> None:
    policy = Policy(host_path_prefixes=("/m",))
    violations = check(stored_with(spec_with(**{"model.source": model}), output=output), policy)
    assert [v.field for v in violations] == ["spec.calibration.output"]
    assert check(spec_with(**{"model.source": model, "calibration.output": model + "-fp8kv"}), policy) == []


def test_output_must_not_hold_the_prompts() -> None:
    changes = {"calibration.dataset.source": "pvc://models/out/prompts.jsonl", "calibration.output": "pvc://models/out"}
    assert [v.field for v in check(spec_with(**changes), SECURE)] == ["spec.calibration.output"]


@pytest.mark.parametrize(
    ("image", "allowed"),
    [
        (DEFAULT_CALIBRATOR_IMAGE, True),
        ("registry.example.com/ml/calibrator:2", True),
        ("registry.example.com/ml@sha256:" + "a" * 64, True),
        ("registry.example.com/ml-evil/calibrator:2", False),
        ("registry.example.com/m", False),
        ("ghcr.io/kvcal/kvcal-calibrator:0.2.0", False),
    ],
)
def test_calibrator_image_is_the_operators_or_under_an_allowed_prefix(image: str, allowed: bool) -> None:
    policy = Policy(calibrator_image_prefixes=("registry.example.com/ml",))
    assert image_allowed(image, policy) is allowed


def test_the_host_root_is_a_folder_like_any_other() -> None:
    (root,) = check(spec_with(**{"model.source": "hostpath:////"}), Policy(host_path_prefixes=("/data",)))
    assert "host folder / is outside" in str(root)
    assert check(spec_with(**{"model.source": "hostpath:////"}), Policy(host_path_prefixes=("/",))) == []


def test_policy_values_are_checked() -> None:
    with pytest.raises(ValueError, match="absolute"):
        Policy(host_path_prefixes=("data",))
    with pytest.raises(ValueError, match=r"'\.\.'"):
        Policy(host_path_prefixes=("/data/../etc",))
    with pytest.raises(ValueError, match="every image"):
        Policy(calibrator_image_prefixes=("",))
    assert Policy(host_path_prefixes=("/data//x/",)).host_path_prefixes == ("/data/x",)


def test_the_chart_values_named_in_messages_exist_with_secure_defaults() -> None:
    for dotted in (HOST_PATH_ENABLED_VALUE, HOST_PATH_PREFIXES_VALUE, IMAGE_PREFIXES_VALUE):
        node: Any = CHART_VALUES
        for key in dotted.split("."):
            node = node[key]
        assert node in (False, []), f"{dotted} must default to closed, is {node!r}"
    assert CHART_VALUES["jobImages"]["calibrator"] == DEFAULT_CALIBRATOR_IMAGE


def test_decide_creates_nothing_for_a_refused_spec_and_says_why() -> None:
    attack = spec_with(**ATTACK)
    d = decide(attack, KVCalibrationStatus(), observations(policy=SECURE), NOW)
    assert d.actions == ()
    assert d.status.phase == Phase.INVALID_SPEC
    assert d.status.history[-1].reason == "PolicyDenied"
    assert HOST_PATH_ENABLED_VALUE in (d.status.message or "")
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "PolicyDenied")]
    calibrated = next(c for c in d.status.conditions if c.type == "Calibrated")
    assert (calibrated.status, calibrated.reason) == ("False", "PolicyDenied")
    again = decide(attack, d.status, observations(policy=SECURE), NOW)
    assert again.status == d.status and again.actions == () and again.events == ()  # steady: no write, no event
    hosts, images = ("/etc", "/root", "/var/lib"), ("docker.io/attacker",)
    allowed = Policy(host_path_prefixes=hosts, calibrator_image_prefixes=images)
    fixed = decide(attack, d.status, observations(policy=allowed), NOW)
    assert fixed.status.phase == Phase.PENDING  # the admin opened the policy: it proceeds


def test_a_policy_tightened_mid_run_rolls_back() -> None:
    status = KVCalibrationStatus(phase=Phase.CALIBRATING)
    d = decide(spec_with(**ATTACK), status, observations(policy=SECURE), NOW)
    assert d.status.phase == Phase.ROLLING_BACK and d.status.history[-1].reason == "PolicyDenied"


def test_the_local_trial_allows_its_demo_and_nothing_else_by_default() -> None:
    """docs/local-trial.md's helm install opens host paths just enough for examples/demo-cpu.yaml."""
    trial = (REPO / "docs" / "local-trial.md").read_text()
    prefixes = tuple(re.findall(r"policy\.hostPath\.allowedPrefixes\[\d\]=([^'\s]+)", trial))
    assert "policy.hostPath.enabled=true" in trial and prefixes == ("/var/lib/kvcal",)
    demo = yaml.safe_load((REPO / "examples" / "demo-cpu.yaml").read_text())
    demo_spec = KVCalibrationSpec.model_validate(demo["spec"])
    assert check(demo_spec, Policy(host_path_prefixes=prefixes)) == []
    assert {v.chart_value for v in check(demo_spec, SECURE)} == {HOST_PATH_ENABLED_VALUE}
