"""Calibration data: JSONL parsing (line-numbered errors), tokenization as vLLM's server does it, a deterministic
calibration/holdout split, length-bucket sampling toward a target distribution, and counted truncation."""

import hashlib
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


class DatasetError(ValueError):
    """Bad calibration data; the message names the file, line and fix."""


@dataclass(frozen=True)
class Record:
    source: str  # "FILE:LINE"
    kind: Literal["chat", "text"]
    messages: tuple[tuple[str, str], ...] = ()
    text: str = ""


@dataclass(frozen=True)
class Sample:
    source: str
    kind: str
    input_ids: tuple[int, ...]
    original_length: int

    @property
    def truncated(self) -> bool:
        return self.original_length > len(self.input_ids)


class Tokenizer(Protocol):
    """The slice of a Hugging Face tokenizer used here."""

    chat_template: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def __call__(self, text: str, **kwargs: Any) -> Any: ...


def jsonl_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if not files:
            raise DatasetError(f"{path}: folder has no *.jsonl files; point --data at a JSONL file or a folder of them")
        return files
    if not path.is_file():
        raise DatasetError(f"{path}: dataset not found; pass an existing JSONL file or folder with --data")
    return [path]


def parse_line(line: str, where: str) -> Record:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{where}: not valid JSON ({e.msg} at column {e.colno}); one JSON object per line") from e
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: expected a JSON object with 'messages' or 'text', got {type(obj).__name__}")
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise DatasetError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
        out = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in ROLES:
                raise DatasetError(
                    f"{where}: messages[{i}] must be {{'role': one of {sorted(ROLES)}, 'content': string}}"
                )
            out.append((str(m["role"]), str(m["content"])))
        return Record(where, "chat", messages=tuple(out))
    if "text" in obj:
        if not isinstance(obj["text"], str) or not obj["text"].strip():
            raise DatasetError(f"{where}: 'text' must be a non-empty string")
        return Record(where, "text", text=obj["text"])
    raise DatasetError(f"{where}: object has neither 'messages' nor 'text' (keys: {sorted(obj)})")


def read_records(path: Path) -> list[Record]:
    """All records of a JSONL file or folder; blank lines are skipped; errors name FILE:LINE."""
    records: list[Record] = []
    for file in jsonl_files(path):
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DatasetError(f"{file}: cannot read as UTF-8 text ({e}); check the file and its permissions") from e
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                records.append(parse_line(line, f"{file}:{n}"))
    if not records:
        raise DatasetError(f"{path}: dataset is empty; add JSONL lines with 'messages' or 'text'")
    return records


def content_hash(paths: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        for f in jsonl_files(p):
            h.update(f.read_bytes())
    return h.hexdigest()


def render(record: Record, tokenizer: Tokenizer) -> list[int]:
    """Token ids as vLLM's OpenAI server builds them: chat -> the tokenizer's chat template (generation prompt
    added unless the conversation ends with the assistant's answer, which then sits in the KV cache too), tokenized
    without extra special tokens; text -> tokenized like /v1/completions (special tokens added)."""
    if record.kind == "chat":
        if not tokenizer.chat_template:
            raise DatasetError(f"{record.source}: chat record but the tokenizer has no chat template; use 'text'")
        msgs = [{"role": r, "content": c} for r, c in record.messages]
        prompt = tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=record.messages[-1][0] != "assistant"
        )
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(record.text, add_special_tokens=True)["input_ids"]
    return [int(i) for i in ids]


def split_indices(n: int, holdout_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Deterministic (calibration, holdout) index lists: a seeded shuffle, the first ceil(f*n) held out."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    k = min(n - 1, max(1, math.ceil(holdout_fraction * n))) if n > 1 else 0
    return sorted(order[k:]), sorted(order[:k])


def bucket_of(length: int, edges: Sequence[int]) -> int:
    """Upper bound of the first bucket holding `length` (the last edge for anything longer)."""
    return next((e for e in edges if length <= e), edges[-1])


def allocate(available: dict[int, int], weights: dict[int, float], n: int) -> dict[int, int]:
    """How many samples to take per bucket: proportional to weights (largest remainder), capped by what each bucket
    holds; a shortfall goes to the remaining buckets in weight order, then to any bucket with samples left."""
    take = dict.fromkeys(available, 0)
    left = n
    active = {b for b in available if available[b] > 0 and weights.get(b, 0) > 0}
    while left > 0 and active:
        total = sum(weights[b] for b in active)
        quotas = {b: left * weights[b] / total for b in active}
        grant = {b: min(math.floor(q), available[b] - take[b]) for b, q in quotas.items()}
        spare = left - sum(grant.values())
        for b in sorted(active, key=lambda b: (-(quotas[b] - math.floor(quotas[b])), -weights[b], b)):
            if spare and grant[b] < available[b] - take[b]:
                grant[b] += 1
                spare -= 1
        for b, g in grant.items():
            take[b] += g
            left -= g
        active = {b for b in active if take[b] < available[b]}
        if all(g == 0 for g in grant.values()):
            break
    for b in sorted(available):  # buckets the target gave no weight, only when nothing else is left
        extra = min(left, available[b] - take[b])
        take[b] += extra
        left -= extra
    return take


@dataclass
class Selection:
    indices: list[int]
    buckets: dict[int, dict[str, float]] = field(default_factory=dict)  # edge -> available, target, selected


def select_by_length(
    lengths: Sequence[int], n: int, edges: Sequence[int], target: dict[int, float] | None, seed: int
) -> Selection:
    """Pick n indices whose token lengths follow `target` (bucket upper bound -> weight; default: the pool's own
    distribution, i.e. a stratified sample). Deterministic for a seed."""
    if n > len(lengths):
        raise DatasetError(
            f"asked for {n} calibration samples but only {len(lengths)} remain after the holdout split; "
            "lower --samples or --holdout-fraction, or add data"
        )
    by_bucket: dict[int, list[int]] = {e: [] for e in edges}
    for i, length in enumerate(lengths):
        by_bucket[bucket_of(length, edges)].append(i)
    available = {e: len(ix) for e, ix in by_bucket.items()}
    weights = {e: float(c) for e, c in available.items()} if target is None else {e: target.get(e, 0.0) for e in edges}
    take = allocate(available, weights, n)
    rng = random.Random(seed)
    chosen: list[int] = []
    for e in edges:
        chosen.extend(rng.sample(by_bucket[e], take[e]))
    total_w = sum(weights.values()) or 1.0
    report = {
        e: {"available": available[e], "target": weights[e] / total_w, "selected": take[e]}
        for e in edges
        if available[e] or weights[e]
    }
    return Selection(sorted(chosen), report)


def truncate(ids: Sequence[int], max_len: int, source: str, kind: str) -> Sample:
    return Sample(source, kind, tuple(ids[:max_len]), len(ids))
