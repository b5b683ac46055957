"""Every phase of the KVCalibration lifecycle, declared once.

Each PhaseDescriptor says which machine owns the phase (core.artifact makes a verified checkpoint, core.rollout
serves it), the handler that does its work, what the reconciler must read for it, how long to wait when nothing
wakes the operator, which phases it may move to, its flags, and what it shows outside the operator (Warning events,
Ready, Argo CD health, the stuck-phase alert, webhook notifications). decide(), the builder, the reconciler,
`kvcal status`, the notifications and the command annotations read this table and nothing else.

Adding a phase touches 3 files by hand: its row here, its handler in its machine (core/artifact/machine.py or
core/rollout/machine.py), and its member of Phase (models/status.py). `python -m kvcal.generated` then rewrites the
generated files that show it: argocd/health.lua, argocd/argocd-cm.yaml, charts/kvcal/templates/prometheusrule.yaml,
crds/kvcal.dev_kvcalibrations.yaml, charts/kvcal/crds/kvcal.dev_kvcalibrations.yaml, docs/crd-reference.md.
tests/unit/core/test_phase_descriptor.py holds this paragraph to kvcal.generated's list and fails on a stale file.

An illegal move raises IllegalTransition: a bug in unit tests; in the operator decide() turns it, like any other
exception no handler foresaw, into a Blocked status (the traceback goes to the log).
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from kvcal.core.artifact import machine as artifact
from kvcal.core.rollout import machine as rollout
from kvcal.core.rollout.watch import watch_promoted
from kvcal.core.status.builder import Builder
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import Phase

# (draft, the spec with defaults resolved, the effective spec hash of the calibration inputs)
Handler = Callable[[Builder, KVCalibrationSpec, str], None]
# Where the handler lives; "shared": an end either machine reaches (Failed) or the spec itself (InvalidSpec).
Machine = Literal["artifact", "rollout", "shared"]
# What a phase can read: the Observations fields the reconciler fills only when a phase names them.
Observed = Literal[
    "calibration_job",
    "verification_job",
    "baseline",
    "baseline_service",
    "baseline_autoscaler",  # spec.serving.canary.capacity fromBaseline: an HPA on the baseline
    "baseline_pods",  # the baseline's pods the scheduler could not place (a promotion's surge pod)
    "canary",
    "canary_pods",  # the canary's pods the scheduler could not place
    "routed_weight",
    "gateway_features",
    "inference_pool",
]
NotifyEvent = Literal[
    "AnalysisStarted",  # Deploying -> Analyzing at the first traffic step
    "StepStarted",  # Deploying -> Analyzing at a later step (the canary's weight went up)
    "AwaitingPromotion",
    "Promoted",  # Succeeded
    "RolledBack",  # with the cause: the reason of the RollingBack entry before it
    "Failed",
    "PromotionReverted",  # in Succeeded, the baseline no longer serves the checkpoint (core.rollout.reverts)
]
# Argo CD's health statuses a phase maps to (Degraded or Progressing may also come from conditions: health.lua).
ArgoHealth = Literal["Progressing", "Suspended", "Healthy", "Degraded"]
# The commands (annotations kvcal.dev/<command>) and the flag that says where the operator acts on each.
COMMAND_FLAGS = {"promote": "promotable", "abort": "abortable", "retry": "retryable", "recalibrate": "terminal"}


@dataclass(frozen=True)
class PhaseDescriptor:
    phase: str
    machine: Machine
    handler: Handler
    # What the reconciler reads in this phase, covering the phases a pass chains into (Analyzing -> Promoting,
    # Deploying -> RollingBack, ...); gates and spec changes never chain, so a pass never acts on what it did not read.
    observes: frozenset[Observed]
    # How long to wait when nothing wakes the operator earlier (None: only a watch event or a spec change does).
    poll_seconds: float | None
    next: frozenset[str]
    active: bool = False  # work in progress: a spec change restarts it, a policy refusal rolls it back
    abortable: bool = False  # `kvcal abort` rolls back
    serving: bool = False  # a canary may take user traffic: drained before anything starts over
    promotable: bool = False  # `kvcal promote` promotes
    terminal: bool = False  # finished: never restarts by itself; `kvcal recalibrate` starts over
    retryable: bool = False  # `kvcal retry` re-runs the analysis or the pipeline
    # What the phase shows outside the operator; each is generated into its artifact or read from here (never a copy).
    warning: bool = False  # its status.history entry is sent as a Warning Event (else Normal)
    ready: bool = False  # the Ready condition is True here (unless the promotion was reverted)
    health: ArgoHealth = "Progressing"  # Argo CD's health (argocd/health.lua's table is generated from this)
    stuck_alert: bool = False  # the chart's KVCalibrationPhaseStuck alert fires when an object sits here too long
    notifies: NotifyEvent | None = None  # the webhook notification of entering it (core.notifications)


class IllegalTransition(ValueError):
    """A move along an edge that is not in the descriptor."""


@dataclass(frozen=True)
class Lifecycle:
    """The descriptor as a whole, and every table derived from it."""

    phases: Mapping[str, PhaseDescriptor]

    def __post_init__(self) -> None:
        for descriptor in self.phases.values():
            unknown = descriptor.next - set(self.phases)
            if unknown:
                raise ValueError(f"phase {descriptor.phase} may move to undeclared phases {sorted(unknown)}")

    def __getitem__(self, phase: str) -> PhaseDescriptor:
        return self.phases[phase]

    def __contains__(self, phase: object) -> bool:
        return phase in self.phases

    def names(self, flag: str) -> frozenset[str]:
        """The phases with `flag` set (active, terminal, ...)."""
        return frozenset(name for name, descriptor in self.phases.items() if getattr(descriptor, flag))

    def acts_on(self, command: str) -> frozenset[str]:
        """The phases in which the operator acts on the annotation kvcal.dev/<command>."""
        return self.names(COMMAND_FLAGS[command])

    def observes(self, phase: str) -> frozenset[Observed]:
        """What the reconciler reads; nothing for a phase it does not know (decide() then says so)."""
        descriptor = self.phases.get(phase)
        return descriptor.observes if descriptor is not None else frozenset()

    def poll_seconds(self, phase: str) -> float | None:
        return self.phases[phase].poll_seconds

    def is_allowed(self, source: str, target: str) -> bool:
        return source == target or target in self.phases[source].next

    def check_transition(self, source: str, target: str) -> None:
        if not self.is_allowed(source, target):
            allowed = ", ".join(sorted(self.phases[source].next)) or "none"
            raise IllegalTransition(f"illegal phase transition {source} -> {target} (allowed from {source}: {allowed})")

    def with_phases(self, *descriptors: PhaseDescriptor) -> "Lifecycle":
        """A copy with `descriptors` added or replaced (a new phase, or a phase that may now move to it)."""
        return Lifecycle({**self.phases, **{descriptor.phase: descriptor for descriptor in descriptors}})

    def edited(self, phase: str, **changes: object) -> PhaseDescriptor:
        return replace(self.phases[phase], **changes)  # type: ignore[arg-type]


def _terminal(draft: Builder, spec: KVCalibrationSpec, current_hash: str) -> None:
    draft.wait(draft.status.message or "", None)


def _declare(*descriptors: PhaseDescriptor) -> Lifecycle:
    return Lifecycle({descriptor.phase: descriptor for descriptor in descriptors})


def _to(*phases: Phase) -> frozenset[str]:
    return frozenset(phases)


def _reads(*fields: Observed) -> frozenset[Observed]:
    return frozenset(fields)


# Leaving the work: a spec change or `kvcal recalibrate` starts over, an invalid spec stops, an abort rolls back.
_RESTARTS = (Phase.PENDING, Phase.INVALID_SPEC)
_ABORTS = (Phase.ROLLING_BACK, *_RESTARTS)

P = Phase
LIFECYCLE = _declare(
    # --- the artifact machine: a calibrated, verified checkpoint (core.artifact) ---
    PhaseDescriptor(
        P.PENDING, "artifact", artifact.pending,
        # the baseline: never calibrate into what it serves
        _reads("calibration_job", "baseline"), 1.0, _to(P.CALIBRATING, P.INVALID_SPEC),
        stuck_alert=True,
    ),
    PhaseDescriptor(
        P.CALIBRATING, "artifact", artifact.calibrating,
        # a vanished Job is re-created: same guard. Job events wake the operator, so it polls slowly.
        _reads("calibration_job", "baseline"), 60.0, _to(P.VERIFYING, P.FAILED, *_ABORTS),
        active=True, abortable=True, stuck_alert=True,
    ),
    PhaseDescriptor(
        P.VERIFYING, "artifact", artifact.verifying,
        _reads("verification_job", "baseline"), 30.0, _to(P.DEPLOYING, P.FAILED, *_ABORTS),
        active=True, abortable=True, stuck_alert=True,
    ),
    # --- the rollout machine: the verified checkpoint as a canary, then promoted (core.rollout) ---
    PhaseDescriptor(
        # Deploying -> Analyzing when the canary of the current step is ready.
        P.DEPLOYING, "rollout", rollout.deploying,
        # gateway_features: can the Gateway mirror (the shadow stage), asked before the canary exists
        _reads(
            "canary", "canary_pods", "baseline", "baseline_service", "baseline_autoscaler", "routed_weight",
            "gateway_features", "inference_pool",
        ), 15.0,
        _to(P.ANALYZING, P.FAILED, *_ABORTS),
        active=True, abortable=True, serving=True, stuck_alert=True,
    ),
    PhaseDescriptor(
        # Analyzing -> Deploying when a traffic step passed and the next step needs more canary replicas.
        P.ANALYZING, "rollout", rollout.analyzing,
        _reads("canary", "baseline", "baseline_service", "routed_weight", "inference_pool"), 5.0,
        _to(P.DEPLOYING, P.PROMOTING, P.AWAITING_PROMOTION, *_ABORTS),
        active=True, abortable=True, serving=True, stuck_alert=True, notifies="AnalysisStarted",
    ),
    PhaseDescriptor(
        P.AWAITING_PROMOTION, "rollout", rollout.awaiting_promotion,
        _reads("canary", "baseline", "routed_weight", "inference_pool"), 300.0, _to(P.PROMOTING, *_ABORTS),
        active=True, abortable=True, serving=True, promotable=True,
        # waiting for a person is not stuck
        health="Suspended", notifies="AwaitingPromotion",
    ),
    PhaseDescriptor(
        # Once the baseline starts rolling there is no way back: promotion finishes (or fails), it never rolls back.
        # The baseline's watch events wake the operator too; the poll is the floor while it rolls out.
        P.PROMOTING, "rollout", rollout.promoting,
        _reads("canary", "baseline", "baseline_pods", "routed_weight", "inference_pool"), 5.0,
        _to(P.SUCCEEDED, P.FAILED),
        stuck_alert=True,
    ),
    PhaseDescriptor(
        # Reached from any active phase of either machine: it stops running Jobs and drains the canary.
        P.ROLLING_BACK, "rollout", rollout.rolling_back,
        _reads("canary", "calibration_job", "verification_job", "routed_weight", "inference_pool"), 2.0,
        _to(P.ROLLED_BACK),
        warning=True, stuck_alert=True,
    ),
    # Terminal phases never restart by themselves (a spec change only sets SpecCurrent=False): `kvcal recalibrate`
    # starts over; `kvcal retry` re-runs the analysis (RolledBack) or the whole pipeline (Failed).
    PhaseDescriptor(
        # Watches the promotion: reverts, and a new vLLM image or backend re-verifies (core.rollout.watch).
        P.SUCCEEDED, "rollout", watch_promoted, _reads("baseline"), None, _to(P.PENDING),
        terminal=True, ready=True, health="Healthy", notifies="Promoted",
    ),
    PhaseDescriptor(
        P.ROLLED_BACK, "rollout", _terminal, _reads(), None, _to(P.DEPLOYING, P.PENDING),
        terminal=True, retryable=True, warning=True, health="Degraded", notifies="RolledBack",
    ),
    PhaseDescriptor(
        P.FAILED, "shared", _terminal, _reads(), None, _to(P.PENDING, P.DEPLOYING),
        terminal=True, retryable=True, warning=True, health="Degraded", notifies="Failed",
    ),
    # --- the spec itself: nothing runs until it is valid again ---
    PhaseDescriptor(
        P.INVALID_SPEC, "shared", _terminal, _reads(), None, _to(P.PENDING), warning=True, health="Degraded",
    ),
)  # fmt: skip
