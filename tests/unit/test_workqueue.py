"""handlers.workqueue: one pass per key at a time, watch events ahead of timed passes, timed passes paced."""

import asyncio
import threading
import time

from kvcal.handlers.workqueue import RESYNC_PER_SECOND, WorkQueue


async def until(condition: object, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.005)  # polls the test's condition on the loop


def test_a_wake_during_a_pass_runs_it_once_more_never_twice_at_a_time() -> None:
    started, release = threading.Event(), threading.Event()
    passes: list[str] = []
    running = [0, 0]  # now, most at once

    def reconcile(namespace: str, name: str) -> float | None:
        running[0] += 1
        running[1] = max(running)
        passes.append(name)
        started.set()
        release.wait(5)
        running[0] -= 1
        return None

    async def main() -> None:
        queue = WorkQueue(reconcile)
        task = asyncio.ensure_future(queue.run())
        queue.wake("ns", "a")
        await asyncio.to_thread(started.wait, 5)
        for _ in range(3):
            queue.wake("ns", "a")  # three events during the pass: one more pass, after it
        release.set()
        await until(lambda: len(passes) == 2)
        await asyncio.sleep(0.2)  # room for a wrong third pass
        task.cancel()

    asyncio.run(main())
    assert passes == ["a", "a"]
    assert running[1] == 1


def test_a_watch_event_runs_before_a_backlog_of_timed_passes() -> None:
    order: list[str] = []

    async def main() -> None:
        queue = WorkQueue(lambda ns, name: order.append(name) or 30.0)
        for i in range(50):
            queue._schedule(("ns", f"poll-{i}"), 0.01)
        await asyncio.sleep(0.05)  # all 50 are due
        task = asyncio.ensure_future(queue.run(workers=1))
        await asyncio.sleep(0.1)
        queue.wake("ns", "new")
        await until(lambda: "new" in order)
        task.cancel()

    asyncio.run(main())
    assert order.index("new") <= 4, order  # 0.1 s at 25 timed passes/s, then the event at once


def test_a_new_objects_first_pass_runs_before_a_backlog_of_echoed_watch_events() -> None:
    """After a burst of applies every object's status write echoes back as an event; the next apply's first pass (the
    one that creates its Job) must not wait behind them."""
    order: list[str] = []

    async def main() -> None:
        queue = WorkQueue(lambda ns, name: order.append(name) or None)
        task = asyncio.ensure_future(queue.run(workers=1))
        for i in range(50):
            queue.wake("ns", f"old-{i}")
        await until(lambda: len(order) == 50)  # each has had its first pass
        for i in range(50):
            queue.wake("ns", f"old-{i}")  # the echoes of their status writes
        queue.wake("ns", "new")
        await until(lambda: len(order) == 101)
        queue.forget("ns", "old-0")  # deleted: a re-created object of that name is new again
        queue.wake("ns", "old-1")
        queue.wake("ns", "old-0")
        await until(lambda: len(order) == 103)
        task.cancel()

    asyncio.run(main())
    assert order.index("new") <= 51, order[50:]  # at most the echo already picked when it arrived
    assert order[-2:] == ["old-0", "old-1"]


def test_timed_passes_are_paced_shortest_requested_delay_first() -> None:
    started: list[tuple[str, float]] = []

    async def main() -> None:
        queue = WorkQueue(lambda ns, name: started.append((name, time.monotonic())) or None)
        for i in range(5):
            queue._schedule(("ns", f"safety-net-{i}"), 0.05)  # e.g. Calibrating's 60 s poll: due first
        await asyncio.sleep(0.04)
        for i in range(5):
            queue._schedule(("ns", f"analysis-{i}"), 0.02)  # e.g. Analyzing's 5 s poll: due 10 ms later
        await asyncio.sleep(0.1)  # all due
        task = asyncio.ensure_future(queue.run())
        await until(lambda: len(started) == 10)
        task.cancel()

    asyncio.run(main())
    names = [name for name, _ in started]
    assert names[:5] == [f"analysis-{i}" for i in range(5)], names
    span = started[-1][1] - started[0][1]
    assert span >= 9 / RESYNC_PER_SECOND * 0.9, span
