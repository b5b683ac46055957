"""The pydantic models (operator/kvcal/models) and the CRD schema (crds/) describe the same resource.

Walks both: every model field is a CRD property and vice versa, with the same required-ness, type, enum and default
(the CRD's default after the API server's structural defaulting, emulated here; the cluster test checks the real one).
"""

import copy
import enum
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import annotated_types
import pytest
import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import MAX_HISTORY, MAX_MEASUREMENTS, KVCalibrationStatus

REPO = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((REPO / "crds" / "kvcal.dev_kvcalibrations.yaml").read_text())
ROOT = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean"}


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """kube-apiserver's structural defaulting: absent properties take their default, then defaults nest."""
    if isinstance(value, dict) and "properties" in schema:
        for name, prop in schema["properties"].items():
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
        for name, prop in schema["properties"].items():
            if name in value:
                value[name] = apply_defaults(value[name], prop)
    elif isinstance(value, list) and "items" in schema:
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


def _unwrap_optional(annotation: Any) -> Any:
    if get_origin(annotation) is typing.Annotated:  # list items with bounds: list[Annotated[str, Field(...)]]
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        assert len(args) == 1, f"unexpected union {annotation}"
        return args[0]
    return annotation


def _check_type(annotation: Any, prop: dict[str, Any], path: str) -> None:
    annotation = _unwrap_optional(annotation)
    origin = get_origin(annotation)
    if origin is Literal:
        assert prop["type"] == "string", path
        assert sorted(prop["enum"]) == sorted(get_args(annotation)), f"{path}: enum differs"
    elif isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        assert prop["type"] == "string", path
        assert prop["enum"] == [m.value for m in annotation], f"{path}: enum differs"
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        assert prop["type"] == "object", path
        _walk(annotation, prop, path)
    elif origin is list:
        assert prop["type"] == "array", path
        _check_type(get_args(annotation)[0], prop["items"], f"{path}[]")
    elif origin is dict:
        assert prop["type"] == "object", path
    else:
        assert prop["type"] == SCALARS[annotation], f"{path}: {prop['type']} is not {annotation}"


def _wire_default(info: FieldInfo) -> Any:
    default = info.get_default(call_default_factory=True)
    assert info.annotation is not None
    return TypeAdapter(info.annotation).dump_python(default, mode="json", by_alias=True, exclude_none=True)


def _walk(model: type[BaseModel], schema: dict[str, Any], path: str) -> None:
    fields = {info.alias or name: info for name, info in model.model_fields.items()}
    props = schema["properties"]
    assert set(fields) == set(props), (
        f"{path}: only in model {set(fields) - set(props)}, only in CRD {set(props) - set(fields)}"
    )
    required = {alias for alias, info in fields.items() if info.is_required()}
    assert required == set(schema.get("required", [])), f"{path}: required fields differ"
    for alias, info in fields.items():
        prop, where = props[alias], f"{path}.{alias}"
        _check_type(info.annotation, prop, where)
        for bound in info.metadata:  # bounds the model declares (Field(ge=..., le=...)) must be the CRD's
            if isinstance(bound, annotated_types.Ge):
                assert prop.get("minimum") == bound.ge, f"{where}: minimum differs"
            if isinstance(bound, annotated_types.Le):
                assert prop.get("maximum") == bound.le, f"{where}: maximum differs"
        if info.is_required() or info.get_default(call_default_factory=True) is None:
            assert "default" not in prop, f"{where}: CRD has a default, the model has none"
            continue
        assert "default" in prop, f"{where}: the model defaults to {_wire_default(info)!r}, the CRD has no default"
        crd_default = apply_defaults(copy.deepcopy(prop["default"]), prop)
        assert crd_default == _wire_default(info), f"{where}: CRD default {crd_default!r} != model default"


def test_spec_model_and_crd_schema_agree() -> None:
    _walk(KVCalibrationSpec, ROOT["properties"]["spec"], "spec")


def test_status_model_and_crd_schema_agree() -> None:
    _walk(KVCalibrationStatus, ROOT["properties"]["status"], "status")


def test_status_caps_match_the_models() -> None:
    status = ROOT["properties"]["status"]["properties"]
    assert status["analysis"]["properties"]["measurements"]["maxItems"] == MAX_MEASUREMENTS
    assert status["history"]["maxItems"] == MAX_HISTORY


def test_walk_detects_a_default_mismatch() -> None:
    """The checker can fail: a CRD whose samples default drifted from the model's is caught."""
    drifted = copy.deepcopy(ROOT["properties"]["spec"])
    drifted["properties"]["calibration"]["properties"]["samples"]["default"] = 256
    with pytest.raises(AssertionError, match=r"spec\.calibration\.samples"):
        _walk(KVCalibrationSpec, drifted, "spec")


def test_empty_status_defaults_to_pending() -> None:
    defaulted = apply_defaults({}, ROOT["properties"]["status"])
    assert KVCalibrationStatus.model_validate(defaulted) == KVCalibrationStatus()
    assert defaulted["phase"] == "Pending"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_parses_and_crd_defaults_match_model_defaults(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("kvcal.dev/v1alpha1", "KVCalibration")
    spec = KVCalibrationSpec.model_validate(doc["spec"])
    assert apply_defaults(copy.deepcopy(doc["spec"]), ROOT["properties"]["spec"]) == spec.to_wire()


def test_examples_cover_the_main_shapes() -> None:
    specs = [KVCalibrationSpec.model_validate(yaml.safe_load(p.read_text())["spec"]) for p in EXAMPLES]
    assert len(specs) >= 4
    assert {s.calibration.strategy for s in specs} == {"tensor", "head"}
    assert {s.serving.traffic.router for s in specs} >= {"replicas", "gateway-api"}
    assert {s.promotion.mode for s in specs} == {"auto", "manual"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"calibration": {"strategy": "head"}}, "spec.calibration.strategy"),
        ({"serving": {"traffic": {"steps": [50, 10]}}}, "spec.serving.traffic.steps"),
        ({"serving": {"traffic": {"steps": [10, 101]}}}, "spec.serving.traffic.steps"),
        ({"serving": {"traffic": {"router": "gateway-api"}}}, "spec.serving.traffic.httpRoute"),
        ({"calibration": {"holdoutFraction": 0.6}}, "spec.calibration.holdoutFraction"),
        ({"analysis": {"interval": "1 minute"}}, "analysis.interval"),
    ],
    ids=[
        "head-without-flash-attn",
        "steps-decreasing",
        "step-over-100",
        "gateway-without-route",
        "holdout",
        "duration",
    ],
)
def test_model_rejects_what_the_crd_rejects(change: dict[str, Any], field: str) -> None:
    """The CLI validates specs without an API server: the pydantic cross-field rules mirror the CRD's CEL."""
    spec = yaml.safe_load((REPO / "examples" / "minimal-per-tensor.yaml").read_text())["spec"]
    for section, values in change.items():
        target = spec.setdefault(section, {})
        for key, value in values.items():
            if isinstance(value, dict):
                target.setdefault(key, {}).update(value)
            else:
                target[key] = value
    with pytest.raises(ValidationError, match=field):
        KVCalibrationSpec.model_validate(spec)
