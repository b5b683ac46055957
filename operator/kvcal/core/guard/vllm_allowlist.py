"""Which vLLM flags spec.serving.canary.extraArgs may pass: an allow-list a cluster admin sets (chart value
policy.vllmFlags.allowed), and each allowed flag's value checked against the type vLLM's parser declares for it.

The canary runs these flags with the baseline's pod template, and promotion writes them into the baseline Deployment,
which the KVCalibration's author may not be allowed to edit. vLLM has flags that send data out
(--otlp-traces-endpoint), import code (--middleware, --trust-remote-code), read any file in the container
(--chat-template, --allowed-local-media-path) or log prompts (--enable-log-requests), and every vLLM release adds
some, so what passes is a list of named flags, never everything but a few.

Only an allowed flag's declared long option strings (data/vllm-serve-flags.json: vLLM 0.32's `vllm serve` parser)
and their `_` spellings match, written `--flag`, `--flag=value` or `--flag value`. argparse also reads a unique
prefix as the flag (allow_abbrev), vLLM reads `--flag.key value` as JSON for --flag and `-O3` as
--optimization-level, and short options take attached values: none of these spellings is matched, each is refused
naming the flag to write instead. Values are checked strictly: a value vLLM's parser would accept may still be
refused (`8_000`, ` 8`), never the reverse.
"""

import json
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

from kvcal import vllm_flags

CATALOG = "data/vllm-serve-flags.json"

# Tuning flags that change how much vLLM batches, caches and captures, never what it reads, loads, logs or sends
# (docs/security.md says why each is safe). JSON-valued --*-config flags are never here.
DEFAULT_ALLOWED: tuple[str, ...] = (
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--gpu-memory-utilization",
    "--kv-cache-memory-bytes",
    "--max-model-len",
    "--block-size",
    "--enable-prefix-caching",
    "--enable-chunked-prefill",
    "--long-prefill-token-threshold",
    "--max-cudagraph-capture-size",
    "--enforce-eager",
    "--seed",
)

_FLAG = re.compile(r"--(?P<name>[A-Za-z0-9][A-Za-z0-9_-]*)(?:=(?P<value>.*))?", re.DOTALL)
_CANONICAL = re.compile(r"--[a-z0-9][a-z0-9-]*")
_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
# vLLM's human_readable_int: decimals only with the decimal suffixes (k = 1000, K = 1024).
_SIZE = re.compile(r"-?[0-9]+|[0-9]+(?:\.[0-9]+)?[kmgt]|[0-9]+[KMGT]")

_VALUE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "size": "an integer, optionally with a k/m/g/t (x1000) or K/M/G/T (x1024) suffix",
    "size-or-auto": "an integer (optionally with a k/m/g/t or K/M/G/T suffix), auto or -1",
    "json": "a JSON value",
}


@dataclass(frozen=True)
class Argument:
    """One argument of `vllm serve` as its parser declares it."""

    names: tuple[str, ...]  # option strings, canonical first (--enable-x also has --no-enable-x)
    value: str  # none (a switch), int, float, size, size-or-auto, choice, text, json, other (a custom action)
    choices: tuple[str, ...] = ()
    nargs: str | None = None  # "+", "*": every bare argument after it; "?": the value may be left out
    optional: bool = False  # "None" is also a value

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def long_names(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n.startswith("--"))


@dataclass(frozen=True)
class Refusal:
    index: int  # of the extraArgs item
    message: str  # names the flag (or the item) and why
    policy: bool  # True: a cluster admin can allow it (policy.vllmFlags.allowed); False: the spec must change


@cache
def catalog() -> tuple[str, dict[str, Argument]]:
    """(vLLM's version, every option string of `vllm serve` -> its argument)."""
    data = json.loads(resources.files("kvcal").joinpath(CATALOG).read_text(encoding="utf-8"))
    by_name: dict[str, Argument] = {}
    for entry in data["arguments"]:
        argument = Argument(
            names=tuple(entry["names"]),
            value=entry["value"],
            choices=tuple(entry.get("choices", ())),
            nargs=entry.get("nargs"),
            optional=entry.get("optional", False),
        )
        by_name.update(dict.fromkeys(argument.names, argument))
    return data["vllm"], by_name


def unallowable(flag: str) -> str | None:
    """Why a cluster admin cannot put `flag` on the allow-list, None when it can."""
    version, by_name = catalog()
    if not _CANONICAL.fullmatch(flag):
        return f"{flag!r} is not a long flag in its canonical spelling (lower case, '-', e.g. --max-num-seqs)"
    argument = by_name.get(flag)
    if argument is None:
        return f"{flag} is not an argument of vLLM {version}'s `vllm serve`"
    owned = next(filter(None, map(vllm_flags.owned_flag, argument.names)), None)
    if owned is not None:
        return f"{flag} sets {owned.name}, which kvcal owns: {owned.fix}"
    if argument.value == "other":
        return f"{flag} has its own parsing in vLLM, which kvcal cannot check"
    return None


def allowed_names(flags: Iterable[str]) -> frozenset[str]:
    """Every long option string of the allowed flags' arguments (--enable-x allows --no-enable-x too)."""
    _, by_name = catalog()
    return frozenset(name for flag in flags if flag in by_name for name in by_name[flag].long_names)


def refusals(args: Sequence[str], allowed: Collection[str]) -> list[Refusal]:
    """Each extraArgs item the allow-list (option strings, `allowed_names`) does not let through, in order."""
    found: list[Refusal] = []
    index = 0
    while index < len(args):
        refused, index = _read_flag(args, index, allowed)
        found += refused
    return found


def _is_value(args: Sequence[str], index: int) -> bool:
    return index < len(args) and vllm_flags.flag_name(args[index]) is None


def _read_flag(args: Sequence[str], index: int, allowed: Collection[str]) -> tuple[list[Refusal], int]:
    """The refusals of the flag at `index` and its values, and the index after them."""
    arg = args[index]
    if vllm_flags.flag_name(arg) is None:
        refusal = Refusal(index, f"{arg!r} is a value with no flag before it (vllm serve reads it as the model)", False)
        return [refusal], index + 1
    owned = vllm_flags.owned_flag(arg)
    match = _FLAG.fullmatch(arg)
    if owned is not None or match is None:
        why = f"sets {owned.name}, which kvcal owns: {owned.fix}" if owned else _misspelt(arg)
        return [Refusal(index, f"{arg!r} {why}", False)], _skip_value(args, index, arg)
    version, by_name = catalog()
    name = "--" + match["name"].replace("_", "-")  # vLLM's own normalisation
    argument = by_name.get(name)
    if argument is None:
        return [Refusal(index, f"{arg!r} {_unknown(name, version, by_name)}", False)], _skip_value(args, index, arg)
    if name not in allowed:
        refusal = Refusal(index, f"{name} is not a vLLM flag the operator allows", True)
        return [refusal], _after_values(args, index, argument, match["value"])[1]
    if argument.value == "none":
        if match["value"] is not None:
            return [Refusal(index, f"{name} takes no value: write {name} alone", False)], index + 1
        return [], index + 1
    values, after = _after_values(args, index, argument, match["value"])
    if not values and argument.nargs not in ("?", "*"):
        return [Refusal(index, f"{name} needs a value: write {name}=VALUE", False)], after
    wrong = [v for v in values if not _value_ok(argument, v)]
    return [Refusal(index, f"{name} takes {_expected(argument)}, not {v!r}", False) for v in wrong], after


def _after_values(args: Sequence[str], index: int, argument: Argument, inline: str | None) -> tuple[list[str], int]:
    """The values argparse gives `argument` (inline `=value`, or the bare arguments after it) and where it stops."""
    if argument.value == "none":
        return [], index + 1
    if inline is not None:
        return [inline], index + 1
    end = index + 1
    while _is_value(args, end) and (end == index + 1 or argument.nargs in ("+", "*")):
        end += 1
    return list(args[index + 1 : end]), end


def _skip_value(args: Sequence[str], index: int, arg: str) -> int:
    """After a refused flag, its value (if it has one) is not reported again as a stray value."""
    return index + 2 if "=" not in arg and _is_value(args, index + 1) else index + 1


def _misspelt(arg: str) -> str:
    name = arg.split("=", 1)[0]
    if arg != arg.strip() or any(c.isspace() for c in name):
        return "has spaces: write each flag as --flag or --flag=value, the value in its own item if it has spaces"
    if not name.startswith("--"):
        _, by_name = catalog()
        shorts = [n for n in by_name if not n.startswith("--") and name.startswith(n)]
        # argparse's attached value: -tp2 is -tp 2; vLLM itself turns -O3 into --optimization-level 3.
        long = by_name[max(shorts, key=len)].name if shorts else "--optimization-level" if name[:2] == "-O" else None
        return f"is a short option: kvcal matches long flags only, {f'write {long}' if long else 'write the long flag'}"
    if "." in name:
        base = name.split(".", 1)[0].replace("_", "-")
        return f"is a JSON sub-key of {base} (vLLM reads --flag.key as JSON for --flag): sub-keys are refused"
    return "is not a flag in a spelling kvcal checks: write --flag or --flag=value"


def _unknown(name: str, version: str, by_name: dict[str, Argument]) -> str:
    completions = sorted({a.name for n, a in by_name.items() if n.startswith(name)})
    if len(completions) == 1:
        return f"abbreviates {completions[0]} (argparse reads unique prefixes): abbreviations are refused, write it out"
    if completions:
        return f"abbreviates several flags ({', '.join(completions[:4])}): abbreviations are refused, write one out"
    return f"is not an argument of vLLM {version}'s `vllm serve`"


def _value_ok(argument: Argument, value: str) -> bool:
    if argument.optional and value == "None":
        return True
    kind = argument.value
    if kind == "int":
        return _INT.fullmatch(value) is not None
    if kind == "float":
        return _FLOAT.fullmatch(value) is not None
    if kind == "size":
        return _SIZE.fullmatch(value) is not None
    if kind == "size-or-auto":
        return value.lower() == "auto" or _SIZE.fullmatch(value) is not None
    if kind == "choice":
        return value in argument.choices
    if kind == "json":
        try:
            json.loads(value)
        except ValueError:
            return False
        return True
    return kind == "text"


def _expected(argument: Argument) -> str:
    if argument.value == "choice":
        return f"one of {', '.join(argument.choices)}"
    return _VALUE_WORDS.get(argument.value, "a value kvcal cannot check")
