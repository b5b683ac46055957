"""The KVCalibration lifecycle as a table of allowed phase transitions.

decide() may only move a KVCalibration along an edge of ALLOWED; `check_transition` is the guard it calls, so an
illegal move is a bug that surfaces as an exception in unit tests instead of a silently corrupted status.
"""

from kvcal.models.status import Phase

P = Phase

# Phases in which the user can still abort (a rollback is meaningful) and in which a spec change restarts the work.
ACTIVE = frozenset({P.CALIBRATING, P.VERIFYING, P.DEPLOYING, P.ANALYZING, P.AWAITING_PROMOTION})
# Phases in which `kvcal retry` re-runs the analysis or the pipeline.
RETRYABLE = frozenset({P.ROLLED_BACK, P.FAILED})

ALLOWED: dict[Phase, frozenset[Phase]] = {
    P.PENDING: frozenset({P.CALIBRATING, P.INVALID_SPEC}),
    P.CALIBRATING: frozenset({P.VERIFYING, P.FAILED, P.ROLLING_BACK, P.PENDING, P.INVALID_SPEC}),
    P.VERIFYING: frozenset({P.DEPLOYING, P.FAILED, P.ROLLING_BACK, P.PENDING, P.INVALID_SPEC}),
    # Deploying -> Analyzing when the canary of the current step is ready.
    P.DEPLOYING: frozenset({P.ANALYZING, P.FAILED, P.ROLLING_BACK, P.PENDING, P.INVALID_SPEC}),
    # Analyzing -> Deploying when a traffic step passed and the next step needs more canary replicas.
    P.ANALYZING: frozenset({P.DEPLOYING, P.PROMOTING, P.AWAITING_PROMOTION, P.ROLLING_BACK, P.PENDING, P.INVALID_SPEC}),
    P.AWAITING_PROMOTION: frozenset({P.PROMOTING, P.ROLLING_BACK, P.PENDING, P.INVALID_SPEC}),
    # Once the baseline starts rolling there is no way back: promotion finishes (or fails), it never rolls back.
    P.PROMOTING: frozenset({P.SUCCEEDED, P.FAILED}),
    P.ROLLING_BACK: frozenset({P.ROLLED_BACK}),
    # Terminal phases never restart by themselves (a spec change only sets SpecCurrent=False): `kvcal recalibrate`
    # starts over; `kvcal retry` re-runs the analysis (RolledBack) or the whole pipeline (Failed).
    P.SUCCEEDED: frozenset({P.PENDING}),
    P.ROLLED_BACK: frozenset({P.DEPLOYING, P.PENDING}),
    P.FAILED: frozenset({P.PENDING, P.DEPLOYING}),
    P.INVALID_SPEC: frozenset({P.PENDING}),
}


class IllegalTransition(ValueError):
    """decide() tried to move along an edge that is not in ALLOWED."""


def is_allowed(src: Phase, dst: Phase) -> bool:
    return src == dst or dst in ALLOWED[src]


def check_transition(src: Phase, dst: Phase) -> None:
    if not is_allowed(src, dst):
        allowed = ", ".join(sorted(ALLOWED[src])) or "none"
        raise IllegalTransition(f"illegal phase transition {src} -> {dst} (allowed from {src}: {allowed})")
