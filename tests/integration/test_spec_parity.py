"""One verdict for every KVCalibration: the API server (server-side dry-run, strict field validation) and the model
(`kvcal validate`) accept and reject the same rows of tests/integration/spec_cases.py, and for an accepted row the
API server's defaulted spec is the model's."""

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kvcal.core.manifests.common import GROUP, PLURAL, VERSION
from kvcal.models.spec import KVCalibrationSpec
from kvcal.validate import problems_of
from tests.integration.spec_cases import CASES, Case
from tests.support.cluster import Cluster

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def dry_run(control_plane: Cluster, crd_installed: str) -> Iterator[Any]:
    """Create with dryRun=All: admission runs in full and nothing is stored (one namespace, one client)."""
    control_plane.kubectl("create", "namespace", "spec-parity")
    api = client.CustomObjectsApi(control_plane.api_client())

    def create(document: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        try:
            created: dict[str, Any] = api.create_namespaced_custom_object(
                GROUP, VERSION, "spec-parity", PLURAL, document, dry_run="All", field_validation="Strict"
            )  # type: ignore[assignment]
            return created, ""
        except ApiException as error:
            if error.status != 422 and "strict decoding error" not in str(error.body):
                raise
            return None, str(error.body)

    yield create
    control_plane.kubectl("delete", "namespace", "spec-parity", "--wait=false", check=False)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_api_server_and_model_agree(dry_run: Any, case: Case) -> None:
    document = case.document()
    created, api_error = dry_run(document)
    problems = problems_of(document)
    assert (created is not None) == case.valid, f"API server: {api_error or 'admitted'}"
    assert (not problems) == case.valid, f"model: {problems}"
    if created is not None:
        assert created["spec"] == KVCalibrationSpec.model_validate(document["spec"]).to_wire()
