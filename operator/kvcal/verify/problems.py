"""A problem found by the verifier, and the summary the verification Job leaves in its termination message."""

import json
from dataclasses import asdict, dataclass
from typing import Any

TERMINATION_LIMIT = 4096  # bytes Kubernetes keeps of a container's termination message


@dataclass(frozen=True)
class Problem:
    code: str  # short machine-readable kind: missing, legacy-name, not-finite, shape, clipped, runtime-missing, ...
    message: str
    layer: int | None = None
    tensor: str | None = None  # checkpoint tensor name, or a file such as config.json

    def line(self) -> str:
        where = " ".join(p for p in (f"layer {self.layer}" if self.layer is not None else "", self.tensor or "") if p)
        return f"{where}: {self.message}" if where else self.message

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def termination_summary(
    ok: bool, layers: int, mismatches: int, problems: list[str], notes: list[str] | None = None
) -> str:
    """JSON of at most TERMINATION_LIMIT bytes: problems are dropped from the end, with a count of what was cut."""
    summary: dict[str, Any] = {"ok": ok, "layers": layers, "mismatches": mismatches, "problems": list(problems)}
    if notes:
        summary["notes"] = list(notes)
    text = json.dumps(summary, separators=(",", ":"))
    kept = list(problems)
    while len(text.encode()) > TERMINATION_LIMIT:
        if len(kept) > 1:  # keep the first problems and the notes (one-line summaries); drop from the end
            kept.pop()
            summary["problems"] = [*kept, f"... {len(problems) - len(kept)} more problems"]
        elif summary.get("notes"):
            summary["notes"] = summary["notes"][:-1]
        else:  # only a single huge line left: cut the text itself
            summary["problems"] = [p[:200] for p in summary["problems"]]
        text = json.dumps(summary, separators=(",", ":"))
    return text
