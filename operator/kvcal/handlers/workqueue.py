"""The reconcile work queue: a few workers for every KVCalibration instead of one kopf daemon each.

One daemon per object cost ~80 KiB and an asyncio task per object, and every daemon's timer fired on its own: at
5,000 objects the periodic passes crowded out the first pass of a new one. Here (as in controller-runtime):

- a key is queued at most once, and never runs twice at a time; a wake-up during its pass runs it again right after;
- watch events (a new object, its Job, its canary) go to the urgent lane, which workers always drain first; an
  object's first pass in this process goes ahead even of that lane: after a burst of applies, each object's status
  write echoes back as a watch event and queues a second pass, and a new object's Job must not wait behind 5,000 of
  them (benchmarks/bench_operator.py: the first apply after 5,000 waited 18 s);
- timed passes (the requeue delay a pass returns) wait in one heap, then run in the resync lane, at most
  RESYNC_CONCURRENCY at a time and shortest requested delay first (an Analyzing object's 5 s poll before a
  Calibrating one's 60 s safety net) and at most RESYNC_PER_SECOND, so a backlog of polls delays the slowest
  polls, never an event, and 5,000 idle objects cost a bounded share of the CPU.

Everything here runs on the event loop (no locks); the passes themselves run in threads.
"""

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kvcal.services.failures import describe_failure

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, name)
WORKERS = 4  # passes in flight at once (threads: each pass waits on the API server most of its time)
RESYNC_CONCURRENCY = 2  # of which timed passes; the others stay free for watch events
RESYNC_PER_SECOND = 25.0  # timed passes started per second at most: polls are safety nets (events wake a pass)
RESYNC_SECONDS = 600.0  # a pass at least this often even when nothing changes
MAX_ERROR_BACKOFF = 60.0


@dataclass
class WorkQueue:
    reconcile: Callable[[str, str], float | None]  # one pass (in a thread); returns the requeue delay
    clock: Callable[[], float] = field(default=lambda: asyncio.get_running_loop().time())
    _first: deque[Key] = field(default_factory=deque)  # keys this process has not passed yet
    _urgent: deque[Key] = field(default_factory=deque)
    _passed: set[Key] = field(default_factory=set)
    _resync: list[tuple[float, int, Key]] = field(default_factory=list)  # (requested delay, order, key)
    _queued: set[Key] = field(default_factory=set)
    _active: set[Key] = field(default_factory=set)
    _dirty: set[Key] = field(default_factory=set)
    _timers: list[tuple[float, int, Key]] = field(default_factory=list)
    _due: dict[Key, tuple[float, float]] = field(default_factory=dict)  # key -> (due, requested delay)
    _errors: dict[Key, int] = field(default_factory=dict)
    _resyncing: int = 0
    _next_resync_at: float = 0.0
    _sequence: "itertools.count[int]" = field(default_factory=itertools.count)
    _work: asyncio.Event = field(default_factory=asyncio.Event)
    _timers_changed: asyncio.Event = field(default_factory=asyncio.Event)

    def wake(self, namespace: str | None, name: str | None) -> None:
        """Run a pass of this object soon (a watch event about it or one of its children)."""
        if not name:
            return
        key = (namespace or "", name)
        self._due.pop(key, None)  # the pass reschedules it
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            (self._urgent if key in self._passed else self._first).append(key)
            self._work.set()

    def forget(self, namespace: str | None, name: str | None) -> None:
        """The object is gone: no more timed passes (a queued one finds it gone and does nothing)."""
        key = (namespace or "", name or "")
        self._due.pop(key, None)
        self._errors.pop(key, None)
        self._passed.discard(key)

    async def run(self, workers: int = WORKERS) -> None:
        """Until cancelled; cancelling waits for no pass in flight (its thread finishes on its own)."""
        tasks = [asyncio.ensure_future(self._timer())]
        tasks += [asyncio.ensure_future(self._worker()) for _ in range(workers)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    def _schedule(self, key: Key, delay: float) -> None:
        if delay <= 0:
            self.wake(*key)  # a new phase to act on at once
            return
        due = self.clock() + delay
        self._due[key] = (due, delay)
        heapq.heappush(self._timers, (due, next(self._sequence), key))
        self._timers_changed.set()

    async def _timer(self) -> None:
        while True:
            now = self.clock()
            while self._timers and self._timers[0][0] <= now:
                due, order, key = heapq.heappop(self._timers)
                scheduled = self._due.get(key)
                if scheduled is None or scheduled[0] != due:
                    continue  # superseded by a wake-up or a later schedule
                del self._due[key]
                if key not in self._queued and key not in self._active:
                    self._queued.add(key)
                    heapq.heappush(self._resync, (scheduled[1], order, key))
                    self._work.set()
            self._timers_changed.clear()
            wait = self._timers[0][0] - now if self._timers else None
            await _wait(self._timers_changed, wait)  # until the timers change, or the next one is due

    def _next(self) -> tuple[Key, bool] | float | None:
        """The next key (and whether it is a timed pass), else how long until a timed one may start, else None."""
        for lane in (self._first, self._urgent):
            if lane:
                return lane.popleft(), False
        if not self._resync or self._resyncing >= RESYNC_CONCURRENCY:
            return None
        now = self.clock()
        if now < self._next_resync_at:
            return self._next_resync_at - now
        self._next_resync_at = max(now, self._next_resync_at) + 1.0 / RESYNC_PER_SECOND
        return heapq.heappop(self._resync)[2], True

    async def _worker(self) -> None:
        while True:
            picked = self._next()
            if picked is None or isinstance(picked, float):
                self._work.clear()
                await _wait(self._work, picked)  # until there is work, or a timed pass may start
                continue
            key, resync = picked
            self._queued.discard(key)
            self._active.add(key)
            self._resyncing += resync
            try:
                await self._pass(key)
            finally:
                self._passed.add(key)
                self._active.discard(key)
                self._resyncing -= resync
                self._work.set()  # a resync slot may have freed up
            if key in self._dirty:
                self._dirty.discard(key)
                self.wake(*key)

    async def _pass(self, key: Key) -> None:
        namespace, name = key
        try:
            requeue = await asyncio.to_thread(self.reconcile, namespace, name)
            self._errors.pop(key, None)
        except Exception as e:
            errors = self._errors[key] = self._errors.get(key, 0) + 1
            requeue = min(MAX_ERROR_BACKOFF, 2.0**errors)
            # Redacted (no credentials in logs); the traceback, which may quote them, only at debug level.
            reason, message = describe_failure(e)
            log.error(
                "reconcile of %s/%s failed (%s): %s; retrying in %.0fs", namespace, name, reason, message, requeue
            )
            log.debug("reconcile of %s/%s failed", namespace, name, exc_info=True)
        if key not in self._dirty:
            self._schedule(key, RESYNC_SECONDS if requeue is None else requeue)


async def _wait(event: asyncio.Event, seconds: float | None) -> None:
    """Wait for `event`, at most `seconds`. asyncio.timeout, not wait_for: on Python 3.11 wait_for wraps the wait in
    a new task each time, and kopf, stopping, gives every task born after its start 5 s before cancelling it: each
    operator stop (a rollout, a restart) then took 5 s longer."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
