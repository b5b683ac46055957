"""The CRD is generated from the models (kvcal.models.crd): the committed files are its output, the output is a
structural schema, and it still teaches through descriptions and names fields in its CEL messages."""

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field

from kvcal import generated
from kvcal.models import crd
from kvcal.models.markers import cel, kube
from kvcal.models.spec import KVCalibrationSpec, PromotionSpec
from kvcal.models.status import Phase

REPO = Path(__file__).resolve().parents[2]
GENERATED = crd.build()
VERSION = GENERATED["spec"]["versions"][0]
ROOT = VERSION["schema"]["openAPIV3Schema"]


def _nodes(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from _nodes(prop, f"{path}.{name}")
    if "items" in schema:
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def _committed(root: Path = REPO) -> dict[Path, str | None]:
    return {target: (root / target).read_text() if (root / target).is_file() else None for target in crd.TARGETS}


def test_committed_crd_and_chart_copy_are_the_generators_output() -> None:
    problems = crd.stale(_committed(), crd.render(GENERATED))
    assert not problems, "\n".join(problems)
    assert sorted(p.name for p in (REPO / "charts" / "kvcal" / "crds").iterdir()) == [crd.TARGETS[1].name]


class _WithExtraField(KVCalibrationSpec):
    surplus: int = Field(default=0, description="A field the committed CRD lacks.")


class _WithExtraRule(KVCalibrationSpec):
    promotion: PromotionSpec = Field(
        default=PromotionSpec(),
        json_schema_extra=kube(cel("self.mode == 'auto'", "spec.promotion must be auto")),
        description="What happens after the analysis passes.",
    )


@pytest.mark.parametrize("drifted", [_WithExtraField, _WithExtraRule], ids=["extra-field", "extra-cel-rule"])
def test_the_check_reports_a_model_the_committed_crd_does_not_match(drifted: type[KVCalibrationSpec]) -> None:
    problems = crd.stale(_committed(), crd.render(crd.build(spec=drifted)))
    assert [p.split(" ")[0] for p in problems] == [str(target) for target in crd.TARGETS]
    assert all(crd.COMMAND in problem for problem in problems)


def test_main_writes_both_files_and_check_then_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m kvcal.generated` is the one command: in a checkout without the CRDs its check fails naming them,
    and once it has written them they are the committed ones."""
    for artifact in generated.ARTIFACTS:  # every other generated file as committed
        if Path(artifact.path) not in crd.TARGETS:
            (tmp_path / artifact.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / artifact.path, tmp_path / artifact.path)
    assert generated.main(["--check", "--root", str(tmp_path)]) == 1
    assert f"is stale: run {crd.COMMAND}" in capsys.readouterr().err
    assert generated.main(["--root", str(tmp_path)]) == 0
    assert generated.main(["--check", "--root", str(tmp_path)]) == 0
    assert _committed(tmp_path) == _committed()


class _BoundInAnExtra(BaseModel):
    count: int = Field(json_schema_extra={"maximum": 5}, description="A bound the model would not enforce.")


class _UnexpressibleConstraint(BaseModel):
    count: int = Field(multiple_of=2, description="A constraint OpenAPI could say, the generator does not.")


@pytest.mark.parametrize("model", [_BoundInAnExtra, _UnexpressibleConstraint], ids=["bound-in-extra", "multiple-of"])
def test_a_constraint_only_one_side_would_enforce_is_refused(model: type[BaseModel]) -> None:
    """Bounds come from pydantic constraints (the model enforces them too), never from json_schema_extra; a
    constraint with no OpenAPI twin is an error, not silently dropped."""
    with pytest.raises(TypeError, match=r"^_\w+\.count: "):
        crd.object_schema(model)


def test_model_level_rules_land_on_the_object() -> None:
    class Guarded(BaseModel):
        model_config = ConfigDict(json_schema_extra=kube(cel("has(self.a)", "a must be set", field_path=".a")))
        a: int | None = Field(default=None, description="The guarded field.")

    schema = crd.object_schema(Guarded)
    rule = {"rule": "has(self.a)", "fieldPath": ".a", "message": "a must be set"}
    assert schema["x-kubernetes-validations"] == [rule]
    assert schema["properties"]["a"] == {"type": "integer", "description": "The guarded field."}


class _Kubernetesy(BaseModel):
    port: int | str | None = Field(default=None, description="A port number or name.")
    labels: dict[str, str] = Field(default={}, description="Free labels.")
    raw: dict[str, Any] | None = Field(default=None, description="Passed through as is.")
    share: float = Field(default=0.5, gt=0, lt=1, description="Strictly between 0 and 1.")


def test_kubernetes_shapes_have_their_openapi_spelling() -> None:
    """int | str, maps, free-form objects and exclusive bounds, as OpenAPI v3.0 (the API server's dialect) says them."""
    properties = crd.object_schema(_Kubernetesy)["properties"]
    assert properties["port"]["x-kubernetes-int-or-string"] is True and "type" not in properties["port"]
    assert properties["labels"]["additionalProperties"] == {"type": "string"}
    assert properties["raw"]["x-kubernetes-preserve-unknown-fields"] is True
    share = _Kubernetesy.model_fields["share"]
    assert (properties["share"]["minimum"], properties["share"]["maximum"]) == (
        share.metadata[0].gt,
        share.metadata[1].lt,
    )
    assert properties["share"]["exclusiveMinimum"] is properties["share"]["exclusiveMaximum"] is True


def test_the_schema_is_structural() -> None:
    """No construct the API server refuses in a structural schema; Optional is the plain type."""
    banned = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "title", "nullable", "const"}
    for path, node in _nodes(ROOT, ""):
        assert not banned & set(node), f"{path}: {sorted(banned & set(node))}"
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path}: no type"
        if "properties" in node:
            assert node["type"] == "object" and set(node.get("required", [])) <= set(node["properties"]), path


def test_status_phases_are_the_phase_enum() -> None:
    """Status fields hold plain strings in Python; the API server keeps them to kvcal.models.status.Phase."""
    status = ROOT["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == list(Phase) == status["history"]["items"]["properties"]["phase"]["enum"]
    assert status["phase"]["default"] == Phase.PENDING


def test_names_scope_and_subresources() -> None:
    assert GENERATED["metadata"]["name"] == "kvcalibrations.kvcal.dev"
    assert GENERATED["spec"]["scope"] == "Namespaced"
    assert GENERATED["spec"]["names"]["shortNames"] == ["kvcal"]
    assert "kvcal" in GENERATED["spec"]["names"]["categories"]
    assert (VERSION["name"], VERSION["served"], VERSION["storage"]) == ("v1alpha1", True, True)
    assert VERSION["subresources"] == {"status": {}}


def test_printer_columns_point_at_fields_of_the_schema() -> None:
    columns = {c["name"]: c["jsonPath"] for c in VERSION["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase"
    assert columns["Model"] == ".spec.model.source"
    assert columns["Strategy"] == ".spec.calibration.strategy"
    assert columns["Weight"] == ".status.canary.weight"
    assert columns["TTFT-p95-Delta"] == ".status.analysis.ttftP95Delta"
    assert columns["Age"] == ".metadata.creationTimestamp"
    paths = {path for path, _ in _nodes(ROOT, "")}
    for name, json_path in columns.items():
        assert json_path.startswith(".metadata.") or json_path in paths, f"column {name}: {json_path} is no field"


def test_every_field_has_a_description() -> None:
    undocumented = [
        p
        for p, node in _nodes(ROOT, "")
        if p not in ("", ".metadata") and not p.endswith(("[]", "{}")) and not node.get("description")
    ]
    assert not undocumented, f"add a Field(description=...) (kubectl explain shows it) to: {undocumented}"


def test_status_is_typed() -> None:
    preserved = [p for p, node in _nodes(ROOT, "") if node.get("x-kubernetes-preserve-unknown-fields")]
    assert not preserved, f"status and spec are fully typed; found preserve-unknown-fields at {preserved}"


def test_cel_messages_name_the_field() -> None:
    rules = [(p, r) for p, node in _nodes(ROOT, "") for r in node.get("x-kubernetes-validations", [])]
    assert len(rules) >= 10
    for path, rule in rules:
        field = path.replace("[]", "").lstrip(".") + rule.get("fieldPath", "")
        assert rule["message"].replace("[]", "").startswith(field), f"{path}: the message must start with {field}"


def test_the_committed_crd_loads_as_the_generated_dict() -> None:
    """What kubectl applies is what build() returns (the YAML round trip loses nothing)."""
    for target in crd.TARGETS:
        assert yaml.safe_load((REPO / target).read_text()) == GENERATED, target
