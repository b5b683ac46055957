"""The pydantic models (operator/kvcal/models) and the CRD generated from them (crds/) describe the same resource.

kvcal.models.crd writes the CRD from the models; these walks check its translation independently: every model field
is a CRD property and vice versa, with the same required-ness, type, enum and default (the CRD's default after the
API server's structural defaulting, emulated here, is the model's: a nested model's `{}` must fill in to its
defaults; the cluster test checks the real defaulting).
"""

import copy
import enum
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import annotated_types
import pytest
import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from kvcal.core.manifests.common import SCHEMES, locate
from kvcal.models.spec import (
    CHECKPOINT_PATTERN,
    DATASET_PATTERN,
    DATASET_SOURCE_MESSAGE,
    MODEL_SOURCE_MESSAGE,
    OUTPUT_MESSAGE,
    KVCalibrationSpec,
)
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


# Every storage URI of a spec: (field, keys under spec, a directory?, its CRD pattern and message).
STORAGE_URIS = (
    ("spec.model.source", ("model", "source"), True, CHECKPOINT_PATTERN, MODEL_SOURCE_MESSAGE),
    ("spec.calibration.dataset.source", ("calibration", "dataset", "source"), False, DATASET_PATTERN,
     DATASET_SOURCE_MESSAGE),
    ("spec.calibration.output", ("calibration", "output"), True, CHECKPOINT_PATTERN, OUTPUT_MESSAGE),
)  # fmt: skip


def _at(node: dict[str, Any], keys: tuple[str, ...], step: str = "") -> Any:
    for key in keys:
        node = node[step][key] if step else node[key]
    return node


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_storage_uris_are_ones_the_operator_mounts(path: Path) -> None:
    """An example must run as written: each source and output is a URI locate() turns into a volume the calibration
    Job and vLLM mount (read from the raw YAML, so a scheme the model also refuses fails here with locate's word)."""
    spec = yaml.safe_load(path.read_text())["spec"]
    for field, keys, directory, _, _ in STORAGE_URIS:
        uri = _at(spec, keys)
        try:
            location = locate(uri, field=field, directory=directory)
        except ValueError as error:
            pytest.fail(f"{path.name}: {error}")
        assert location.volume and location.path.startswith(location.mount_path), f"{path.name}: {field} {uri!r}"


@pytest.mark.parametrize("uri", ["s3://bucket/llama", "gs://bucket/llama", "https://hub/llama"])
def test_locate_refuses_what_it_cannot_mount_naming_the_field_and_the_fix(uri: str) -> None:
    with pytest.raises(ValueError, match=r"^spec\.model\.source: scheme .* not supported; use pvc://.*copy") as error:
        locate(uri, field="spec.model.source")
    assert uri in str(error.value)


def test_the_crd_accepts_only_schemes_locate_mounts() -> None:
    """One source of truth: every scheme in the CRD's storage patterns (and so the model's) is one of
    kvcal.core.manifests.common.SCHEMES, and the model's patterns and messages are the CRD's."""
    for field, keys, _, pattern, message in STORAGE_URIS:
        (rule, *_) = _at(ROOT["properties"]["spec"], keys, "properties")["x-kubernetes-validations"]
        assert rule["rule"] == f"self.matches('{pattern}')", field
        assert rule["message"] == message and "s3://" in message, field
        schemes = set(re.findall(r"([a-z0-9]+)://", pattern))
        assert schemes and schemes <= set(SCHEMES), f"{field}: {schemes - set(SCHEMES)} is not mounted by locate()"
        with pytest.raises(ValidationError, match=re.escape(message)):
            KVCalibrationSpec.model_validate(_minimal_with(keys, "s3://bucket/a/b.jsonl"))


def _minimal_with(keys: tuple[str, ...], uri: str) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((REPO / "examples" / "minimal-per-tensor.yaml").read_text())["spec"]
    _at(spec, keys[:-1])[keys[-1]] = uri
    return spec


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
