"""kvcal.vllm_flags and vllm_allowlist against vLLM 0.32's real `vllm serve` parser (FlexibleArgumentParser,
allow_abbrev on).

Every spelling the operator refuses is one vLLM really maps onto an owned argument; every prefix vLLM resolves to an
argument kvcal does not own passes; and the canary built from a baseline full of odd spellings parses, in vLLM, to
the calibrated checkpoint with kvcal's KV dtype. kvcal's table of vLLM's arguments is this parser's, and whatever
the default allow-list lets through changes no argument in vLLM but the allowed ones.
"""

import argparse
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest

from kvcal import vllm_flags
from kvcal.core.guard import vllm_allowlist
from kvcal.core.manifests import build_canary_workload
from kvcal.core.manifests.jobs import checkpoint_location
from tests.support.decide import OWNER, spec
from tests.support.decide import SPEC_MODEL as SPEC
from tests.support.vllm_args import HOSTILE, baseline_with_odd_spellings

pytestmark = pytest.mark.vllm

# Owned in kvcal for older vLLMs (the calibrated scales would be recomputed); vLLM 0.32 no longer has it.
NOT_IN_VLLM_032 = {"--calculate-kv-scales", "--no-calculate-kv-scales"}


@pytest.fixture(scope="module")
def serve_parser() -> Iterator[tuple[argparse.ArgumentParser, argparse.ArgumentParser]]:
    """(root, serve) parsers built the way `vllm serve` builds them."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    root = FlexibleArgumentParser()
    serve = ServeSubcommand().subparser_init(root.add_subparsers())
    assert serve.allow_abbrev, "vLLM turned abbreviations off: vllm_flags may stop treating prefixes as flags"
    yield root, serve


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: action for action in parser._actions for option in action.option_strings}


def _owned_dests(parser: argparse.ArgumentParser) -> set[str]:
    options = _options(parser)
    return {options[n].dest for f in vllm_flags.OWNED_FLAGS for n in f.names if n in options}


def test_owned_flags_are_vllm_arguments_and_skip_layers_takes_many_values(serve_parser: Any) -> None:
    _, serve = serve_parser
    options = _options(serve)
    owned = {n for f in vllm_flags.OWNED_FLAGS for n in f.names}
    assert owned - options.keys() == NOT_IN_VLLM_032
    assert options["--kv-cache-dtype-skip-layers"].nargs == "+"


def test_every_vllm_option_and_prefix_is_classified_as_vllm_resolves_it(serve_parser: Any) -> None:
    """argparse's own resolution (exact, unique prefix, attached short value) over every option of vllm serve:
    owned iff it lands on an owned argument; ambiguous prefixes (vLLM exits) may go either way."""
    _, serve = serve_parser
    owned_dests = _owned_dests(serve)
    checked = 0
    for option in _options(serve):
        spellings = {option[:end] for end in range(2, len(option) + 1)} | {option + "x7"}
        for spelling in sorted(spellings):
            try:
                resolved = serve._parse_optional(spelling)
            except SystemExit:  # ambiguous: vLLM refuses to start
                continue
            if not resolved or resolved[0] is None:
                continue
            checked += 1
            lands_on_owned = resolved[0].dest in owned_dests
            assert (vllm_flags.owned_flag(spelling) is not None) == lands_on_owned, (spelling, resolved[0].dest)
    assert checked > 1000


# (extraArgs, the vLLM argument it sets, the value vLLM ends up with): the reproductions of issue #10 and friends.
REPRODUCTIONS = [
    (["--kv_cache_dtype=auto"], "kv_cache_dtype", "auto"),
    (["--kv-cache-dtype=auto", "--kv-cache-dtype-skip-layers", "0"], "kv_cache_dtype", "auto"),
    (["--kv-cache-dtype-skip-layers", "0", "31"], "kv_cache_dtype_skip_layers", ["0", "31"]),
    (["--kv_cache_dtype_skip_layers=sliding_window"], "kv_cache_dtype_skip_layers", ["sliding_window"]),
    (["--model=/etc"], "model", "/etc"),
    (["--served_model_name=other"], "served_model_name", ["other"]),
    (["--served-model", "other"], "served_model_name", ["other"]),  # abbreviation
    (["-qfp8"], "quantization", "fp8"),
    (["--quantization=fp8"], "quantization", "fp8"),
    (["--load_format=dummy"], "load_format", "dummy"),
    (["--load-form=dummy"], "load_format", "dummy"),
    (
        ["--hf-overrides.quantization_config.kv_cache_scheme=null"],
        "hf_overrides",
        {"quantization_config": {"kv_cache_scheme": None}},
    ),
    (["--port=9000"], "port", 9000),
    (["--tokenizer", "/other"], "tokenizer", "/other"),
]


@pytest.mark.parametrize(("extra_args", "dest", "value"), REPRODUCTIONS)
def test_refused_extra_args_really_override_in_vllm(
    serve_parser: Any, extra_args: list[str], dest: str, value: Any
) -> None:
    _, serve = serve_parser
    # As `python -m vllm.entrypoints.openai.api_server` parses them (the baselines of tests/unit use it).
    kvcal_args = ["--model", "/ckpt", "--kv-cache-dtype", "fp8_e4m3", "--served-model-name", "llm"]
    parsed = serve.parse_args([*kvcal_args, *extra_args])
    assert getattr(parsed, dest) == value
    assert vllm_flags.extra_args_problems(extra_args), f"{extra_args} reaches vLLM but kvcal lets it through"


def test_protected_layers_reach_vllm_as_skip_layers(serve_parser: Any) -> None:
    """spec.serving.canary.protectedLayers on the canary: vLLM parses every layer, and the baseline's own skip list
    (all of its values) is gone."""
    root, _ = serve_parser
    protected = spec(serving={"baseline": {"deployment": "llm", "service": "llm"},
                              "canary": {"protectedLayers": {"layers": [0, 31]}}})  # fmt: skip
    canary = build_canary_workload(OWNER, protected, baseline_with_odd_spellings(), 1)
    container = canary["spec"]["template"]["spec"]["containers"][0]
    parsed = root.parse_args([*container["command"], *container["args"]][1:])
    assert parsed.kv_cache_dtype == protected.serving.canary.kv_cache_dtype
    assert parsed.kv_cache_dtype_skip_layers == ["0", "31"]


def test_canary_of_an_odd_baseline_parses_to_the_calibrated_checkpoint_with_fp8(serve_parser: Any) -> None:
    root, _ = serve_parser
    canary = build_canary_workload(OWNER, SPEC, baseline_with_odd_spellings(), 1)
    container = canary["spec"]["template"]["spec"]["containers"][0]
    argv = [*container["command"], *container["args"]]
    assert argv[:2] == ["vllm", "serve"]
    parsed = root.parse_args(argv[1:])
    assert parsed.model_tag == checkpoint_location(SPEC).path
    assert parsed.kv_cache_dtype == SPEC.serving.canary.kv_cache_dtype
    assert parsed.served_model_name == ["llm"]
    assert parsed.kv_cache_dtype_skip_layers == []  # kvcal owns it: only spec.serving.canary.protectedLayers


# --- the allow-list (kvcal.core.guard.vllm_allowlist) -----------------------------------------------------------------


def test_kvcals_table_of_vllm_arguments_is_this_parsers(serve_parser: Any) -> None:
    """operator/kvcal/data/vllm-serve-flags.json is what tests.support.vllm_serve_flags reads off the real parser."""
    from tests.support.vllm_serve_flags import catalog, render

    _, serve = serve_parser
    committed = resources.files("kvcal").joinpath(vllm_allowlist.CATALOG).read_text(encoding="utf-8")
    regenerate = "python -m tests.support.vllm_serve_flags > operator/kvcal/data/vllm-serve-flags.json"
    assert committed == render(catalog(serve)), f"regenerate it: {regenerate}"


def _candidates() -> list[list[str]]:
    """extraArgs to try against both: every default flag with good and bad values, and the spellings argparse and
    vLLM accept for other arguments (abbreviations, _ forms, --flag.key, short options with attached values)."""
    values = ("8", "-1", "0.5", "1e3", "8k", "8K", "1.5k", "auto", "None", "x", "8_0", " 8")
    found: list[list[str]] = [*HOSTILE]
    for flag in vllm_allowlist.DEFAULT_ALLOWED:
        found += [[flag, value] for value in values]
        found += [[f"{flag}={value}"] for value in ("8", "true", "")]
        found += [["--" + flag[2:].replace("-", "_")], *([flag[:end], "8"] for end in range(4, len(flag)))]
    found += [["--max-num-seqs.x", "1"], ["--compilation-config.mode=0"], ["-O3"], ["-tp2"], ["-tp", "2"], ["-ep"]]
    found += [["--enforce-eager", "true"], ["--no-enforce-eager"], ["--no-enable-prefix-caching"]]
    return [*found, ["--seed", "--enforce-eager"]]


CANDIDATES = _candidates()


def _dests(parsed: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(parsed).items() if not callable(v)}


@pytest.mark.parametrize("extra_args", CANDIDATES, ids=lambda a: " ".join(a))
def test_what_the_allow_list_lets_through_sets_only_allowed_arguments_in_vllm(
    serve_parser: Any, extra_args: list[str]
) -> None:
    """Whatever passes the default allow-list parses in vLLM, and changes no argument but the allowed ones: no
    abbreviation, sub-key or attached value reaches another argument. (What it refuses may or may not parse.)"""
    _, serve = serve_parser
    if vllm_allowlist.refusals(extra_args, vllm_allowlist.allowed_names(vllm_allowlist.DEFAULT_ALLOWED)):
        return
    kvcal_args = ["--model", "/ckpt", "--kv-cache-dtype", "fp8_e4m3", "--served-model-name", "llm"]
    before = _dests(serve.parse_args(kvcal_args))
    after = _dests(serve.parse_args([*kvcal_args, *extra_args]))  # SystemExit: vLLM refuses what kvcal let through
    options = _options(serve)
    allowed_dests = {options[flag].dest for flag in vllm_allowlist.DEFAULT_ALLOWED}
    changed = {k for k in after if after[k] != before.get(k)}
    assert changed <= allowed_dests, (extra_args, changed - allowed_dests)


@pytest.mark.parametrize("extra_args", HOSTILE, ids=lambda a: a[0].split("=")[0])
def test_the_issues_hostile_flags_really_reach_vllm_and_are_refused(serve_parser: Any, extra_args: list[str]) -> None:
    _, serve = serve_parser
    kvcal_args = ["--model", "/ckpt", "--kv-cache-dtype", "fp8_e4m3", "--served-model-name", "llm"]
    before, after = _dests(serve.parse_args(kvcal_args)), _dests(serve.parse_args([*kvcal_args, *extra_args]))
    assert after != before, f"{extra_args} changes nothing in vLLM 0.32"
    found = vllm_allowlist.refusals(extra_args, vllm_allowlist.allowed_names(vllm_allowlist.DEFAULT_ALLOWED))
    assert [r.policy for r in found] == [True]
