"""The probes' API key as the operator finds it (kvcal.handlers.backends): in the baseline's pod spec, or in the Secret
it names where the chart's policy allows; never in a refusal's text."""

import base64
from typing import Any

import pytest

from kvcal.core.guard.policy import Policy
from kvcal.handlers.backends import ClusterBackends
from kvcal.ports import Target
from tests.support.decide import OWNER, baseline_manifest, spec
from tests.support.fakekube import FakeKube

TARGET = Target(namespace="llm", name=OWNER.name, spec=spec(), canary_deployment="c", canary_service="c")


def baseline_with(**container: Any) -> dict[str, Any]:
    manifest = baseline_manifest()
    manifest["spec"]["template"]["spec"]["containers"][0].update(container)
    return manifest


SECRET_ENV = [{"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "vllm-key", "key": "token"}}}]
SECRET = {"kind": "Secret", "metadata": {"name": "vllm-key", "namespace": "llm"},
          "data": {"token": base64.b64encode(b"from-the-secret").decode()}}  # fmt: skip


@pytest.mark.parametrize(
    ("container", "allowed", "key", "why"),
    [
        ({"env": [{"name": "VLLM_API_KEY", "value": "in-the-spec"}]}, False, "in-the-spec", None),
        ({"env": SECRET_ENV}, True, "from-the-secret", None),
        ({"env": SECRET_ENV}, False, None, "Secret vllm-key (key token), which the operator may not read"),
        ({"args": ["--ssl-keyfile", "/tls/key.pem"]}, False, None, "serves HTTPS"),
    ],
    ids=["literal", "secret-allowed", "secret-refused", "tls"],
)
def test_the_probes_key(container: dict[str, Any], allowed: bool, key: str | None, why: str | None) -> None:
    kube = FakeKube([baseline_with(**container), SECRET])
    probes = ClusterBackends(kube, Policy(read_api_key_secrets=allowed)).probes(TARGET)
    assert probes._api_key == key  # type: ignore[attr-defined]
    refusal = probes._refusal  # type: ignore[attr-defined]
    assert (refusal is None) == (why is None) and (why is None or why in refusal), refusal
    assert "from-the-secret" not in (refusal or "")
    assert ("get Secret/vllm-key" in kube.calls) == allowed  # never read where the policy says no


def test_a_missing_secret_is_said() -> None:
    probes = ClusterBackends(FakeKube([baseline_with(env=SECRET_ENV)]), Policy(read_api_key_secrets=True)).probes(
        TARGET
    )
    assert "Secret vllm-key (key token), which does not exist" in probes._refusal  # type: ignore[attr-defined]


def test_a_tls_baseline_is_probed_over_https_with_the_admins_ca() -> None:
    kube = FakeKube([baseline_with(args=["--ssl-certfile", "/tls/tls.crt", "--ssl-keyfile", "/tls/tls.key"])])
    probes = ClusterBackends(kube, Policy(probes_ca_file="/etc/kvcal/probes/ca.crt")).probes(TARGET)
    tls = probes._tls  # type: ignore[attr-defined]
    service = TARGET.spec.serving.baseline.service
    assert probes._refusal is None and tls is not None  # type: ignore[attr-defined]
    assert (tls.ca_file, tls.server_name) == ("/etc/kvcal/probes/ca.crt", f"{service}.llm.svc")
