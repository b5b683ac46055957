"""kvcal.core.guard.vllm_allowlist: spec.serving.canary.extraArgs passes only the flags the cluster admin allows
(policy.vllmFlags.allowed), in their canonical spellings, each value of the type vLLM declares.

The table of vLLM's arguments is checked against vLLM 0.32's real parser in tests/integration/
test_vllm_flags_parser.py; the refusals reach the status on a real API server in tests/e2e/test_policy.py.
"""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal import vllm_flags
from kvcal.core.guard import vllm_allowlist
from kvcal.core.guard.policy import VLLM_FLAGS_VALUE, Policy, check
from kvcal.core.guard.vllm_allowlist import DEFAULT_ALLOWED, allowed_names, catalog, refusals, unallowable
from kvcal.models.spec import KVCalibrationSpec
from tests.support.decide import SPEC, spec
from tests.support.vllm_args import HOSTILE

REPO = Path(__file__).resolve().parents[4]
DEFAULT = allowed_names(DEFAULT_ALLOWED)


def refused(args: list[str], allowed: frozenset[str] = DEFAULT) -> list[tuple[int, bool]]:
    return [(r.index, r.policy) for r in refusals(args, allowed)]


@pytest.mark.parametrize(
    "args",
    [
        ["--max-num-seqs", "8"],
        ["--max-num-seqs=8"],
        ["--max_num_seqs=8"],  # vLLM turns _ into -
        ["--max_num_batched_tokens", "8k"],
        ["--max-num-batched-tokens=2K"],
        ["--gpu-memory-utilization", "0.85"],
        ["--device-memory-utilization=.9"],  # the same argument's other long name
        ["--kv-cache-memory-bytes", "4G"],
        ["--kv-cache-memory-bytes=None"],  # vLLM's optional_type: the default
        ["--max-model-len", "32768"],
        ["--max-model-len=32k"],
        ["--max-model-len", "auto"],
        ["--max-model-len", "-1"],
        ["--block-size", "16"],
        ["--enable-prefix-caching"],
        ["--no-enable-prefix-caching"],
        ["--no_enable_chunked_prefill"],
        ["--long-prefill-token-threshold", "0"],
        ["--max-cudagraph-capture-size", "256"],
        ["--enforce-eager", "--seed", "-1"],
        ["--seed", "0", "--seed=7"],  # the last wins, both checked
        [],
    ],
    ids=lambda a: " ".join(a) or "empty",
)
def test_default_flags_pass_in_every_canonical_spelling(args: list[str]) -> None:
    assert refused(args) == []


@pytest.mark.parametrize("args", HOSTILE, ids=lambda a: a[0].split("=")[0])
def test_the_issues_hostile_flags_are_refused_naming_the_chart_value(args: list[str]) -> None:
    spec = _spec(["--max-num-seqs", "8", *args])
    (violation,) = check(spec, Policy())
    flag = args[0].split("=")[0]
    assert violation.field == "spec.serving.canary.extraArgs[2]" and violation.chart_value == VLLM_FLAGS_VALUE
    assert f"{flag} is not a vLLM flag the operator allows" in str(violation)
    assert f"chart value {VLLM_FLAGS_VALUE}" in str(violation)


def test_every_vllm_flag_outside_the_default_is_refused() -> None:
    """The class, not the examples: each of vllm serve's ~300 arguments, in each long spelling, passes only if it is
    on the default list."""
    _, by_name = catalog()
    checked = 0
    for name, argument in by_name.items():
        if not name.startswith("--"):
            continue
        value = [] if argument.value == "none" else ["1"]
        outcome = refused([name, *value])
        allowed = bool(set(argument.long_names) & set(DEFAULT_ALLOWED))
        expected = [] if allowed else [(0, vllm_flags.owned_flag(name) is None)]  # owned: no policy value opens it
        assert outcome == expected, (name, outcome)
        checked += 1
    assert checked > 300


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--max-num-seq", "8"], "abbreviates --max-num-seqs"),  # argparse would read it as --max-num-seqs
        (["--max_num_seq=8"], "abbreviates --max-num-seqs"),
        (["--enforce"], "abbreviates --enforce-eager"),
        (["--gpu-mem", "0.9"], "abbreviations are refused"),
        (["--max-num", "8"], "abbreviates several flags"),
        (["-tp", "2"], "write --tensor-parallel-size"),
        (["-tp2"], "write --tensor-parallel-size"),
        (["-O3"], "write --optimization-level"),
        (["--max-num-seqs.x", "1"], "JSON sub-key of --max-num-seqs"),
        (["--compilation-config.mode=0"], "JSON sub-key of --compilation-config"),
        ([" --max-num-seqs", "8"], "has spaces"),
        (["--max-num-seqs 8"], "has spaces"),
        (["--no-such-flag"], "is not an argument of vLLM 0.32.0's `vllm serve`"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_other_spellings_are_refused_naming_what_to_write(args: list[str], words: str) -> None:
    found = refusals(args, DEFAULT)
    assert [r.index for r in found] == [0] and not found[0].policy, found
    assert words in found[0].message


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--max-num-seqs", "eight"], "--max-num-seqs takes an integer, not 'eight'"),
        (["--max-num-seqs=8.0"], "takes an integer"),
        (["--max-num-seqs", "8_000"], "takes an integer"),  # int() reads it; kvcal is stricter
        (["--block-size", "0x10"], "takes an integer"),
        (["--seed", "None"], "takes an integer"),  # not an optional argument
        (["--gpu-memory-utilization", "nan"], "takes a number, not 'nan'"),
        (["--gpu-memory-utilization=90%"], "takes a number"),
        (["--max-num-batched-tokens", "1.5K"], "k/m/g/t"),  # vLLM refuses decimals with binary suffixes too
        (["--max-model-len", "lots"], "auto or -1"),
        (["--enforce-eager=true"], "--enforce-eager takes no value"),
        (["--max-num-seqs"], "--max-num-seqs needs a value"),
        (["--max-num-seqs", "--enforce-eager"], "--max-num-seqs needs a value"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_values_are_checked_against_vllms_declared_type(args: list[str], words: str) -> None:
    (refusal,) = refusals(args, DEFAULT)
    assert refusal.index == 0 and not refusal.policy and words in refusal.message


def test_a_value_after_a_switch_is_a_stray_positional() -> None:
    """`--enforce-eager true`: argparse leaves `true` to vllm serve's positional model."""
    assert refused(["--enforce-eager", "true"]) == [(1, False)]


def test_a_refused_flags_value_is_not_reported_again() -> None:
    assert refused(["--middleware", "attacker.module", "--max-num-seqs", "8"]) == [(0, True)]
    assert refused(["--chat-template", "/etc/passwd", "stray"]) == [(0, True), (2, False)]


def test_owned_flags_stay_refused_and_can_never_be_allowed() -> None:
    for flag in vllm_flags.OWNED_FLAGS:
        for name in flag.names:
            why = unallowable(name) or ""
            assert "kvcal owns" in why or "not an argument" in why or "canonical" in why, (name, why)  # gone, -q
            found = refusals([name, "x"] if flag.takes_value else [name], DEFAULT)
            assert found and "which kvcal owns" in found[0].message and not found[0].policy, (name, found)
    with pytest.raises(ValueError, match=f"{VLLM_FLAGS_VALUE}: --kv-cache-dtype sets --kv-cache-dtype"):
        Policy(vllm_flags_allowed=("--max-num-seqs", "--kv-cache-dtype"))


def test_the_default_holds_no_json_config_no_text_and_nothing_that_reads_files() -> None:
    _, by_name = catalog()
    for flag in DEFAULT_ALLOWED:
        argument = by_name[flag]
        assert argument.name == flag, f"{flag}: use the canonical spelling"
        assert argument.value in ("none", "int", "float", "size", "size-or-auto"), (flag, argument.value)
        assert not flag.endswith("-config") and unallowable(flag) is None
    assert unallowable("--compilation-config") is None  # an admin may allow it: its value must then be JSON
    config = allowed_names(["--compilation-config"])
    assert refusals(["--compilation-config", '{"mode": 0}'], config) == []
    assert "takes a JSON value" in refusals(["--compilation-config", "{mode: 0"], config)[0].message


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (("--max-num-seq",), "not an argument"),  # an admin's list is exact too
        (("--max_num_seqs",), "canonical spelling"),
        (("-tp",), "canonical spelling"),
        (("--lora-modules",), "cannot check"),
        (("--model",), "kvcal owns"),
    ],
)
def test_the_policy_value_is_checked(flags: tuple[str, ...], words: str) -> None:
    with pytest.raises(ValueError, match=VLLM_FLAGS_VALUE) as e:
        Policy(vllm_flags_allowed=flags)
    assert words in str(e.value)


def test_an_admin_list_opens_exactly_its_flags() -> None:
    spec = _spec(["--trust-remote-code", "--max-num-seqs", "8"])
    assert [v.chart_value for v in check(spec, Policy())] == [VLLM_FLAGS_VALUE]
    assert check(spec, Policy(vllm_flags_allowed=("--trust-remote-code", "--max-num-seqs"))) == []
    assert [v.field for v in check(spec, Policy(vllm_flags_allowed=()))] == [
        "spec.serving.canary.extraArgs[0]",
        "spec.serving.canary.extraArgs[1]",
    ]


def test_the_chart_default_is_the_operators_default() -> None:
    values: Any = yaml.safe_load((REPO / "charts/kvcal/values.yaml").read_text())
    node = values
    for key in VLLM_FLAGS_VALUE.split("."):
        node = node[key]
    assert tuple(node) == DEFAULT_ALLOWED == Policy().vllm_flags_allowed


def test_the_examples_and_tests_flags_pass_the_default() -> None:
    """What the repository passes in extraArgs today keeps working."""
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "KVCalibration":
                args = doc["spec"].get("serving", {}).get("canary", {}).get("extraArgs", [])
                assert refused(args) == [], (path.name, args)
    for args in (["--max-num-seqs", "1"], ["--enforce-eager"], ["--max-model-len=2048"], ["--max-num-seqs=128"]):
        assert refused(args) == [], args


def test_the_table_is_vllm_0_32s() -> None:
    data = json.loads((REPO / "operator/kvcal/data/vllm-serve-flags.json").read_text())
    assert data["vllm"] == "0.32.0"
    assert vllm_allowlist.catalog()[0] == "0.32.0"


def _spec(extra_args: list[str]) -> KVCalibrationSpec:
    """The shared test spec, with the operator's default calibrator image (the policy allows it) and `extra_args`."""
    calibration = {**SPEC["calibration"], "job": {"image": Policy().calibrator_image}}
    return spec(calibration=calibration, serving={**SPEC["serving"], "canary": {"extraArgs": extra_args}})
