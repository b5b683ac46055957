"""The parity table (tests/integration/spec_cases.py) hits every constraint of the CRD's spec, and the model's
verdict on each row is the one the table expects; the integration test adds the API server's verdict."""

from typing import Any

import pytest

from kvcal.validate import problems_of
from tests.integration.spec_cases import CASES, LEFT_TO_OTHERS, REPO, Case
from tests.support.crd import BOUNDS, SPEC_SCHEMA


def crd_constraints(schema: dict[str, Any], path: str = "spec") -> set[str]:
    found = {f"{path}:{key}" for key in (*BOUNDS, "enum", "additionalProperties") if key in schema}
    found |= {f"{path}.{name}:required" for name in schema.get("required", [])}
    found |= {f"{path}:cel{index}" for index, _ in enumerate(schema.get("x-kubernetes-validations", []))}
    for name, child in schema.get("properties", {}).items():
        found |= crd_constraints(child, f"{path}.{name}")
    if "items" in schema:
        found |= crd_constraints(schema["items"], f"{path}[]")
    return found


def test_every_crd_constraint_and_cel_rule_has_an_invalid_row() -> None:
    constraints = crd_constraints(SPEC_SCHEMA)
    hit = {case.hits for case in CASES if case.hits}
    assert len(constraints) >= 90
    assert not (constraints - LEFT_TO_OTHERS) - hit, "add rows to tests/integration/spec_cases.py"
    assert len(CASES) >= 60 and len({case.id for case in CASES}) == len(CASES)


def test_operations_doc_quotes_the_tables_size() -> None:
    """docs/operations.md says on how many objects the API server and `kvcal validate` are held to one verdict."""
    text = " ".join((REPO / "docs" / "operations.md").read_text().split())
    assert f"one verdict on {len(CASES)} objects" in text


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_the_model_gives_the_tables_verdict(case: Case) -> None:
    problems = problems_of(case.document())
    assert (not problems) == case.valid, problems
