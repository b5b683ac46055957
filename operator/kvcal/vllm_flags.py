"""vLLM's command-line flags as vLLM's own parser reads them, and the ones kvcal owns (the one list of them).

vLLM 0.32's FlexibleArgumentParser (vllm/utils/argparse_utils.py) turns `_` into `-` in a `--` flag's name up to
the first `.`, reads `--flag.key value` as JSON for `--flag`, and keeps argparse's abbreviations (allow_abbrev is
on): a unique prefix of a flag is that flag, and a short option takes its value attached (`-qfp8`). The last
occurrence of a flag wins. So `--kv_cache_dtype=auto` and `--kv-cache-dtype.x 1` set --kv-cache-dtype, `--load-form
dummy` sets --load-format, and a bare value with no flag before it is a positional argument: `vllm serve`'s model.
"""

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# argparse reads these as values, not flags, when no option looks like a negative number (true of vLLM's).
_NEGATIVE_NUMBER = re.compile(r"^-[0-9]+$|^-[0-9]*[.][0-9]+$")  # argparse's, spelt for CEL too
# A flag's name ends at `=` (inline value), `.` (vLLM's JSON sub-key) or whitespace.
_NAME_END = re.compile(r"[=.\s]")
END_OF_OPTIONS = "--"

_FIX_CHECKPOINT = "the canary serves spec.calibration.output and the baseline spec.model.source"
_FIX_BASELINE = "set it on the baseline Deployment, which the canary copies"
_FIX_SCALES = "it changes which KV scales vLLM uses; kvcal serves and verifies the calibrated ones"


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]  # vLLM's option strings for one argument, canonical first
    fix: str  # what to do instead of passing it in extraArgs
    takes_value: bool = True
    variadic: bool = False  # argparse nargs="+": every bare argument after it is one of its values

    @property
    def name(self) -> str:
        return self.names[0]


MODEL = Flag(("--model",), _FIX_CHECKPOINT)
SERVED_MODEL_NAME = Flag(("--served-model-name",), _FIX_BASELINE)
KV_CACHE_DTYPE = Flag(("--kv-cache-dtype",), "use spec.serving.canary.kvCacheDtype")
# Gone in vLLM 0.32; older vLLMs recompute the scales from the first batch and ignore the calibrated ones.
CALCULATE_KV_SCALES = Flag(("--calculate-kv-scales", "--no-calculate-kv-scales"), _FIX_SCALES, takes_value=False)
ATTENTION_BACKEND = Flag(("--attention-backend",), "use spec.serving.canary.attentionBackend")
# Layer indices whose KV cache stays in BF16; the verification Job checks them, so kvcal sets them.
KV_CACHE_DTYPE_SKIP_LAYERS = Flag(
    ("--kv-cache-dtype-skip-layers",), "use spec.serving.canary.protectedLayers", variadic=True
)

# The template vLLM renders chat requests with (the model's own when absent); not owned: the canary copies it.
CHAT_TEMPLATE = Flag(("--chat-template",), _FIX_BASELINE)

# Everything that lets an argument swap the checkpoint, the KV dtype or the scales, or move where and as what the
# canary answers.
OWNED_FLAGS: tuple[Flag, ...] = (
    MODEL,
    KV_CACHE_DTYPE,
    KV_CACHE_DTYPE_SKIP_LAYERS,
    CALCULATE_KV_SCALES,
    ATTENTION_BACKEND,
    Flag(("--attention-config", "-ac"), "use spec.serving.canary.attentionBackend"),
    Flag(("--quantization", "-q"), _FIX_SCALES),
    Flag(("--quantization-config",), _FIX_SCALES),
    Flag(("--hf-overrides",), _FIX_SCALES),
    Flag(("--hf-config-path",), _FIX_SCALES),
    Flag(("--config-format",), _FIX_SCALES),
    Flag(("--tokenizer",), _FIX_BASELINE),
    Flag(("--revision",), _FIX_CHECKPOINT),
    Flag(("--code-revision",), _FIX_CHECKPOINT),
    Flag(("--tokenizer-revision",), _FIX_BASELINE),
    Flag(("--load-format",), _FIX_CHECKPOINT),
    Flag(("--download-dir",), _FIX_CHECKPOINT),
    Flag(("--model-loader-extra-config",), _FIX_CHECKPOINT),
    Flag(("--weight-transfer-config",), "it lets the served weights be replaced at runtime"),
    Flag(("--config",), "a config file can set any of these flags; pass vLLM flags themselves"),
    SERVED_MODEL_NAME,
    Flag(("--port",), _FIX_BASELINE),
    Flag(("--host",), _FIX_BASELINE),
    Flag(("--uds",), _FIX_BASELINE),
)


def flag_name(arg: str) -> str | None:
    """The option name vLLM sees in `arg` (`' --kv_cache_dtype=auto'` -> `--kv-cache-dtype`), None for a value."""
    text = arg.strip()
    if not text.startswith("-") or text == "-" or _NEGATIVE_NUMBER.match(text):
        return None
    name = _NAME_END.split(text, maxsplit=1)[0]
    return name.replace("_", "-") if name.startswith("--") else name


def _abbreviates(name: str, option: str) -> bool:
    """Whether argparse may read `name` as `option`: exactly, as a unique prefix (allow_abbrev), or, for a short
    option, with its value attached (`-qfp8`). A prefix shared with another flag is ambiguous and vLLM exits, so
    treating every prefix as the owned flag refuses nothing vLLM would run."""
    if name.startswith("--"):
        return name != END_OF_OPTIONS and option.startswith(name)
    return not option.startswith("--") and (option.startswith(name) or name.startswith(option))


def denotes(arg: str, flag: Flag) -> bool:
    name = flag_name(arg)
    if name is None or any(name in other.names for other in OWNED_FLAGS if other is not flag):
        return False  # an exact name is that flag, never a prefix of another (--kv-cache-dtype vs -skip-layers)
    return any(_abbreviates(name, option) for option in flag.names)


def owned_flag(arg: str) -> Flag | None:
    """The kvcal-owned flag that `arg` would set in vLLM, if any (an exact name wins over a prefix, as in argparse)."""
    name = flag_name(arg)
    exact = next((flag for flag in OWNED_FLAGS if name in flag.names), None)
    return exact or next((flag for flag in OWNED_FLAGS if denotes(arg, flag)), None)


@dataclass(frozen=True)
class Occurrence:
    index: int  # of the flag in the argument list
    value: str
    inline: bool  # `--flag=value` (else the value is the next argument)


def find(args: Sequence[str], flag: Flag) -> Occurrence | None:
    """The last occurrence of `flag` with its value (the one vLLM uses), in any spelling vLLM accepts."""
    for index in reversed(range(len(args))):
        if not denotes(args[index], flag):
            continue
        text = args[index].strip()
        if "=" in text:
            return Occurrence(index, text.split("=", 1)[1], inline=True)
        if index + 1 < len(args):
            return Occurrence(index, args[index + 1], inline=False)
    return None


def attention_backend(args: Sequence[str]) -> str | None:
    """The --attention-backend that `args` give vLLM (the last, in any spelling), None when they give none."""
    occurrence = find(args, ATTENTION_BACKEND)
    return occurrence.value if occurrence else None


def without(args: Iterable[str], flags: Iterable[Flag]) -> list[str]:
    """`args` minus every spelling of `flags` (and their values)."""
    dropped = tuple(flags)
    kept: list[str] = []
    skip_value = False
    skip_values = False  # after a variadic flag: its values run up to the next flag
    for arg in args:
        if skip_values and flag_name(arg) is None:
            continue
        skip_values = False
        if skip_value:
            skip_value = False
            continue
        flag = next((f for f in dropped if denotes(arg, f)), None)
        if flag is None:
            kept.append(arg)
        elif "=" not in arg:
            skip_values = flag.variadic
            skip_value = flag.takes_value and not flag.variadic
    return kept


def extra_args_problems(args: Sequence[str]) -> list[tuple[int, str]]:
    """(index, why and what to do) for each argument that would override what kvcal sets on the canary."""
    problems: list[tuple[int, str]] = []
    value_may_follow = False  # a bare argument right after `--flag` (no `=`) is its value, else a positional
    for index, arg in enumerate(args):
        name = flag_name(arg)
        flag = owned_flag(arg)
        if name == END_OF_OPTIONS:
            problems.append((index, f"{arg!r} ends vLLM's options: what follows would become the model"))
        elif flag is not None:
            problems.append((index, f"{arg!r} sets {flag.name}, which kvcal owns: {flag.fix}"))
        elif name is None and not value_may_follow:
            problems.append(
                (
                    index,
                    f"{arg!r} is a positional argument (vllm serve reads it as the model): "
                    "put each value right after its flag, or write --flag=value",
                )
            )
        if name is not None:
            value_may_follow = "=" not in arg
    return problems


def _cel_list(names: Iterable[str]) -> str:
    return "[" + ", ".join(f"'{name}'" for name in names) + "]"


# CEL twins of flag_name's pieces (CEL string literals: `\\s` is the regex's `\s`).
_CEL_TEXT = "self.trim()"
_CEL_NAME = f"{_CEL_TEXT}.find('^[^=.\\\\s]*')"
_CEL_VALUE = f"({_CEL_TEXT} == '-' || {_CEL_TEXT}.matches('{_NEGATIVE_NUMBER.pattern}'))"


def admission_item_rules() -> list[dict[str, str]]:
    """CEL for each item of the CRD's spec.serving.canary.extraArgs: `owned_flag` and the `--` check of
    `extra_args_problems`, same owned set, same normalisation (a unit test checks the CRD carries exactly these)."""
    long_names = [n for flag in OWNED_FLAGS for n in flag.names if n.startswith("--")]
    short_names = [n for flag in OWNED_FLAGS for n in flag.names if not n.startswith("--")]
    owned = (
        f"{_CEL_NAME}.startsWith('--') "
        f"? {_cel_list(long_names)}.all(f, !f.startsWith({_CEL_NAME}.replace('_', '-'))) "
        f": (!{_CEL_TEXT}.startsWith('-') || {_CEL_VALUE} "
        f"|| {_cel_list(short_names)}.all(f, !f.startsWith({_CEL_NAME}) && !{_CEL_NAME}.startsWith(f)))"
    )
    return [
        {
            "rule": f"{_CEL_NAME} != '{END_OF_OPTIONS}'",
            "message": "spec.serving.canary.extraArgs must not contain '--': it ends vLLM's options and what "
            "follows would become the model",
        },
        {
            "rule": owned,
            "message": (
                "spec.serving.canary.extraArgs must not set a flag kvcal owns, in any spelling vLLM accepts "
                f"({', '.join(long_names + short_names)}; also with =value, _ for - and abbreviated): use "
                "spec.serving.canary.kvCacheDtype, attentionBackend or protectedLayers, or set it on the baseline "
                "Deployment"
            ),
        },
    ]


def admission_list_rule() -> str:
    """CEL for the whole list: its first item must be a flag (a bare value there would become the model)."""
    first = _CEL_TEXT.replace("self", "self[0]")
    return f"self.size() == 0 || ({first}.startsWith('-') && !{_CEL_VALUE.replace('self', 'self[0]')})"
