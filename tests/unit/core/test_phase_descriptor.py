"""One descriptor declares every phase. A phase added to a copy of it, with no other edit, is entered,
polled, aborted and left by decide(), read by the reconciler's table and shown by `kvcal status`."""

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcal import generated
from kvcal.core import phases as phases_module
from kvcal.core.decide import decide
from kvcal.core.observations import ABORT_ANNOTATION, PROMOTE_ANNOTATION
from kvcal.core.phases import LIFECYCLE, IllegalTransition, Lifecycle, PhaseDescriptor
from kvcal.core.status.builder import Builder
from kvcal.ctl import render_status
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import KVCalibrationStatus, Phase
from tests.support.decide import NOW, observations, spec

ROOT = Path(__file__).resolve().parents[3]
SOAKING = "Soaking"  # not a CRD phase: it exists only in this test's copy of the descriptor
SOAK_POLL_SECONDS = 42.0


def _enter_soak(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    draft.move(SOAKING, "Soak", "soaking before calibrating")


def _soak(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    """Waits (the descriptor's poll) until the baseline is there, then goes on to Calibrating."""
    if draft.obs.baseline is None:
        draft.update(message="soaking: waiting for the baseline")
        return
    draft.move(Phase.CALIBRATING, "Soaked", "soaked")


def with_soak() -> Lifecycle:
    soak = PhaseDescriptor(
        SOAKING,
        "artifact",
        _soak,
        frozenset({"baseline"}),
        SOAK_POLL_SECONDS,
        frozenset({Phase.CALIBRATING, Phase.ROLLING_BACK, Phase.PENDING, Phase.INVALID_SPEC}),
        active=True,
        abortable=True,
    )
    pending = LIFECYCLE.edited(Phase.PENDING, handler=_enter_soak, next=frozenset({SOAKING, Phase.INVALID_SPEC}))
    return LIFECYCLE.with_phases(soak, pending)


def test_a_phase_added_to_a_copy_is_entered_polled_and_left() -> None:
    lifecycle = with_soak()
    entered = decide(spec(), KVCalibrationStatus(), observations(), NOW, lifecycle)
    assert entered.status.phase == SOAKING and entered.requeue_after == 0.0
    assert [entry.phase for entry in entered.status.history] == [SOAKING]
    assert lifecycle.observes(SOAKING) == {"baseline"}  # what the reconciler reads for it

    polled = decide(spec(), entered.status, observations(baseline=None), NOW, lifecycle)
    assert polled.status.phase == SOAKING and polled.requeue_after == SOAK_POLL_SECONDS
    assert polled.status.message == "soaking: waiting for the baseline"

    left = decide(spec(), polled.status, observations(), NOW, lifecycle)
    assert left.status.phase == Phase.CALIBRATING and left.requeue_after == 0.0
    assert [entry.phase for entry in left.status.history] == [SOAKING, Phase.CALIBRATING]
    # The status as written and read back keeps the new phase (no model edit needed).
    assert KVCalibrationStatus.model_validate(polled.status.to_wire()).phase == SOAKING


def test_the_added_phase_flags_drive_the_commands_and_kvcal_status() -> None:
    lifecycle = with_soak()
    soaking = decide(spec(), KVCalibrationStatus(), observations(), NOW, lifecycle).status
    aborted = decide(spec(), soaking, observations(gates={ABORT_ANNOTATION: "now"}), NOW, lifecycle)
    assert aborted.status.phase == Phase.ROLLING_BACK and aborted.cleared_annotations == (ABORT_ANNOTATION,)
    promote = observations(baseline=None, gates={PROMOTE_ANNOTATION: "now"})
    ignored = decide(spec(), soaking, promote, NOW, lifecycle)
    assert ignored.status.phase == SOAKING and [event.reason for event in ignored.events] == ["PromoteIgnored"]

    shown = render_status({"metadata": {"name": "smollm2"}, "status": soaking.to_wire()}, lifecycle)
    assert f"Phase: {SOAKING}" in shown and "(artifact)" in shown
    assert "commands acted on now: abort" in shown
    assert f"{SOAKING}: Soak" in shown  # the history line
    unknown = render_status({"metadata": {"name": "smollm2"}, "status": soaking.to_wire()})
    assert "unknown to this kvcal" in unknown


def test_the_real_descriptor_refuses_the_added_phase() -> None:
    """Without the copy, nothing knows the phase: a move there is illegal, and a status in it is Blocked."""
    with pytest.raises(IllegalTransition, match=f"Pending -> {SOAKING}"):
        LIFECYCLE.check_transition(Phase.PENDING, SOAKING)
    d = decide(spec(), KVCalibrationStatus(phase=SOAKING), observations(), NOW)
    assert d.status.phase == SOAKING and "not one this operator knows" in (d.status.message or "")
    assert not d.actions


def test_a_descriptor_naming_an_undeclared_phase_is_refused() -> None:
    broken = LIFECYCLE.edited(Phase.PENDING, next=frozenset({"Nowhere"}))
    with pytest.raises(ValueError, match="undeclared phases \\['Nowhere'\\]"):
        LIFECYCLE.with_phases(broken)


def test_the_descriptor_the_enum_and_the_crd_name_the_same_phases() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "kvcal.dev_kvcalibrations.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert set(schema["phase"]["enum"]) == set(LIFECYCLE.phases) == set(Phase)


def test_the_derived_tables() -> None:
    """What the nine tables of old said, now read from the descriptor."""
    names: dict[str, Any] = {flag: LIFECYCLE.names(flag) for flag in ("active", "terminal", "retryable", "serving")}
    assert names["active"] == {"Calibrating", "Verifying", "Deploying", "Analyzing", "AwaitingPromotion"}
    assert names["terminal"] == {"Succeeded", "RolledBack", "Failed"}
    assert names["retryable"] == {"RolledBack", "Failed"}
    assert names["serving"] == {"Deploying", "Analyzing", "AwaitingPromotion"}
    assert LIFECYCLE.acts_on("promote") == {"AwaitingPromotion"}
    assert LIFECYCLE.acts_on("abort") == names["active"]
    assert {phase: descriptor.machine for phase, descriptor in LIFECYCLE.phases.items()} == {
        "Pending": "artifact",
        "Calibrating": "artifact",
        "Verifying": "artifact",
        "Deploying": "rollout",
        "Analyzing": "rollout",
        "AwaitingPromotion": "rollout",
        "Promoting": "rollout",
        "RollingBack": "rollout",
        "Succeeded": "rollout",
        "RolledBack": "rollout",
        "Failed": "shared",
        "InvalidSpec": "shared",
    }


def test_every_generated_artifact_is_current() -> None:
    assert generated.stale() == [], "run: python -m kvcal.generated"
    assert generated.main(["--check"]) == 0


def test_the_phase_docstring_names_every_generated_artifact_and_the_files_a_phase_touches() -> None:
    doc = " ".join((phases_module.__doc__ or "").split())
    assert "that show it: " in doc, "phases.py no longer names the generated files"
    sentence = doc.split("that show it: ", 1)[1].split(". ", 1)[0]
    named = [path.strip() for path in sentence.split(",")]
    assert named == [artifact.path for artifact in generated.ARTIFACTS]
    by_hand = re.search(r"Adding a phase touches (\d+) files by hand: (.*?)\. ", doc)
    assert by_hand is not None and int(by_hand.group(1)) == len(HAND_EDITED_FOR_A_PHASE)
    assert all(path in by_hand.group(2) for path in HAND_EDITED_FOR_A_PHASE)


# What a new phase needs by hand besides the generated files (the row, its handler, the enum member).
HAND_EDITED_FOR_A_PHASE = ("row here", "core/rollout/machine.py", "models/status.py")


def test_a_phase_added_to_the_table_reaches_every_generated_artifact() -> None:
    """Generated from the table, not merely compared: a phase only the copy has shows up in each artifact, with its
    health and in the stuck-phase alert, and the table's facts are what the hand-written files said before."""
    soak = with_soak()
    soaking = soak.with_phases(soak.edited(SOAKING, health="Suspended", stuck_alert=True))
    rendered = {path: new for path, (_, new) in generated.render_all(lifecycle=soaking).items()}
    assert f'{SOAKING} = "Suspended"' in rendered[generated.HEALTH_LUA]
    assert f'{SOAKING} = "Suspended"' in rendered[generated.ARGOCD_CM]
    assert (
        f"|{SOAKING}" in generated.stuck_regex(soaking)
        and generated.stuck_regex(soaking) in rendered[generated.PROMETHEUS_RULE]
    )
    # The CRD's phase enum follows Phase (models/status.py), which test_the_descriptor_the_enum_and_the_crd... ties to
    # the table; the other artifacts are written from the table itself.
    from_table = [generated.HEALTH_LUA, generated.ARGOCD_CM, generated.PROMETHEUS_RULE]
    assert generated.stale(lifecycle=soaking) == from_table
    assert generated.stuck_regex(LIFECYCLE) == "Pending|Calibrating|Verifying|Deploying|Analyzing|Promoting|RollingBack"


def test_the_phase_facts() -> None:
    """Warning events, Ready, Argo CD health and notifications: one column each in the table."""
    health = {name: descriptor.health for name, descriptor in LIFECYCLE.phases.items()}
    assert {name for name, h in health.items() if h != "Progressing"} == {
        "AwaitingPromotion", "Succeeded", "RolledBack", "Failed", "InvalidSpec",
    }  # fmt: skip
    assert LIFECYCLE.names("warning") == {"RollingBack", "RolledBack", "Failed", "InvalidSpec"}
    assert LIFECYCLE.names("ready") == {"Succeeded"}
    notifies = {name: d.notifies for name, d in LIFECYCLE.phases.items() if d.notifies is not None}
    assert notifies == {
        "Analyzing": "AnalysisStarted", "AwaitingPromotion": "AwaitingPromotion", "Succeeded": "Promoted",
        "RolledBack": "RolledBack", "Failed": "Failed",
    }  # fmt: skip


def test_ready_is_read_from_the_table() -> None:
    """A copy of the table whose Succeeded is not `ready` keeps Ready=False there: the builder reads the column."""
    status = KVCalibrationStatus(phase=Phase.SUCCEEDED, observed_generation=1)
    for lifecycle, ready in (
        (LIFECYCLE, "True"),
        (LIFECYCLE.with_phases(LIFECYCLE.edited(Phase.SUCCEEDED, ready=False)), "False"),
    ):
        decision = decide(spec(), status, observations(), NOW, lifecycle=lifecycle)
        condition = next(c for c in decision.status.conditions if c.type == "Ready")
        assert condition.status == ready


def test_an_unforeseen_error_raises_in_tests_and_blocks_in_the_operator() -> None:
    def broken(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
        raise KeyError("a bug")

    lifecycle = LIFECYCLE.with_phases(LIFECYCLE.edited(Phase.PENDING, handler=broken))
    with pytest.raises(KeyError, match="a bug"):
        decide(spec(), KVCalibrationStatus(), observations(), NOW, lifecycle)
    d = decide(spec(), KVCalibrationStatus(), observations(), NOW, lifecycle, on_unexpected="block")
    assert d.status.phase == Phase.PENDING and "KeyError" in (d.status.message or "")
    assert isinstance(d.unexpected, KeyError) and not d.actions
