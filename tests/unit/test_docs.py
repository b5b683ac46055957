"""The docs stay true: the CRD reference is regenerated from the schema, links resolve, every spec/status field and
kvcal command the docs mention exists, and every KVCalibration shown in them is valid."""

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal.cli import SUBCOMMANDS
from kvcal.models import crd_reference
from kvcal.models.spec import KVCalibrationSpec

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CRD = yaml.safe_load((ROOT / "crds" / "kvcal.dev_kvcalibrations.yaml").read_text())
SCHEMA = next(v for v in CRD["spec"]["versions"] if v.get("storage"))["schema"]["openAPIV3Schema"]
PAGES = sorted(DOCS.glob("*.md"))
HAND_WRITTEN = [p for p in PAGES if p.name != "crd-reference.md"]
REQUIRED_PAGES = {
    "concepts.md",
    "quickstart.md",
    "crd-reference.md",
    "operations.md",
    "troubleshooting.md",
    "local-trial.md",
}

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
# kubectl -o jsonpath='{.status.x}' and '{range .status.y[*]}' references.
JSONPATH = re.compile(r"\{(?:range )?\.((?:spec|status)(?:\.[A-Za-z0-9]+)+)")
FIELD = re.compile(r"(?<![\w./-])((?:spec|status)(?:\.[A-Za-z0-9]+(?:\[\])?)+)")


def code_blocks(page: Path, *languages: str) -> Iterator[str]:
    for lang, body in FENCE.findall(page.read_text()):
        if not languages or lang in languages:
            yield body


def schema_has(path: str) -> bool:
    node: dict[str, Any] = SCHEMA
    for part in path.split("."):
        array = part.endswith("[]")
        props = node.get("properties", {})
        if part.removesuffix("[]") not in props:
            return False
        node = props[part.removesuffix("[]")]
        if array or (node.get("type") == "array" and "properties" in node.get("items", {})):
            node = node.get("items", node)
    return True


def test_crd_reference_is_up_to_date() -> None:
    assert crd_reference.render(CRD) == (DOCS / "crd-reference.md").read_text(), "run: python -m kvcal.generated"


def test_crd_reference_lists_every_field() -> None:
    reference = (DOCS / "crd-reference.md").read_text()

    def walk(node: dict[str, Any], path: str) -> Iterator[str]:
        for name, child in node.get("properties", {}).items():
            yield f"{path}.{name}"
            inner = child.get("items", child) if child.get("type") == "array" else child
            yield from walk(inner, f"{path}.{name}[]" if child.get("type") == "array" else f"{path}.{name}")

    fields = [*walk(SCHEMA["properties"]["spec"], "spec"), *walk(SCHEMA["properties"]["status"], "status")]
    assert len(fields) > 50
    missing = [f for f in fields if f"`{f}`" not in reference]
    assert missing == []


def test_required_pages_exist() -> None:
    assert {p.name for p in PAGES} >= REQUIRED_PAGES


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    prose = re.sub(r"`[^`\n]*`", "", FENCE.sub("", page.read_text()))  # links live outside code
    for target in LINK.findall(prose):
        if re.match(r"^(https?|mailto):", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        assert (page.parent / path).exists(), f"{page.name}: broken link {target}"


@pytest.mark.parametrize("page", HAND_WRITTEN, ids=lambda p: p.name)
def test_field_paths_exist_in_the_crd(page: Path) -> None:
    text = page.read_text()
    mentioned = {m.rstrip(".") for m in FIELD.findall(text)}
    # jsonpath on KVCalibrations only (a `get deploy ... -o jsonpath` names a Deployment's fields).
    mentioned |= {m for line in text.splitlines() if "get kvcal" in line for m in JSONPATH.findall(line)}
    unknown = sorted(f for f in mentioned if not schema_has(f))
    assert unknown == [], f"{page.name} names fields the CRD does not have"


@pytest.mark.parametrize("page", HAND_WRITTEN, ids=lambda p: p.name)
def test_kvcal_commands_are_real_subcommands(page: Path) -> None:
    for block in code_blocks(page, "bash", "sh", "console", ""):
        for line in block.splitlines():
            m = re.match(r"^\s*(?:\$ )?(?:kubectl )?kvcal (\S+)", line)
            if m and not m[1].startswith("-"):
                assert m[1] in SUBCOMMANDS, f"{page.name}: `kvcal {m[1]}` is not a subcommand: {line.strip()}"


@pytest.mark.parametrize("page", HAND_WRITTEN, ids=lambda p: p.name)
def test_kvcalibrations_shown_are_valid(page: Path) -> None:
    for block in code_blocks(page, "yaml"):
        for doc in yaml.safe_load_all(block):
            if isinstance(doc, dict) and doc.get("kind") == "KVCalibration":
                assert doc["apiVersion"] == "kvcal.dev/v1alpha1"
                KVCalibrationSpec.model_validate(doc["spec"])


def test_helm_values_in_docs_exist() -> None:
    values = yaml.safe_load((ROOT / "charts" / "kvcal" / "values.yaml").read_text())
    for page in HAND_WRITTEN:
        for key in re.findall(r"--set ([A-Za-z0-9_.]+)=", page.read_text()):
            node: Any = values
            for part in key.split("."):
                assert isinstance(node, dict) and part in node, f"{page.name}: --set {key}: no such chart value"
                node = node[part]


def section(text: str, heading: str) -> str:
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"troubleshooting.md has no section '## {heading}'"
    return m[1]


@pytest.mark.parametrize(
    "heading",
    [
        "The scales are not loaded",
        "Quality drops on long contexts",
        "Latency does not improve",
        "Rare prompt types fail",
    ],
)
def test_troubleshooting_symptom_shows_a_command_and_a_status_field(heading: str) -> None:
    body = section((DOCS / "troubleshooting.md").read_text(), heading)
    assert re.search(r"```(bash|promql)\n", body), f"'{heading}': no command to run"
    assert FIELD.search(body), f"'{heading}': no status/spec field to read"


def test_generator_flags_a_stale_reference(tmp_path: Path) -> None:
    """The staleness check can fail: a reference rendered from a changed schema differs."""
    module = crd_reference
    current = module.render(CRD)
    changed = yaml.safe_load((ROOT / "crds" / "kvcal.dev_kvcalibrations.yaml").read_text())
    storage = next(v for v in changed["spec"]["versions"] if v.get("storage"))
    storage["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["model"]["description"] = "changed"
    assert module.render(changed) != current
    assert current == (DOCS / "crd-reference.md").read_text()


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_local_trial_fits_the_demo_example_and_the_kind_mount() -> None:
    """docs/local-trial.md's pieces agree: the kind mount, the baseline it deploys, the KVCalibration it applies."""
    from kvcal.core.manifests.canary import build_canary_workload
    from kvcal.core.manifests.common import Owner

    example = yaml.safe_load((ROOT / "examples" / "demo-cpu.yaml").read_text())
    spec = KVCalibrationSpec.model_validate(example["spec"])
    trial = load_yaml_docs(DOCS / "local-trial" / "smollm2.yaml")
    baseline = next(
        d for d in trial if d["kind"] == "Deployment" and d["metadata"]["name"] == spec.serving.baseline.deployment
    )
    assert any(d["kind"] == "Service" and d["metadata"]["name"] == spec.serving.baseline.service for d in trial)

    (node,) = yaml.safe_load((ROOT / "kind-config.yaml").read_text())["nodes"]
    mounted = {m["containerPath"] for m in node["extraMounts"]}
    for uri in (spec.model.source, spec.calibration.output):
        assert uri.startswith("hostpath://") and any(uri.removeprefix("hostpath://").startswith(m) for m in mounted)

    # The operator can turn this baseline into a canary: it finds the model path and swaps in the checkpoint.
    canary = build_canary_workload(Owner(example["metadata"]["name"], "kvcal-demo", "uid-1"), spec, baseline, 1)
    pod = canary["spec"]["template"]["spec"]
    container = pod["containers"][0]
    argv = [*container.get("command", []), *container["args"]]
    assert argv[:2] == ["vllm", "serve"] and spec.model.source.removeprefix("hostpath://") not in argv
    # The new model argument is where the calibrated checkpoint's hostPath volume is mounted.
    checkpoint = spec.calibration.output.removeprefix("hostpath://")
    volume = next(v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == checkpoint)
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert argv[2].startswith(mount["mountPath"])
    assert argv[argv.index("--served-model-name") + 1] == "smollm2"
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8_e4m3"


def test_local_trial_manifests_parse_and_run_non_root() -> None:
    for path in sorted((DOCS / "local-trial").glob("*.yaml")):
        for doc in load_yaml_docs(path):
            if doc["kind"] == "Deployment":
                pod = doc["spec"]["template"]["spec"]
                assert pod["securityContext"]["runAsNonRoot"] is True, f"{path.name}: {doc['metadata']['name']}"
