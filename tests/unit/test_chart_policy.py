"""The chart's policy.* values reach the operator as the Policy the core enforces (chart -> flags -> Policy)."""

import pytest

from kvcal.core.guard.policy import Policy
from tests.support.helm_template import CHART, KUBE_VERSION, helm, operator_policy, render, set_args


def test_default_chart_policy_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = operator_policy(render(), monkeypatch)
    assert policy == Policy(calibrator_image="ghcr.io/kvcal/kvcal-calibrator:0.1.0")
    assert policy.host_path_prefixes == () and policy.calibrator_image_prefixes == ()


def test_policy_values_become_the_operators_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "policy.hostPath.enabled": "true",
        "policy.hostPath.allowedPrefixes[0]": "/srv/kvcal/",
        "policy.hostPath.allowedPrefixes[1]": "/data",
        "policy.calibratorImage.allowedPrefixes[0]": "registry.example.com/ml/",
        "jobImages.calibrator": "registry.example.com/ml/calibrator:2",
    }
    policy = operator_policy(render(values), monkeypatch)
    assert policy == Policy(
        calibrator_image="registry.example.com/ml/calibrator:2",
        calibrator_image_prefixes=("registry.example.com/ml/",),
        host_path_prefixes=("/srv/kvcal", "/data"),
    )


def test_a_release_without_policy_values_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """`helm upgrade --reuse-values` from a chart that had no policy.* values renders, with the closed policy."""
    policy = operator_policy(render({"policy": "null"}), monkeypatch)
    assert policy.host_path_prefixes == () and policy.calibrator_image_prefixes == ()


def test_prefixes_without_enabled_open_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = operator_policy(render({"policy.hostPath.allowedPrefixes[0]": "/data"}), monkeypatch)
    assert policy.host_path_prefixes == ()


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"policy.hostPath.enabled": "true"}, "allowedPrefixes"),
        ({"policy.hostPath.enabled": "true", "policy.hostPath.allowedPrefixes[0]": "data"}, "allowedPrefixes"),
        ({"policy.hostPath.enabled": "true", "policy.hostPath.allowedPrefixes[0]": "/data/../etc"}, "allowedPrefixes"),
        ({"policy.calibratorImage.allowedPrefixes[0]": ""}, "allowedPrefixes"),
        ({"policy.hostpath.enabled": "true"}, "hostpath"),
    ],
    ids=["enabled-without-prefixes", "relative", "dot-dot", "empty-image-prefix", "typo"],
)
def test_schema_rejects_bad_policy_values(values: dict[str, str], field: str) -> None:
    proc = helm("template", "rel", str(CHART), "--kube-version", KUBE_VERSION, *set_args(values), check=False)
    assert proc.returncode != 0, f"helm accepted {values}"
    assert field in proc.stderr, proc.stderr
