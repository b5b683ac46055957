"""The webhook sender: posts what core.notifications says is due, off the reconcile path.

A reconcile pass never waits on a receiver: it hands the deliveries its written status calls for to `submit` and
moves on. One thread per target posts them (a slow or dead receiver delays only its own), retrying a failure after
first_delay, twice that, ... up to max_delay, at most max_attempts times; then it gives up until the operator restarts
(status.notifications.lastError says so). Each 2xx, and each new error, wakes the object's reconcile (`listen`): that
pass copies the confirmed ids and the error into the status it writes (`record`), the one status write per pass the
core computes. Why not the core? It stays pure and knows no sender; the deliveries are bookkeeping of the reconciler's
own side effects, like the Events it sends from status.history.
"""

import heapq
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from kvcal.core.manifests.common import Owner
from kvcal.core.notifications import Delivery, WebhookTarget, due, payload, recorded
from kvcal.models.status import KVCalibrationStatus
from kvcal.ports import WebhookPoster

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 8  # with the delays below: about four minutes of retries
FIRST_DELAY_SECONDS = 1.0
MAX_DELAY_SECONDS = 60.0
USER_AGENT = "kvcal-operator"
Listener = Callable[[str, str], None]  # (namespace, name) of an object whose deliveries changed


class Undeliverable(Exception):
    """A delivery failed; the message is fixed text (no URL, no token, no answer body: they can hold secrets)."""


@dataclass
class _Deliveries:
    """One object's deliveries in this process, each id in at most one set."""

    queued: set[str] = field(default_factory=set)  # waiting for an attempt, or in one
    delivered: set[str] = field(default_factory=set)  # confirmed, not yet in status
    abandoned: set[str] = field(default_factory=set)  # max_attempts failed: not tried again in this process
    errors: dict[str, str] = field(default_factory=dict)  # target -> its latest failure, until it accepts one


@dataclass(order=True)
class _Attempt:
    at: float
    order: int
    delivery: Delivery = field(compare=False)
    number: int = field(compare=False, default=1)


def backoff(attempt: int, first_delay: float, max_delay: float) -> float:
    """Seconds before attempt `attempt + 1`: exponential, bounded."""
    return min(max_delay, first_delay * 2.0 ** (attempt - 1))


def read_secret_file(path: str) -> str:
    return Path(path).read_text().strip()


class Notifier:
    def __init__(
        self,
        targets: Sequence[WebhookTarget],
        poster: WebhookPoster,
        max_attempts: int = MAX_ATTEMPTS,
        first_delay: float = FIRST_DELAY_SECONDS,
        max_delay: float = MAX_DELAY_SECONDS,
        read_file: Callable[[str], str] = read_secret_file,
        monotonic: Callable[[], float] = time.monotonic,  # when attempts are due; `submit` reads it inside a pass
    ) -> None:
        self.targets = tuple(targets)
        self.poster = poster
        self.max_attempts = max_attempts
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.read_file = read_file
        self.monotonic = monotonic
        self._lock = threading.Condition()
        self._objects: dict[str, _Deliveries] = {}  # object uid ->
        self._queues: dict[str, list[_Attempt]] = {target.name: [] for target in self.targets}
        self._order = itertools.count()
        self._listener: Listener | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = False

    # --- the reconciler's side

    def record(self, owner: Owner, status: KVCalibrationStatus) -> KVCalibrationStatus:
        """`status` with the deliveries this process confirmed and its latest errors (status.notifications)."""
        with self._lock:
            state = self._objects.get(owner.uid, _Deliveries())
            confirmed, errors = set(state.delivered), dict(state.errors)
        error = "; ".join(errors[target] for target in sorted(errors)) or None
        notifications = recorded(owner, status, self.targets, confirmed, error)
        return status.model_copy(update={"notifications": notifications})

    def submit(self, owner: Owner, status: KVCalibrationStatus, now: datetime) -> None:
        """Post what the written `status` calls for and this process has not posted; forget what it no longer calls
        for (recorded in status, or out of its history)."""
        deliveries = due(owner, status, self.targets, now)
        ids = {delivery.id for delivery in deliveries}
        with self._lock:
            state = self._objects.setdefault(owner.uid, _Deliveries())
            state.queued &= ids  # a queued attempt whose id left is dropped when it comes up
            state.delivered &= ids
            state.abandoned &= ids
            for delivery in deliveries:
                if delivery.id not in state.queued | state.delivered | state.abandoned:
                    state.queued.add(delivery.id)
                    self._push(_Attempt(self.monotonic(), next(self._order), delivery))
            if not (ids or state.errors):
                del self._objects[owner.uid]

    def forget(self, uid: str) -> None:
        """The object is being deleted: nothing more to post about it."""
        with self._lock:
            self._objects.pop(uid, None)

    def listen(self, listener: Listener | None) -> None:
        self._listener = listener

    # --- the senders

    def start(self) -> "Notifier":
        for target in self.targets:
            thread = threading.Thread(target=self._send, args=(target,), name=f"notify-{target.name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    def _push(self, attempt: _Attempt) -> None:
        heapq.heappush(self._queues[attempt.delivery.target], attempt)
        self._lock.notify_all()

    def _next(self, target: str) -> _Attempt | None:
        """The next attempt due for `target`, waiting for it; None when stopping."""
        queue = self._queues[target]
        with self._lock:
            while not self._stopping:
                wait = queue[0].at - self.monotonic() if queue else None
                if wait is not None and wait <= 0:
                    attempt = heapq.heappop(queue)
                    state = self._objects.get(attempt.delivery.owner.uid)
                    if state is not None and attempt.delivery.id in state.queued:
                        return attempt
                    continue  # no longer due
                self._lock.wait(wait)
        return None

    def _send(self, target: WebhookTarget) -> None:
        while (attempt := self._next(target.name)) is not None:
            delivery = attempt.delivery
            try:
                self._post(target, delivery)
                error = None
            except Undeliverable as e:
                error = str(e)
            with self._lock:
                state = self._objects.get(delivery.owner.uid)
                if state is None or delivery.id not in state.queued:
                    continue
                before = state.errors.get(target.name)
                if error is None:
                    state.queued.discard(delivery.id)
                    state.delivered.add(delivery.id)
                    state.errors.pop(target.name, None)
                elif attempt.number >= self.max_attempts:
                    state.queued.discard(delivery.id)
                    state.abandoned.add(delivery.id)
                    error += f"; gave up after {attempt.number} attempts (a restart of the operator tries again)"
                    state.errors[target.name] = error
                else:
                    state.errors[target.name] = error + "; retrying with backoff"
                    delay = backoff(attempt.number, self.first_delay, self.max_delay)
                    self._push(_Attempt(self.monotonic() + delay, next(self._order), delivery, attempt.number + 1))
                changed = error is None or state.errors.get(target.name) != before
            if changed:
                self._tell(delivery.owner)

    def _tell(self, owner: Owner) -> None:
        listener = self._listener
        if listener is None:
            return
        try:
            listener(owner.namespace, owner.name)
        except Exception:  # the operator's loop may be gone (shutting down): the next pass records it anyway
            log.debug("could not wake %s/%s", owner.namespace, owner.name, exc_info=True)

    def _post(self, target: WebhookTarget, delivery: Delivery) -> None:
        """One POST; raises Undeliverable. Logs name the target and the key, never the URL (a Slack webhook URL is
        itself the credential), the token or the answer."""
        where = f"webhook {target.name}"
        url = self._read(target, target.url_file, "URL")
        if not url.startswith(("https://", "http://")):
            raise Undeliverable(f"{where}: its URL is not http(s) (see the chart value notifications.webhooks)")
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": delivery.transition.key,
            "User-Agent": USER_AGENT,
        }
        if target.token_file:
            headers["Authorization"] = f"Bearer {self._read(target, target.token_file, 'token')}"
        body = json.dumps(payload(target.format, delivery.owner, delivery.transition)).encode()
        try:
            code = self.poster.post(url, body, headers)
        except Exception as e:
            log.warning("%s: %s for %s", where, type(e).__name__, delivery.transition.key)
            raise Undeliverable(f"{where}: no answer ({type(e).__name__})") from None
        if not 200 <= code < 300:
            log.warning("%s answered HTTP %d for %s", where, code, delivery.transition.key)
            raise Undeliverable(f"{where}: HTTP {code}")
        log.info("%s: delivered %s %s", where, delivery.transition.event, delivery.transition.key)

    def _read(self, target: WebhookTarget, path: str, what: str) -> str:
        try:
            return self.read_file(path)
        except OSError as e:
            log.warning("webhook %s: cannot read its %s file %s: %s", target.name, what, path, type(e).__name__)
            raise Undeliverable(f"webhook {target.name}: its {what} cannot be read (see the operator's log)") from None
