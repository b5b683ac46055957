"""handlers.workqueue: one pass per key at a time, watch events ahead of timed passes, timed passes paced.

The timed passes run on a clock the tests move (FakeClock): on 2 shared cores the wall clock runs on while the loop
waits for a thread, so a count of passes in a wall-clock interval would depend on the machine's load."""

import asyncio
import threading
from collections.abc import Callable

from kvcal.handlers.workqueue import RESYNC_PER_SECOND, WorkQueue


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)  # polls the test's condition on the loop


class FakeClock:
    """The queue's clock (seconds), moved only by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def advance_until(self, condition: Callable[[], bool], step: float, timeout: float = 10.0) -> None:
        """Move the clock by `step` at a time, letting the queue act after each step, until `condition` holds."""
        async with asyncio.timeout(timeout):
            while not condition():
                self.now += step
                await asyncio.sleep(0.005)


def idle(queue: WorkQueue) -> bool:
    """No pass running, none queued, none owed to a wake-up: only timed passes (far off here) may follow."""
    return not (queue._active or queue._queued or queue._dirty)


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
        await until(lambda: len(passes) == 2 and idle(queue))  # a wrong third pass would be queued by now
        task.cancel()

    asyncio.run(main())
    assert passes == ["a", "a"]
    assert running[1] == 1


def test_a_watch_event_runs_before_a_backlog_of_timed_passes() -> None:
    order: list[str] = []

    clock = FakeClock()

    async def main() -> None:
        queue = WorkQueue(lambda ns, name: order.append(name) or 30.0, clock=clock)
        for i in range(50):
            queue._schedule(("ns", f"poll-{i}"), 0.01)
        clock.now += 0.05  # all 50 are due
        task = asyncio.ensure_future(queue.run(workers=1))
        await until(lambda: len(order) == 1)
        await clock.advance_until(lambda: len(order) >= 3, 1.0 / RESYNC_PER_SECOND)  # 0.1 s at 25 timed passes/s
        queue.wake("ns", "new")
        await clock.advance_until(lambda: "new" in order, 1.0 / RESYNC_PER_SECOND)  # timed passes may go on
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
    clock = FakeClock()

    async def main() -> None:
        queue = WorkQueue(lambda ns, name: started.append((name, clock())) or None, clock=clock)
        for i in range(5):
            queue._schedule(("ns", f"safety-net-{i}"), 0.05)  # e.g. Calibrating's 60 s poll: due first
        clock.now += 0.04
        for i in range(5):
            queue._schedule(("ns", f"analysis-{i}"), 0.02)  # e.g. Analyzing's 5 s poll: due 10 ms later
        clock.now += 0.1  # all due
        task = asyncio.ensure_future(queue.run())
        await clock.advance_until(lambda: len(started) == 10, 0.01)
        task.cancel()

    asyncio.run(main())
    names = [name for name, _ in started]
    assert names[:5] == [f"analysis-{i}" for i in range(5)], names
    span = started[-1][1] - started[0][1]
    assert span >= 9 / RESYNC_PER_SECOND * 0.9, span


def test_waiting_spawns_no_task_so_a_stopping_operator_has_none_to_wait_for() -> None:
    """kopf, stopping, gives every task born after it started 5 s before cancelling it: the queue's timer and
    workers are born before kopf starts (handlers.operator), and their waits must not spawn tasks of their own."""

    async def main() -> set[asyncio.Task[object]]:
        done: list[str] = []
        queue = WorkQueue(lambda ns, name: done.append(name) or 0.01)  # each pass asks for another soon
        runner = asyncio.ensure_future(queue.run())
        await asyncio.sleep(0)  # the queue spawns its timer and workers
        born_first = asyncio.all_tasks()
        queue.wake("ns", "a")
        await until(lambda: len(done) >= 5)  # woken, then timed passes: every kind of wait has been waited
        later = asyncio.all_tasks() - born_first
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        return later

    assert asyncio.run(main()) == set()
