"""metav1.Condition helpers. lastTransitionTime changes only when a condition's status changes (as in Kubernetes),
so a reconcile that changes nothing produces an identical status and no write."""

from datetime import datetime
from typing import get_args

from kvcal.core.timestamps import rfc3339
from kvcal.models.status import Condition, ConditionType

# The order of a status's conditions: ConditionType's. The first six are always there; the last four are set only
# when they apply (after a promotion, on a spec change in a terminal phase, after a failed pass).
CONDITION_ORDER: tuple[ConditionType, ...] = get_args(ConditionType)
CONDITION_TYPES, OPTIONAL_CONDITION_TYPES = CONDITION_ORDER[:6], CONDITION_ORDER[6:]


def get_condition(conditions: list[Condition], type_: ConditionType) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def set_condition(
    conditions: list[Condition],
    type_: ConditionType,
    status: str,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> list[Condition]:
    """A new list with `type_` set; order follows CONDITION_ORDER so the written status is stable."""
    old = get_condition(conditions, type_)
    changed = old is None or old.status != status
    new = Condition.model_validate(
        {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message[:1024],
            "lastTransitionTime": rfc3339(now) if changed or old is None else old.last_transition_time,
            "observedGeneration": generation,
        }
    )
    others = {c.type: c for c in conditions if c.type != type_}
    others[type_] = new
    return [others[t] for t in CONDITION_ORDER if t in others]
