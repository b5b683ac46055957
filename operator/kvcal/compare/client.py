"""OpenAI-compatible HTTP calls to a vLLM server: prompt logprobs, streamed greedy generation (for TTFT and
inter-token latency), and token counting."""

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from kvcal.compare.metrics import PromptScores
from kvcal.compare.server import SERVED_NAME


@dataclass(frozen=True)
class Generation:
    text: str
    prompt_tokens: int | None
    ttft: float  # seconds to the first streamed token
    e2e: float  # seconds for the whole request
    chunk_gaps: tuple[float, ...]  # seconds between streamed chunks (inter-token latency)


def parse_prompt_logprobs(entries: Sequence[Mapping[str, Any] | None], token_ids: Sequence[int] | None) -> PromptScores:
    """vLLM's `prompt_logprobs` (one entry per prompt token; None for the first) with `prompt_logprobs=1`: each entry
    holds the actual token and, when that is not the most likely one, the rank-1 token too."""
    logprobs: list[float] = []
    top1: list[int] = []
    for position, entry in enumerate(entries):
        if not entry:
            continue
        ranked = {int(tok): info for tok, info in entry.items()}
        best = next((tok for tok, info in ranked.items() if info.get("rank") == 1), None)
        actual: int | None
        if token_ids is not None and position < len(token_ids) and token_ids[position] in ranked:
            actual = token_ids[position]
        else:  # without token ids: the actual token is the one not ranked first, or the only one
            actual = next((tok for tok, info in ranked.items() if info.get("rank") != 1), best)
        if actual is None or best is None:
            continue
        logprobs.append(float(ranked[actual]["logprob"]))
        top1.append(best)
    return PromptScores(tuple(logprobs), tuple(top1))


class OpenAIClient:
    def __init__(self, base_url: str, timeout: float = 600.0) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def prompt_scores(self, text: str) -> PromptScores:
        body = {
            "model": SERVED_NAME,
            "prompt": text,
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": 1,
            "return_token_ids": True,
        }
        reply = self._post("/v1/completions", body)
        choice = reply["choices"][0]
        entries = choice.get("prompt_logprobs") or reply.get("prompt_logprobs") or []
        token_ids = choice.get("prompt_token_ids") or reply.get("prompt_token_ids")
        return parse_prompt_logprobs(entries, token_ids)

    def prompt_scores_chat(self, messages: Sequence[Mapping[str, str]]) -> PromptScores:
        """The same for a chat sample, rendered by the server with the model's chat template."""
        body = {
            "model": SERVED_NAME,
            "messages": list(messages),
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": 1,
            "return_token_ids": True,
        }
        reply = self._post("/v1/chat/completions", body)
        return parse_prompt_logprobs(reply.get("prompt_logprobs") or [], reply.get("prompt_token_ids"))

    def count_tokens(self, text: str) -> int:
        reply = self._post("/tokenize", {"model": SERVED_NAME, "prompt": text, "add_special_tokens": False})
        return int(reply["count"])

    def chat(self, messages: Sequence[Mapping[str, str]], max_tokens: int) -> Generation:
        body = {
            "model": SERVED_NAME,
            "messages": list(messages),
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        started = time.perf_counter()
        first: float | None = None
        last = started
        gaps: list[float] = []
        parts: list[str] = []
        prompt_tokens = None
        with self.http.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                response.read()
                raise RuntimeError(f"/v1/chat/completions: HTTP {response.status_code}: {response.text[:500]}")
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    prompt_tokens = chunk["usage"].get("prompt_tokens")
                for choice in chunk.get("choices", []):
                    delta = choice.get("delta", {}).get("content")
                    if delta:
                        now = time.perf_counter()
                        if first is None:
                            first = now
                        else:
                            gaps.append(now - last)
                        last = now
                        parts.append(delta)
        ended = time.perf_counter()
        return Generation("".join(parts), prompt_tokens, (first or ended) - started, ended - started, tuple(gaps))

    def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        response = self.http.post(path, json=body)
        if response.status_code != 200:
            raise RuntimeError(f"{path}: HTTP {response.status_code}: {response.text[:500]}")
        reply: dict[str, Any] = response.json()
        return reply
