"""kvcal's table of `vllm serve` arguments (operator/kvcal/data/vllm-serve-flags.json) read off vLLM's real parser.

The operator cannot import vLLM, so it type-checks extraArgs against this table; tests/integration/
test_vllm_flags_parser.py checks the committed file against vLLM 0.32's parser. Regenerate it after a vLLM upgrade:

    PYTHONPATH=operator python -m tests.support.vllm_serve_flags > operator/kvcal/data/vllm-serve-flags.json
"""

import argparse
import json
from importlib.metadata import version
from typing import Any

# vLLM's own value types, by the name of the function argparse calls (optional_type/parse_type wrap another).
_KINDS = {
    "int": "int",
    "float": "float",
    "str": "text",
    "human_readable_int": "size",
    "human_readable_int_or_auto": "size-or-auto",
    "loads": "json",
    "parse_dataclass": "json",
    "union_dict_and_str": "text",  # a JSON object or any string
}
_SWITCHES = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)
_PLAIN_ACTIONS = (argparse._StoreAction, argparse._AppendAction)


def serve_parser() -> argparse.ArgumentParser:
    """`vllm serve`'s parser, built the way the CLI builds it."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return ServeSubcommand().subparser_init(FlexibleArgumentParser().add_subparsers())  # type: ignore[no-any-return]


def _inner(function: Any) -> tuple[Any, bool]:
    """(the type function vLLM's wrappers call, whether the value may be "None")."""
    optional = False
    while getattr(function, "__closure__", None) and function.__name__ in ("_optional_type", "_parse_type"):
        optional = optional or function.__name__ == "_optional_type"
        cells = {
            name: cell.cell_contents
            for name, cell in zip(function.__code__.co_freevars, function.__closure__, strict=True)
        }
        function = cells["return_type"]
    return function, optional


def describe(action: argparse.Action) -> dict[str, Any]:
    """One argument: its option strings (canonical first) and how its value is read."""
    entry: dict[str, Any] = {"names": list(action.option_strings)}
    if isinstance(action, _SWITCHES):
        entry["value"] = "none"
        return entry
    function, optional = _inner(action.type)
    name = "str" if function is None else getattr(function, "__name__", "")
    kind = _KINDS.get(name, "other")
    if action.choices is not None and type(action) in _PLAIN_ACTIONS:
        # After the type function: a value that is one of the choices as written always passes (the backends'
        # lambdas only lower-case and turn - into _).
        kind = "choice"
        entry["choices"] = sorted(str(c) for c in action.choices if c is not None)
    elif type(action) not in _PLAIN_ACTIONS:
        kind = "other"  # a custom action (LoRA modules, deprecated log config): kvcal cannot say what it reads
    entry["value"] = kind
    if optional:
        entry["optional"] = True  # "None" is also a value
    if action.nargs not in (None, 1):
        entry["nargs"] = action.nargs
    return entry


def catalog(parser: argparse.ArgumentParser) -> dict[str, Any]:
    arguments = [describe(a) for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    return {"vllm": version("vllm").split("+")[0], "arguments": arguments}  # 0.32.0, not 0.32.0+cpu


def render(table: dict[str, Any]) -> str:
    """One argument per line, so a vLLM upgrade reads as a short diff."""
    lines = ",\n".join(f"    {json.dumps(a, sort_keys=True)}" for a in table["arguments"])
    return f'{{\n  "vllm": {json.dumps(table["vllm"])},\n  "arguments": [\n{lines}\n  ]\n}}\n'


if __name__ == "__main__":
    print(render(catalog(serve_parser())), end="")
