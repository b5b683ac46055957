"""Static checks of the CRD: teaches through descriptions, names fields in its CEL messages, chart copy in sync."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "kvcal.dev_kvcalibrations.yaml"
CRD = yaml.safe_load(CRD_FILE.read_text())
VERSION = CRD["spec"]["versions"][0]
ROOT = VERSION["schema"]["openAPIV3Schema"]


def _nodes(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from _nodes(prop, f"{path}.{name}")
    if "items" in schema:
        yield from _nodes(schema["items"], f"{path}[]")


def test_chart_crd_is_a_byte_identical_copy() -> None:
    chart_copy = REPO / "charts" / "kvcal" / "crds" / CRD_FILE.name
    assert chart_copy.read_bytes() == CRD_FILE.read_bytes(), "run: cp crds/*.yaml charts/kvcal/crds/"
    assert sorted(p.name for p in (REPO / "charts" / "kvcal" / "crds").iterdir()) == [CRD_FILE.name]


def test_names_scope_and_subresources() -> None:
    assert CRD["metadata"]["name"] == "kvcalibrations.kvcal.dev"
    assert CRD["spec"]["scope"] == "Namespaced"
    assert CRD["spec"]["names"]["shortNames"] == ["kvcal"]
    assert "kvcal" in CRD["spec"]["names"]["categories"]
    assert (VERSION["name"], VERSION["served"], VERSION["storage"]) == ("v1alpha1", True, True)
    assert VERSION["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    columns = {c["name"]: c["jsonPath"] for c in VERSION["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase"
    assert columns["Model"] == ".spec.model.source"
    assert columns["Strategy"] == ".spec.calibration.strategy"
    assert columns["Weight"] == ".status.canary.weight"
    assert columns["TTFT-p95-Delta"] == ".status.analysis.ttftP95Delta"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_every_field_has_a_description() -> None:
    undocumented = [
        p
        for p, node in _nodes(ROOT, "")
        if p not in ("", ".metadata") and not p.endswith("[]") and not node.get("description")
    ]
    assert not undocumented, f"add a description (kubectl explain shows it) to: {undocumented}"


def test_status_is_typed() -> None:
    preserved = [p for p, node in _nodes(ROOT, "") if node.get("x-kubernetes-preserve-unknown-fields")]
    assert not preserved, f"status and spec are fully typed; found preserve-unknown-fields at {preserved}"


def test_cel_messages_name_the_field() -> None:
    rules = [(p, r) for p, node in _nodes(ROOT, "") for r in node.get("x-kubernetes-validations", [])]
    assert len(rules) >= 10
    for path, rule in rules:
        field = path.replace("[]", "").lstrip(".") + rule.get("fieldPath", "")
        assert rule["message"].replace("[]", "").startswith(field), f"{path}: the message must start with {field}"
