"""The KVCalibration lifecycle as a table of allowed phase transitions.

decide() may only move a KVCalibration along an edge of ALLOWED; `check_transition` is the guard it calls, so an
illegal move is a bug that surfaces as an exception in unit tests instead of a silently corrupted status.
"""

from kvcal.models.status import Phase

# Phases in which the user can still abort (a rollback is meaningful) and in which a spec change restarts the work.
ACTIVE = frozenset({Phase.CALIBRATING, Phase.VERIFYING, Phase.DEPLOYING, Phase.ANALYZING, Phase.AWAITING_PROMOTION})
# Phases in which `kvcal retry` re-runs the analysis or the pipeline.
RETRYABLE = frozenset({Phase.ROLLED_BACK, Phase.FAILED})

ALLOWED: dict[Phase, frozenset[Phase]] = {
    Phase.PENDING: frozenset({Phase.CALIBRATING, Phase.INVALID_SPEC}),
    Phase.CALIBRATING: frozenset(
        {Phase.VERIFYING, Phase.FAILED, Phase.ROLLING_BACK, Phase.PENDING, Phase.INVALID_SPEC}
    ),
    Phase.VERIFYING: frozenset({Phase.DEPLOYING, Phase.FAILED, Phase.ROLLING_BACK, Phase.PENDING, Phase.INVALID_SPEC}),
    # Deploying -> Analyzing when the canary of the current step is ready.
    Phase.DEPLOYING: frozenset({Phase.ANALYZING, Phase.FAILED, Phase.ROLLING_BACK, Phase.PENDING, Phase.INVALID_SPEC}),
    # Analyzing -> Deploying when a traffic step passed and the next step needs more canary replicas.
    Phase.ANALYZING: frozenset(
        {
            Phase.DEPLOYING,
            Phase.PROMOTING,
            Phase.AWAITING_PROMOTION,
            Phase.ROLLING_BACK,
            Phase.PENDING,
            Phase.INVALID_SPEC,
        }
    ),
    Phase.AWAITING_PROMOTION: frozenset({Phase.PROMOTING, Phase.ROLLING_BACK, Phase.PENDING, Phase.INVALID_SPEC}),
    # Once the baseline starts rolling there is no way back: promotion finishes (or fails), it never rolls back.
    Phase.PROMOTING: frozenset({Phase.SUCCEEDED, Phase.FAILED}),
    Phase.ROLLING_BACK: frozenset({Phase.ROLLED_BACK}),
    # Terminal phases never restart by themselves (a spec change only sets SpecCurrent=False): `kvcal recalibrate`
    # starts over; `kvcal retry` re-runs the analysis (RolledBack) or the whole pipeline (Failed).
    Phase.SUCCEEDED: frozenset({Phase.PENDING}),
    Phase.ROLLED_BACK: frozenset({Phase.DEPLOYING, Phase.PENDING}),
    Phase.FAILED: frozenset({Phase.PENDING, Phase.DEPLOYING}),
    Phase.INVALID_SPEC: frozenset({Phase.PENDING}),
}


class IllegalTransition(ValueError):
    """decide() tried to move along an edge that is not in ALLOWED."""


def is_allowed(src: Phase, dst: Phase) -> bool:
    return src == dst or dst in ALLOWED[src]


def check_transition(src: Phase, dst: Phase) -> None:
    if not is_allowed(src, dst):
        allowed = ", ".join(sorted(ALLOWED[src])) or "none"
        raise IllegalTransition(f"illegal phase transition {src} -> {dst} (allowed from {src}: {allowed})")
