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

__all__ = ["Probe", "Suite", "SuiteError", "builtin_suite", "needle_probes", "parse_suite", "suite_from_configmap"]

CONFIGMAP_KEY = "suite.yaml"


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


def builtin_suite(context_tokens: list[int] | None = None) -> Suite:
    """Exact-match QA, arithmetic, code and needle probes; ``context_tokens`` overrides the needle lengths
    (a server with a short --max-model-len needs shorter haystacks)."""
    base = _data("builtin.json")
    needle = _data("needle.json")
    if context_tokens is not None:
        needle["contextTokens"] = context_tokens
    suite = Suite.model_validate(base)
    return suite.model_copy(update={"probes": [*suite.probes, *needle_probes(needle)]})


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
