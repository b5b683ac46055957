"""Quality probe suites: the built-in one (data files beside this module) and custom ones from a ConfigMap.

A custom suite is a ConfigMap key (default ``suite.yaml``; JSON is YAML too) holding ``{name, probes: [{id, kind,
prompt, expected, match?, maxTokens?}]}``; it is validated with the same schema as the built-in suite.
"""

import json
from importlib import resources
from typing import Any

import yaml
from pydantic import ValidationError

from kvcal.probes.schema import Probe, Suite

__all__ = [
    "Probe",
    "Suite",
    "SuiteError",
    "at_served_context",
    "builtin_suite",
    "estimated_cost",
    "needle_length_for",
    "needle_probes",
    "parse_suite",
    "suite_from_configmap",
    "within_budget",
]

CONFIGMAP_KEY = "suite.yaml"
# A needle at this share of the served context leaves room for the chat template, the question and the answer.
NEEDLE_CONTEXT_SHARE = 0.85


class SuiteError(ValueError):
    """A probe suite that does not validate; the message names the source, the field and the fix."""


def _data(name: str) -> Any:
    return json.loads(resources.files(__package__).joinpath(name).read_text(encoding="utf-8"))


def needle_probes(spec: dict[str, Any] | None = None) -> list[Probe]:
    """Needle-in-a-haystack probes: each fact hidden mid-way in filler text of each context length."""
    data = spec or _data("needle.json")
    haystack: list[str] = data["haystack"]
    per_sentence: int = data.get("tokensPerSentence", 12)
    probes = []
    for length in data["contextTokens"]:
        count = max(2, length // per_sentence)
        filler = [haystack[i % len(haystack)] for i in range(count)]
        for needle in data["needles"]:
            text = [*filler[: count // 2], needle["fact"], *filler[count // 2 :]]
            prompt = " ".join(text) + "\n\n" + needle["question"]
            probes.append(
                Probe(
                    id=f"{needle['id']}-{length}",
                    kind="needle",
                    prompt=prompt,
                    expected=needle["expected"],
                    max_tokens=32,  # SmolLM2 answers in a sentence: "The secret code ... is 472"
                    context_tokens=length,
                )
            )
    return probes


def needle_length_for(max_model_len: int) -> int:
    """Haystack length of the needle probe at the longest context a server serves (its --max-model-len)."""
    return int(max_model_len * NEEDLE_CONTEXT_SHARE)


def builtin_suite(context_tokens: list[int] | None = None, max_model_len: int | None = None) -> Suite:
    """Exact-match QA, arithmetic, code and needle probes; ``context_tokens`` overrides the needle lengths
    (a server with a short --max-model-len needs shorter haystacks); ``max_model_len`` adds a needle at the longest
    context served (see at_served_context)."""
    base = _data("builtin.json")
    needle = _data("needle.json")
    if context_tokens is not None:
        needle["contextTokens"] = context_tokens
    suite = Suite.model_validate(base)
    suite = suite.model_copy(update={"probes": [*suite.probes, *needle_probes(needle)]})
    return at_served_context(suite, max_model_len)


def at_served_context(suite: Suite, max_model_len: int | None, longest: int | None = None) -> Suite:
    """The suite plus needle probes at the longest context the server serves, when the suite asks for them
    (needleAtServedContext) and that length is known: calibration data rarely reaches it, so it is checked here; no
    longer than ``longest`` tokens (spec.analysis.quality.maxProbeContextTokens)."""
    if not suite.needle_at_served_context or not max_model_len:
        return suite
    length = needle_length_for(max_model_len)
    if longest is not None:
        length = min(length, longest)
    if any(p.kind == "needle" and p.context_tokens == length for p in suite.probes):
        return suite
    needle = _data("needle.json")
    needle["contextTokens"] = [length]
    return suite.model_copy(update={"probes": [*suite.probes, *needle_probes(needle)]})


# Characters per token of English prose for the budget's estimate (a needle's haystack counts its own tokens).
CHARS_PER_TOKEN = 4


def estimated_cost(probe: Probe) -> int:
    """Tokens one probe spends on one role, estimated before it is sent: its prompt and its longest answer."""
    prompt = probe.context_tokens if probe.context_tokens else len(probe.prompt) // CHARS_PER_TOKEN + 1
    return prompt + probe.max_tokens


def within_budget(probes: list[Probe], budget: int, turn: int) -> tuple[list[Probe], list[Probe]]:
    """(the probes this interval sends, those that wait): from probe ``turn`` (mod the suite's size) on, each probe
    that still fits ``budget`` tokens per role; turning the start each interval sends every probe in turn."""
    if not probes:
        return [], []
    start = turn % len(probes)
    order = probes[start:] + probes[:start]
    sent, waiting, spent = [], [], 0
    for probe in order:
        cost = estimated_cost(probe)
        if spent + cost <= budget:
            sent.append(probe)
            spent += cost
        else:
            waiting.append(probe)
    return sent, waiting


def _explain(error: ValidationError, source: str) -> str:
    lines = []
    for e in error.errors()[:8]:
        loc = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in e["loc"]).replace(".[", "[")
        lines.append(f"  {loc or '(root)'}: {e['msg']}")
    return (
        f"probe suite {source} is invalid:\n"
        + "\n".join(lines)
        + ("\nexpected {name: STR, probes: [{id, kind: qa|arithmetic|code|needle, prompt, expected, match?}]}")
    )


def parse_suite(text: str, source: str) -> Suite:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SuiteError(f"probe suite {source}: not valid YAML/JSON: {exc}") from exc
    try:
        return Suite.model_validate(data)
    except ValidationError as exc:
        raise SuiteError(_explain(exc, source)) from None


def suite_from_configmap(name: str, data: dict[str, str] | None, key: str = CONFIGMAP_KEY) -> Suite:
    """The suite in ConfigMap ``name`` (its ``data``), key ``suite.yaml`` by default."""
    if not data or key not in data:
        keys = ", ".join(sorted(data or {})) or "none"
        raise SuiteError(f"ConfigMap {name}: has no key {key!r} (keys: {keys}); put the suite YAML under {key!r}")
    return parse_suite(data[key], f"configmap {name}/{key}")
