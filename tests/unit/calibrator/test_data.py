"""Data handling: parsing with line numbers, the seeded split, length-bucket sampling, truncation."""

import json
from pathlib import Path
from typing import Any

import pytest

from kvcal.calibrator import data as D


def write(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_reads_chat_and_text_skipping_blank_lines(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        [
            json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}),
            "",
            json.dumps({"text": "hello"}),
        ],
    )
    recs = D.read_records(p)
    assert [r.kind for r in recs] == ["chat", "text"]
    assert recs[1].source.endswith("d.jsonl:3")


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('{"text": "ok"', "not valid JSON"),
        ('["x"]', "expected a JSON object"),
        ('{"messages": []}', "non-empty list"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "messages[0]"),
        ('{"text": "  "}', "non-empty string"),
        ('{"prompt": "x"}', "neither 'messages' nor 'text'"),
    ],
)
def test_malformed_line_is_named_with_its_number(tmp_path: Path, line: str, needle: str) -> None:
    p = write(tmp_path, [json.dumps({"text": "fine"}), line])
    with pytest.raises(D.DatasetError) as e:
        D.read_records(p)
    assert f"{p}:2" in str(e.value) and needle in str(e.value)


def test_empty_and_missing_datasets(tmp_path: Path) -> None:
    with pytest.raises(D.DatasetError, match="empty"):
        D.read_records(write(tmp_path, ["", "  "]))
    with pytest.raises(D.DatasetError, match="not found"):
        D.read_records(tmp_path / "nope.jsonl")
    (tmp_path / "dir").mkdir()
    with pytest.raises(D.DatasetError, match=r"no \*\.jsonl"):
        D.read_records(tmp_path / "dir")


def test_split_is_deterministic_disjoint_and_sized() -> None:
    a = D.split_indices(50, 0.1, seed=7)
    assert a == D.split_indices(50, 0.1, seed=7)
    assert a != D.split_indices(50, 0.1, seed=8)
    cal, hold = a
    assert len(hold) == 5 and not set(cal) & set(hold) and sorted(cal + hold) == list(range(50))


def test_allocate_follows_weights_and_redistributes_shortfall() -> None:
    assert D.allocate({256: 100, 1024: 100}, {256: 0.5, 1024: 0.5}, 10) == {256: 5, 1024: 5}
    # the long bucket holds only 2: the rest goes to the short one
    assert D.allocate({256: 100, 1024: 2}, {256: 0.5, 1024: 0.5}, 10) == {256: 8, 1024: 2}
    # a bucket with zero target weight is used only when nothing else is left
    assert D.allocate({256: 3, 1024: 5}, {256: 1.0, 1024: 0.0}, 5) == {256: 3, 1024: 2}


def test_select_by_length_matches_target_distribution() -> None:
    lengths = [100] * 60 + [700] * 30 + [3000] * 10
    edges = [256, 1024, 4096]
    sel = D.select_by_length(lengths, 20, edges, {256: 0.25, 1024: 0.25, 4096: 0.5}, seed=1)
    got = [D.bucket_of(lengths[i], edges) for i in sel.indices]
    assert got.count(256) == 5 and got.count(1024) == 5 and got.count(4096) == 10
    assert sel.indices == D.select_by_length(lengths, 20, edges, {256: 0.25, 1024: 0.25, 4096: 0.5}, seed=1).indices
    stratified = D.select_by_length(lengths, 10, edges, None, seed=1)
    assert [stratified.buckets[e]["selected"] for e in edges] == [6, 3, 1]


def test_select_more_than_available_fails_clearly() -> None:
    with pytest.raises(D.DatasetError, match="asked for 5 calibration samples but only 3"):
        D.select_by_length([1, 2, 3], 5, [256], None, 0)


def test_truncation_is_counted() -> None:
    s = D.truncate(list(range(10)), 4, "f:1", "text")
    assert s.input_ids == (0, 1, 2, 3) and s.original_length == 10 and s.truncated


class FakeTokenizer:
    """Records how it was called (the unit under test is the call pattern, not tokenization)."""

    chat_template = "{{ messages }}"

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        self.calls.append(("template", kwargs))
        return "|".join(m["content"] for m in conversation)

    def __call__(self, text: str, **kwargs: Any) -> Any:
        self.calls.append(("tokenize", kwargs))
        return {"input_ids": [ord(c) for c in text]}


def test_render_applies_chat_template_like_the_server() -> None:
    tok = FakeTokenizer()
    ask = D.Record("f:1", "chat", messages=(("system", "s"), ("user", "u")))
    D.render(ask, tok)
    answered = D.Record("f:2", "chat", messages=(("user", "u"), ("assistant", "a")))
    D.render(answered, tok)
    D.render(D.Record("f:3", "text", text="t"), tok)
    assert tok.calls[0] == ("template", {"tokenize": False, "add_generation_prompt": True})
    assert tok.calls[1] == ("tokenize", {"add_special_tokens": False})
    assert tok.calls[2][1]["add_generation_prompt"] is False
    assert tok.calls[4] == ("tokenize", {"add_special_tokens": True})
