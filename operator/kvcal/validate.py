"""`kvcal validate FILE...`: lint KVCalibrations offline (GitOps CI) with the same rules the API server applies.

Reads YAML files of one or more documents (`-` is stdin), checks every KVCalibration (also inside a `kind: List`)
with the pydantic model that mirrors the CRD, and prints one line per problem naming the field. Other kinds are
skipped. Exit 1 on any problem, 0 when every KVCalibration is valid.
"""

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kvcal.core.manifests.common import API_VERSION, KIND
from kvcal.models.errors import describe
from kvcal.models.spec import KVCalibrationSpec

TOP_LEVEL_FIELDS = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})
HELP = "lint KVCalibration YAML files offline: every field the API server would reject, named (exit 1 on any)"


def _documents(text: str) -> Iterator[Any]:
    for document in yaml.safe_load_all(text):
        if isinstance(document, dict) and document.get("kind") == "List":
            yield from document.get("items") or []
        else:
            yield document


def problems_of(document: dict[str, Any]) -> list[str]:
    """What the API server would reject in one KVCalibration (its status is the operator's and not checked)."""
    found = []
    if document.get("apiVersion") != API_VERSION:
        found.append(f"apiVersion: {document.get('apiVersion')!r} is not served; use {API_VERSION}")
    found += [f"{key}: unknown field" for key in sorted(set(document) - TOP_LEVEL_FIELDS)]
    metadata = document.get("metadata")
    if not isinstance(metadata, dict) or not (metadata.get("name") or metadata.get("generateName")):
        found.append("metadata.name: Required value")
    if not isinstance(document.get("spec"), dict):
        return [*found, "spec: Required value (an object)"]
    try:
        KVCalibrationSpec.model_validate(document["spec"])
    except ValidationError as error:
        found += describe(error)
    return found


def validate_text(text: str, source: str) -> tuple[int, list[str]]:
    """(KVCalibrations checked, problem lines prefixed with the source, the document's index and name)."""
    try:
        documents = list(_documents(text))
    except yaml.YAMLError as error:
        return 0, [f"{source}: not valid YAML: {error}"]
    checked, lines = 0, []
    for index, document in enumerate(documents, start=1):
        if not isinstance(document, dict) or document.get("kind") != KIND:
            continue
        checked += 1
        name = (document.get("metadata") or {}).get("name") or "?"
        lines += [f"{source}: document {index} ({KIND} {name}): {p}" for p in problems_of(document)]
    return checked, lines


def run(args: argparse.Namespace) -> int:
    checked, failed = 0, False
    for file in args.files:
        try:
            text = sys.stdin.read() if file == "-" else Path(file).read_text()
        except OSError as error:
            print(f"{file}: {error.strerror or error}", file=sys.stderr)
            failed = True
            continue
        count, lines = validate_text(text, file)
        checked += count
        failed |= bool(lines)
        for line in lines:
            print(line)
    print(f"{checked} {KIND} object(s) checked: {'problems found' if failed else 'all valid'}", file=sys.stderr)
    return 1 if failed else 0


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = sub.add_parser("validate", help=HELP, description=HELP)
    parser.add_argument("files", metavar="FILE", nargs="+", help="YAML file(s), one or more documents each; - = stdin")
    parser.set_defaults(func=run)
