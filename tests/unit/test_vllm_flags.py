"""kvcal.vllm_flags: flags read the way vLLM's parser reads them, and what extraArgs may not set.

The agreement with vLLM 0.32's real parser is proven in tests/integration/test_vllm_flags_parser.py; the same
reproductions are rejected at admission in tests/integration/test_crd_extra_args.py.
"""

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from kvcal import vllm_flags
from kvcal.models.spec import KVCalibrationSpec
from kvcal.services.observe import parse_spec
from tests.support.vllm_args import FREE_SPELLINGS, OWNED_SPELLINGS

REPO = Path(__file__).resolve().parents[2]
MINIMAL_SPEC: dict[str, Any] = yaml.safe_load((REPO / "examples" / "minimal-per-tensor.yaml").read_text())["spec"]


@pytest.mark.parametrize(("arg", "flag"), OWNED_SPELLINGS)
def test_every_spelling_of_an_owned_flag_is_recognised(arg: str, flag: str) -> None:
    owned = vllm_flags.owned_flag(arg)
    assert owned is not None and owned.name == flag


@pytest.mark.parametrize("arg", FREE_SPELLINGS)
def test_flags_kvcal_does_not_own_pass(arg: str) -> None:
    assert vllm_flags.owned_flag(arg) is None
    assert vllm_flags.extra_args_problems([arg]) == []


@pytest.mark.parametrize(
    ("arg", "name"),
    [
        ("--kv_cache_dtype=auto", "--kv-cache-dtype"),
        ("  --hf_overrides.a_b=1", "--hf-overrides"),
        ("-q_x", "-q_x"),  # vLLM turns `_` into `-` only in `--` names
        ("/etc", None),
        ("-1", None),  # argparse reads a negative number as a value
        ("-0.5", None),
        ("-", None),
        ("--", "--"),
    ],
)
def test_flag_name_normalises_like_vllm(arg: str, name: str | None) -> None:
    assert vllm_flags.flag_name(arg) == name


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        (["/etc"], 0),  # the first item follows the operator's `--kv-cache-dtype X`: a positional, i.e. the model
        (["--max-num-seqs=1", "/etc"], 1),
        (["--enforce-eager", "--", "/etc"], 1),
        ([" /models/other "], 0),
    ],
)
def test_positional_arguments_are_refused(args: list[str], refused: int) -> None:
    assert [i for i, _ in vllm_flags.extra_args_problems(args)] == [refused]


def test_values_after_their_flag_pass() -> None:
    args = ["--max-num-seqs", "1", "--override-generation-config", "{}", "--max-model-len=4096", "-tp", "2"]
    assert vllm_flags.extra_args_problems(args) == []


def test_find_and_without_read_every_spelling() -> None:
    args = ["--model=/m", "--kv_cache_dtype", "auto", " --calculate_kv_scales", "--kv-cache-dtype-skip-layers", "0"]
    found = vllm_flags.find(args, vllm_flags.MODEL)
    assert found == vllm_flags.Occurrence(0, "/m", inline=True)
    dropped = vllm_flags.without(args, [vllm_flags.KV_CACHE_DTYPE, vllm_flags.CALCULATE_KV_SCALES])
    assert dropped == ["--model=/m", "--kv-cache-dtype-skip-layers", "0"]


def _spec_with_extra_args(args: list[str]) -> dict[str, Any]:
    data = yaml.safe_load(yaml.safe_dump(MINIMAL_SPEC))
    data["serving"].setdefault("canary", {})["extraArgs"] = args
    return dict(data)


@pytest.mark.parametrize(("arg", "flag"), OWNED_SPELLINGS)
def test_the_model_rejects_owned_flags_naming_item_flag_and_fix(arg: str, flag: str) -> None:
    owned = vllm_flags.owned_flag(arg)
    assert owned is not None
    with pytest.raises(ValidationError) as raised:
        KVCalibrationSpec.model_validate(_spec_with_extra_args(["--max-num-seqs", "1", arg]))
    message = str(raised.value)
    assert "spec.serving.canary.extraArgs[2]" in message
    assert f"sets {flag}, which kvcal owns: {owned.fix}" in message


def test_invalid_spec_message_names_the_item() -> None:
    """The reconciler's InvalidSpec message (status.message) carries the validator's words unmangled."""
    parsed, error = parse_spec({"spec": _spec_with_extra_args(["--enforce-eager", "--kv_cache_dtype=auto"])})
    assert parsed is None and error is not None
    assert "spec.serving.canary.extraArgs[1]: '--kv_cache_dtype=auto' sets --kv-cache-dtype" in error
    assert "use spec.serving.canary.kvCacheDtype" in error


def test_the_model_refuses_skip_layers_in_extra_args_naming_protected_layers() -> None:
    with pytest.raises(ValidationError, match=r"spec\.serving\.canary\.protectedLayers"):
        KVCalibrationSpec.model_validate(_spec_with_extra_args(["--kv-cache-dtype-skip-layers", "0", "31"]))


def test_without_drops_every_value_of_a_variadic_flag() -> None:
    args = ["--kv-cache-dtype-skip-layers", "0", "31", "--seed", "1", "--kv_cache_dtype_skip_layers=2", "-tp", "2"]
    assert vllm_flags.without(args, [vllm_flags.KV_CACHE_DTYPE_SKIP_LAYERS]) == ["--seed", "1", "-tp", "2"]


def test_crd_carries_the_admission_rules_built_from_the_owned_list() -> None:
    """One source of truth: the CRD's CEL on extraArgs is generated from OWNED_FLAGS (paste the new rule in after
    changing the list)."""
    for crd_path in (REPO / "crds", REPO / "charts" / "kvcal" / "crds"):
        crd = yaml.safe_load((crd_path / "kvcal.dev_kvcalibrations.yaml").read_text())
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        extra_args = spec["properties"]["serving"]["properties"]["canary"]["properties"]["extraArgs"]
        assert extra_args["items"]["x-kubernetes-validations"] == vllm_flags.admission_item_rules()
        assert [r["rule"] for r in extra_args["x-kubernetes-validations"]] == [vllm_flags.admission_list_rule()]


@pytest.mark.parametrize(
    ("args", "backend"),
    [
        (["vllm", "serve", "m", "--attention-backend", "FLASHINFER"], "FLASHINFER"),
        (["--attention_backend=FLASH_ATTN", "--attention-backend", "TRITON_ATTN"], "TRITON_ATTN"),  # the last wins
        (["--attention-backend"], None),  # no value: vLLM would refuse it, so it names no backend
        (["--attention-config", "{}"], None),
    ],
)
def test_attention_backend_reads_the_flag_as_vllm_does(args: list[str], backend: str | None) -> None:
    assert vllm_flags.attention_backend(args) == backend
