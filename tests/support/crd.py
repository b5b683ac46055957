"""The KVCalibration CRD as committed (crds/), its spec schema, and the OpenAPI keywords that bound a value."""

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((REPO / "crds" / "kvcal.dev_kvcalibrations.yaml").read_text())
SPEC_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
# OpenAPI and JSON Schema spell these the same.
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems",
          "maxItems", "pattern")  # fmt: skip
