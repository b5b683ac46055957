"""pydantic's validation errors as one line per problem, each naming the field as it is spelled on the wire."""

import re

from pydantic import ValidationError


def field_path(location: tuple[int | str, ...], root: str = "spec") -> str:
    """('analysis', 'latency', 0, 'quantile') -> 'spec.analysis.latency[0].quantile'."""
    path = root
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def describe(error: ValidationError, root: str = "spec") -> list[str]:
    """'spec.calibration.samples: Input should be greater than or equal to 1', one per problem. Our validators'
    messages start with the field, as the CRD's CEL messages do ('spec.analysis.latency[].quantile must be ...'):
    that field is shown once, with the list index filled in."""
    lines = []
    for problem in error.errors():
        path = field_path(tuple(problem["loc"]), root)
        message = problem["msg"].removeprefix("Value error, ")
        named, _, rest = message.partition(" ")
        named = named.rstrip(":")
        if named.replace("[]", "") == re.sub(r"\[\d+\]", "", path):
            lines.append(f"{path}: {rest}")
        elif named.startswith(f"{root}."):  # a rule of the enclosing object naming one of its fields
            lines.append(f"{named}: {rest}")
        else:
            lines.append(f"{path}: {message}")
    return lines
