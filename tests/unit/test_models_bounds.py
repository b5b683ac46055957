"""Every OpenAPI bound of the CRD's spec (minimum, maximum, lengths, item counts, pattern) has its twin in the
pydantic model, and the model declares none the CRD lacks: both schemas are walked path by path.

CEL rules cannot be compared mechanically; tests/integration/test_spec_parity.py sends a table of objects through
the API server and the model instead."""

import copy
import re
from typing import Any

import pytest

from kvcal.models.spec import KVCalibrationSpec
from tests.support.crd import BOUNDS, SPEC_SCHEMA

Bounds = dict[str, dict[str, Any]]
MATCHES = re.compile(r"self\.matches\('(.*)'\)")


def _crd_bounds(schema: dict[str, Any], path: str, out: Bounds) -> Bounds:
    found = {key: schema[key] for key in BOUNDS if key in schema}
    for rule in schema.get("x-kubernetes-validations", []):
        matched = MATCHES.fullmatch(rule["rule"])
        if matched:  # a CEL regex (for its message) is a pattern all the same
            found["pattern"] = matched.group(1)
    if found:
        out[path] = found
    for name, child in schema.get("properties", {}).items():
        _crd_bounds(child, f"{path}.{name}", out)
    if "items" in schema:
        _crd_bounds(schema["items"], f"{path}[]", out)
    return out


def _model_bounds(schema: dict[str, Any], defs: dict[str, Any], path: str, out: Bounds) -> Bounds:
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    branches = [s for s in schema.get("anyOf", []) if s.get("type") != "null"]
    if len(branches) == 1:  # X | None
        schema = defs[branches[0]["$ref"].rsplit("/", 1)[-1]] if "$ref" in branches[0] else branches[0]
    found = {key: schema[key] for key in BOUNDS if key in schema}
    if found:
        out[path] = found
    for name, child in schema.get("properties", {}).items():
        _model_bounds(child, defs, f"{path}.{name}", out)
    if "items" in schema:
        _model_bounds(schema["items"], defs, f"{path}[]", out)
    return out


def model_bounds() -> Bounds:
    schema = KVCalibrationSpec.model_json_schema(by_alias=True)
    return _model_bounds(schema, schema.get("$defs", {}), "spec", {})


def test_every_crd_bound_has_its_twin_in_the_model() -> None:
    crd, model = _crd_bounds(SPEC_SCHEMA, "spec", {}), model_bounds()
    assert len(crd) >= 30  # the walk reaches the whole spec
    assert {p: crd[p] for p in sorted(crd)} == {p: model.get(p) for p in sorted(crd)}
    only_in_model = sorted(set(model) - set(crd))
    assert not only_in_model, f"the model bounds fields the CRD does not: {only_in_model}"


def test_the_walk_detects_a_drifted_bound() -> None:
    drifted = copy.deepcopy(SPEC_SCHEMA)
    drifted["properties"]["calibration"]["properties"]["samples"]["maximum"] = 100_000
    crd, model = _crd_bounds(drifted, "spec", {}), model_bounds()
    assert crd["spec.calibration.samples"] != model["spec.calibration.samples"]


@pytest.mark.parametrize("path", ["spec.calibration.samples", "spec.serving.traffic.steps", "spec.analysis.interval"])
def test_walks_see_the_bounds_we_know(path: str) -> None:
    assert path in model_bounds() and path in _crd_bounds(SPEC_SCHEMA, "spec", {})
