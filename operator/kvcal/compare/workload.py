"""What every configuration is asked, identically: held-out texts scored with prompt logprobs, the probe suite
(exact match, arithmetic, code) and needle-in-a-haystack probes at several context lengths, all greedy."""

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from kvcal.probes import Probe, builtin_suite, needle_length_for


@dataclass(frozen=True)
class HoldoutItem:
    """A held-out sample: plain text (scored via /v1/completions) or chat messages (via /v1/chat/completions)."""

    text: str | None = None
    messages: tuple[dict[str, str], ...] | None = None


def parse_holdout(lines: list[str], source: str, max_chars: int) -> list[HoldoutItem]:
    """JSON lines with `text` or `messages` (the calibration data format); long texts are cut to `max_chars`."""
    items = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record: Any = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{source}:{number}: not JSON ({err.msg}); expected {{'text': ...}} per line") from None
        if isinstance(record, dict) and isinstance(record.get("text"), str):
            items.append(HoldoutItem(text=record["text"][:max_chars]))
        elif isinstance(record, dict) and isinstance(record.get("messages"), list):
            messages = tuple(
                {"role": str(m["role"]), "content": str(m["content"])[:max_chars]} for m in record["messages"]
            )
            items.append(HoldoutItem(messages=messages))
        else:
            raise ValueError(f"{source}:{number}: needs a 'text' string or a 'messages' list")
    if not items:
        raise ValueError(f"{source}: no samples")
    return items


def load_holdout(path: Path | None, max_chars: int, limit: int) -> list[HoldoutItem]:
    """`--holdout FILE`, else the held-out set bundled with the calibrator (never used for calibration)."""
    if path is not None:
        return parse_holdout(path.read_text().splitlines(), str(path), max_chars)[:limit]
    text = resources.files("kvcal").joinpath("data/holdout.jsonl").read_text(encoding="utf-8")
    return parse_holdout(text.splitlines(), "kvcal/data/holdout.jsonl", max_chars)[:limit]


def needle_lengths(max_model_len: int) -> list[int]:
    """Powers of two from 512, and one close to the model's limit (leaving room for the question and answer)."""
    top = needle_length_for(max_model_len)
    lengths = [n for n in (512, 1024, 2048, 4096, 8192, 16384, 32768) if n < top * 0.9]
    return [*lengths, top]


def probes(max_model_len: int) -> list[Probe]:
    return list(builtin_suite(needle_lengths(max_model_len)).probes)
