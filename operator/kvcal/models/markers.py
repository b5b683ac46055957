"""What only the API server checks, declared beside the field or model it guards: CEL rules, list types and the
enums of operator-written fields. kvcal.models.crd copies these into the CRD (via pydantic's json_schema_extra).

Bounds, patterns, enums of the spec and defaults are not markers: they are pydantic constraints, which the model
enforces too, so the CRD and `kvcal validate` cannot drift on them."""

from collections.abc import Iterable
from enum import Enum
from typing import Literal

from pydantic.config import JsonDict, JsonValue

# The keys a marker may add to a schema node (tests/unit/test_models_crd.py holds every json_schema_extra to these).
MARKER_KEYS = frozenset(
    {
        "x-kubernetes-validations",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-int-or-string",
        "x-kubernetes-preserve-unknown-fields",
        "enum",
        "format",
    }
)

Reason = Literal["FieldValueInvalid", "FieldValueRequired", "FieldValueForbidden", "FieldValueDuplicate"]


def cel(
    rule: str,
    message: str = "",
    *,
    message_expression: str = "",
    field_path: str = "",
    reason: Reason | None = None,
) -> JsonDict:
    """One x-kubernetes-validations entry. The message starts with the field it names, as the model's do."""
    entry: JsonDict = {"rule": rule}
    if field_path:
        entry["fieldPath"] = field_path
    if reason:
        entry["reason"] = reason
    if message:
        entry["message"] = message
    if message_expression:
        entry["messageExpression"] = message_expression
    return entry


def kube(
    *rules: JsonDict,
    list_type: Literal["atomic", "set", "map"] | None = None,
    list_map_keys: Iterable[str] = (),
    enum: type[Enum] | None = None,
    format: str | None = None,
    int_or_string: bool = False,
    preserve_unknown_fields: bool = False,
) -> JsonDict:
    """A json_schema_extra for Field(...) or ConfigDict(...). `enum` is for status fields that hold plain strings in
    Python (a descriptor may name a new phase) while the API server keeps to the enum."""
    extra: JsonDict = {}
    if rules:
        extra["x-kubernetes-validations"] = list(rules)
    if list_type:
        extra["x-kubernetes-list-type"] = list_type
    keys: list[JsonValue] = list(list_map_keys)
    if keys:
        extra["x-kubernetes-list-map-keys"] = keys
    if enum is not None:
        extra["enum"] = [member.value for member in enum]
    if format:
        extra["format"] = format
    if int_or_string:
        extra["x-kubernetes-int-or-string"] = True
    if preserve_unknown_fields:
        extra["x-kubernetes-preserve-unknown-fields"] = True
    return extra
