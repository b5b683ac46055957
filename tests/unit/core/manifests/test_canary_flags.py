"""The canary and the promoted baseline drop the baseline's KV overrides in every spelling vLLM accepts.

vLLM reads `--kv_cache_dtype=auto` as --kv-cache-dtype and the last occurrence wins, so a baseline spelling that
survives the copy decides the canary's KV dtype (and, after promotion, production's). The same argument lists are
parsed by vLLM 0.32's real parser in tests/integration/test_vllm_flags_parser.py.
"""

from typing import Any

from kvcal import vllm_flags
from kvcal.core.manifests import build_canary_workload, build_promoted_baseline
from kvcal.core.manifests.jobs import checkpoint_location
from kvcal.core.spechash import spec_hash
from tests.support.decide import OWNER, spec
from tests.support.vllm_args import baseline_with_odd_spellings

SPEC = spec()


def _canary_argv(pod_spec: dict[str, Any]) -> list[str]:
    container = pod_spec["containers"][0]
    return [*container.get("command", []), *container["args"]]


def _assert_only_kvcal_sets_the_kv_cache(argv: list[str]) -> None:
    kv_dtype = [a for a in argv if vllm_flags.denotes(a, vllm_flags.KV_CACHE_DTYPE)]
    assert kv_dtype == ["--kv-cache-dtype"], argv
    assert argv[argv.index("--kv-cache-dtype") + 1] == SPEC.serving.canary.kv_cache_dtype
    assert not [a for a in argv if vllm_flags.denotes(a, vllm_flags.CALCULATE_KV_SCALES)], argv
    # The baseline's skip list goes with all of its values (nargs="+"): only protectedLayers decides it.
    assert not [a for a in argv if vllm_flags.denotes(a, vllm_flags.KV_CACHE_DTYPE_SKIP_LAYERS)], argv
    assert "5" not in argv and "0" not in argv, argv
    # What kvcal does not own survives; the baseline's served name is kept, not overridden by the model path.
    assert [a for a in argv if vllm_flags.denotes(a, vllm_flags.SERVED_MODEL_NAME)] == ["--served_model_name"]
    assert f"--model={checkpoint_location(SPEC).path}" in argv


def test_canary_drops_the_baselines_kv_overrides_in_any_spelling() -> None:
    canary = build_canary_workload(OWNER, SPEC, baseline_with_odd_spellings(), 1)
    _assert_only_kvcal_sets_the_kv_cache(_canary_argv(canary["spec"]["template"]["spec"]))


def test_promotion_does_not_carry_the_baselines_kv_overrides_into_production() -> None:
    patch = build_promoted_baseline(OWNER, SPEC, spec_hash(SPEC), baseline_with_odd_spellings())
    _assert_only_kvcal_sets_the_kv_cache(_canary_argv(patch["spec"]["template"]["spec"]))


PROTECTED = spec(
    serving={"baseline": {"deployment": "llm", "service": "llm"}, "canary": {"protectedLayers": {"layers": [7, 3]}}}
)


def test_protected_layers_become_one_skip_list_on_canary_and_promoted_baseline() -> None:
    canary = build_canary_workload(OWNER, PROTECTED, baseline_with_odd_spellings(), 1)
    patch = build_promoted_baseline(OWNER, PROTECTED, spec_hash(PROTECTED), baseline_with_odd_spellings())
    for pod in (canary["spec"]["template"]["spec"], patch["spec"]["template"]["spec"]):
        argv = _canary_argv(pod)
        flags = [a for a in argv if vllm_flags.denotes(a, vllm_flags.KV_CACHE_DTYPE_SKIP_LAYERS)]
        assert flags == ["--kv-cache-dtype-skip-layers"], argv
        at = argv.index("--kv-cache-dtype-skip-layers")
        assert argv[at + 1 : at + 3] == ["3", "7"] and all(a.startswith("-") for a in argv[at + 3 : at + 4]), argv
