"""Promotion writes into the baseline only the extraArgs the allow-list allows at promotion time (issue #23): the real
decide() with the policy changed between the canary's passes and the promotion's. The same on a real API server, with
the policy changed through the chart: tests/e2e/test_policy.py."""

from typing import Any

from kvcal.core.decide import decide
from kvcal.core.guard.policy import VLLM_FLAGS_VALUE, Policy
from kvcal.core.manifests import canary_name
from kvcal.core.observations import PROMOTE_ANNOTATION, ApplyOwnedFields, Decision, Delete
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import KVCalibrationStatus, Phase
from tests.support.decide import ANALYZING, NOW, POLICY, SPEC, baseline, canary, observations, spec, status

EXTRA_ARGS = ["--max-num-seqs", "8", "--enforce-eager"]
# The admin took --enforce-eager off the list after the canary started (a chart upgrade restarts the operator).
TIGHTENED = Policy(calibrator_image=POLICY.calibrator_image, vllm_flags_allowed=("--max-num-seqs",))


def with_args(**promotion: Any) -> KVCalibrationSpec:
    return spec(serving={**SPEC["serving"], "canary": {"extraArgs": EXTRA_ARGS}}, promotion=promotion)


def written(d: Decision) -> list[list[str]]:
    """The vLLM args of each baseline write in the decision."""
    return [a.manifest["spec"]["template"]["spec"]["containers"][0]["args"] for a in d.actions
            if isinstance(a, ApplyOwnedFields)]  # fmt: skip


def promoted_condition(d: Decision) -> tuple[str, str, str]:
    found = next(c for c in d.status.conditions if c.type == "Promoted")
    return found.status, found.reason, found.message


def awaiting() -> KVCalibrationStatus:
    return ANALYZING.model_copy(update={"phase": Phase.AWAITING_PROMOTION})


def test_promote_writes_the_allowed_args_under_the_policy_the_canary_ran_with() -> None:
    obs = observations(canary=canary(), gates={PROMOTE_ANNOTATION: "1"})
    d = decide(with_args(mode="manual"), awaiting(), obs, NOW)
    assert d.status.phase == Phase.PROMOTING
    (args,) = written(d)
    assert args[-3:] == EXTRA_ARGS


def test_a_policy_tightened_before_promotion_rolls_back_without_writing_the_baseline() -> None:
    obs = observations(canary=canary(), gates={PROMOTE_ANNOTATION: "1"}, policy=TIGHTENED)
    d = decide(with_args(mode="manual"), awaiting(), obs, NOW)
    assert written(d) == []
    assert d.status.phase == Phase.ROLLING_BACK and d.status.history[-1].reason == "PolicyDenied"
    message = d.status.message or ""
    assert "spec.serving.canary.extraArgs[2]: --enforce-eager is not a vLLM flag the operator allows" in message
    assert f"chart value {VLLM_FLAGS_VALUE}" in message
    done = decide(with_args(mode="manual"), d.status, observations(canary=None, policy=TIGHTENED), NOW)
    assert done.status.phase == Phase.ROLLED_BACK and written(done) == []
    assert promoted_condition(done)[:2] == ("False", "RolledBack")


def test_auto_promotion_at_the_end_of_the_analysis_is_refused_the_same_way() -> None:
    """Analyzing chains into Promoting in one pass: the pass's policy check comes first."""
    d = decide(with_args(mode="auto"), ANALYZING, observations(canary=canary(), policy=TIGHTENED), NOW)
    assert written(d) == [] and d.status.phase == Phase.ROLLING_BACK
    assert VLLM_FLAGS_VALUE in (d.status.message or "")


def test_promoting_rechecks_right_before_the_write_and_fails_with_the_canary_removed() -> None:
    """Promoting was entered under the old policy but the write has not landed (the operator restarted with the new
    chart value in between): nothing is written, the canary goes as in a rollback, Failed names flag and value."""
    promoting = status(Phase.PROMOTING, canary=ANALYZING.canary, verification=ANALYZING.verification)
    unchanged = decide(with_args(), promoting, observations(canary=canary()), NOW)
    assert [args[-3:] for args in written(unchanged)] == [EXTRA_ARGS]  # the control: the old policy writes

    d = decide(with_args(), promoting, observations(canary=canary(), policy=TIGHTENED), NOW)
    assert written(d) == []
    assert Delete("Deployment", canary_name("smollm2")) in d.actions
    assert d.status.phase == Phase.FAILED and d.status.history[-1].reason == "PolicyDenied"
    assert "the baseline llm was left untouched" in (d.status.message or "")
    state, reason, message = promoted_condition(d)
    assert (state, reason) == ("False", "PolicyDenied")
    assert "--enforce-eager is not a vLLM flag the operator allows" in message and VLLM_FLAGS_VALUE in message
    assert [e.reason for e in d.events] == ["PolicyDenied"] and d.events[0].type == "Warning"


def test_a_promotion_already_written_finishes_its_rollout() -> None:
    """The write landed under the policy of its time; finishing the rollout writes nothing more."""
    promoting = status(Phase.PROMOTING, canary=ANALYZING.canary, verification=ANALYZING.verification)
    d = decide(with_args(), promoting, observations(canary=canary(), baseline=baseline(promoted=True),
                                                    policy=TIGHTENED), NOW)  # fmt: skip
    assert written(d) == [] and d.status.phase == Phase.SUCCEEDED
