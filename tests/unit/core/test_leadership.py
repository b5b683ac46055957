"""core.leadership: who may act, from the lease as read and how long it has been unchanged (by the reader's clock)."""

from datetime import UTC, datetime, timedelta

from kvcal.core.leadership import LeaseAction, LeaseView, decide_lease

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def view(holder: str, unchanged_for: float = 0.0) -> LeaseView:
    return LeaseView(holder, 15.0, "7", T0 - timedelta(seconds=unchanged_for))


def test_no_lease_is_created() -> None:
    assert decide_lease(None, "a", T0) is LeaseAction.CREATE


def test_own_lease_is_renewed_even_when_stale() -> None:
    assert decide_lease(view("a", unchanged_for=60), "a", T0) is LeaseAction.RENEW


def test_a_live_holder_is_waited_for() -> None:
    assert decide_lease(view("b", unchanged_for=14.9), "a", T0) is LeaseAction.WAIT


def test_a_holder_silent_for_the_lease_duration_is_replaced() -> None:
    assert decide_lease(view("b", unchanged_for=15), "a", T0) is LeaseAction.TAKE_OVER


def test_a_released_lease_is_taken_at_once() -> None:
    assert decide_lease(view("", unchanged_for=0), "a", T0) is LeaseAction.TAKE_OVER
