"""A load generator for real vLLM servers: `concurrency` clients sending short completions, round-robin over the
ready endpoints of a Service (what kube-proxy would spread), so traffic splits between baseline and canary pods by
replica count, as the ``replicas`` router intends.

`endpoints()` is re-read once a second (kube-proxy's endpoint sync); each address's model id comes from its own
/v1/models. Counts of answered and failed requests per address are kept for the test's assertions. `pause()` and
`resume()` stop and restart the traffic without ending the clients (e.g. while a new vLLM loads on the same cores);
`limit(clients)` lets only that many of them send.
"""

import itertools
import logging
import threading
from collections import Counter
from collections.abc import Callable

import httpx

log = logging.getLogger(__name__)

PROMPTS = (
    "Write one sentence about the sea.",
    "List three colours.",
    "What is the capital of France?",
    "Give me a short tip for learning Python.",
    "Name two planets.",
    "Say hello in Spanish.",
)


class LoadGenerator:
    def __init__(self, endpoints: Callable[[], list[str]], *, concurrency: int = 4, max_tokens: int = 16) -> None:
        self._endpoints = endpoints
        self.concurrency = concurrency
        self._sending = concurrency  # clients with a lower index send; the others wait (limit)
        self.max_tokens = max_tokens
        self.answered: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self._current: list[str] = []
        self._models: dict[str, str] = {}
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._threads: list[threading.Thread] = []

    def start(self) -> "LoadGenerator":
        self._threads = [threading.Thread(target=self._sync_endpoints, name="load-endpoints", daemon=True)]
        self._threads += [
            threading.Thread(target=self._client, args=(i,), name=f"load-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for t in self._threads:
            t.start()
        return self

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def limit(self, clients: int) -> None:
        self._sending = clients

    def stop(self) -> None:
        self._stop.set()
        self._running.set()
        for t in self._threads:
            t.join(timeout=150)

    def _sync_endpoints(self) -> None:
        while not self._stop.is_set():
            try:
                found = sorted(self._endpoints())
            except Exception:
                log.exception("load generator: could not read the endpoints")
            else:
                with self._lock:
                    self._current = found
            self._stop.wait(1.0)

    def _next(self) -> str | None:
        with self._lock:
            return self._current[next(self._turn) % len(self._current)] if self._current else None

    def _client(self, index: int) -> None:
        prompts = itertools.cycle(PROMPTS[index % len(PROMPTS) :] + PROMPTS[: index % len(PROMPTS)])
        with httpx.Client(timeout=120) as http:
            while not self._stop.is_set():
                self._running.wait()
                if index >= self._sending:
                    self._stop.wait(0.2)
                    continue
                address = self._next()
                if address is None:
                    self._stop.wait(0.2)  # no ready endpoint yet
                    continue
                try:
                    model = self._models.get(address) or self._model(http, address)
                    body = {"model": model, "prompt": next(prompts), "max_tokens": self.max_tokens, "temperature": 0}
                    http.post(f"http://{address}/v1/completions", json=body).raise_for_status()
                    self.answered[address] += 1
                except httpx.HTTPError as e:
                    self.failed[address] += 1
                    log.info("load generator: %s: %s", address, e)
                    self._stop.wait(0.2)  # a pod going away: the endpoint sync drops it within a second

    def _model(self, http: httpx.Client, address: str) -> str:
        model = str(http.get(f"http://{address}/v1/models").json()["data"][0]["id"])
        self._models[address] = model
        return model
