"""Quality probes over vLLM's OpenAI-compatible HTTP API (httpx): the same prompts to baseline and canary,
temperature 0, with logprobs; scored by ``kvcal.core.analysis.quality``. Implements ``kvcal.ports.Probes``.

Each side's model id is read from its own ``/v1/models`` (the canary serves a different checkpoint path). A probe
that both sides reject with HTTP 4xx (e.g. a needle longer than ``--max-model-len``) is skipped and named in the
message; any other failure makes one Error measurement (it counts toward consecutiveErrorLimit). An error answer's
body never reaches a measurement (the HTTP status does); it goes to the operator's log, redacted.
"""

import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import httpx

from kvcal.core.analysis.quality import Completion, ProbeResult, assess_quality
from kvcal.core.analysis.verdict import error_measurement
from kvcal.core.guard.redact import redact
from kvcal.core.timestamps import rfc3339
from kvcal.models.spec import AnalysisSpec, QualitySpec
from kvcal.models.status import Measurement
from kvcal.probes import Suite, at_served_context, builtin_suite, suite_from_configmap, within_budget

Api = Literal["chat", "completions"]
log = logging.getLogger(__name__)
LOGGED_BODY_CHARS = 1000


@dataclass(frozen=True)
class ProbeTls:
    """HTTPS to TLS-serving pods: their certificate checked against ``ca_file`` and ``server_name`` (the baseline
    Service's DNS name: the probes reach pods by IP, and a pod's certificate names the Service)."""

    ca_file: str
    server_name: str


class ProbeHTTPError(RuntimeError):
    """An error answer: its status, never its body (that goes to the operator's log, redacted)."""

    def __init__(self, url: str, status: int, body: str) -> None:
        log.warning("probe %s answered HTTP %d: %s", url, status, redact(body[:LOGGED_BODY_CHARS]))
        super().__init__(f"{url}: HTTP {status} (the answer is in the operator's log)")
        self.status = status


def completion_from_reply(body: dict[str, Any]) -> Completion:
    """Text, tokens and chosen-token logprobs of an OpenAI chat or text completion reply (vLLM's shape)."""
    choice = body["choices"][0]
    logprobs = choice.get("logprobs") or {}
    if "message" in choice:
        content = logprobs.get("content") or []
        tokens = tuple(str(t["token"]) for t in content)
        values = tuple(float(t["logprob"]) for t in content)
        text = choice["message"].get("content") or ""
    else:
        tokens = tuple(str(t) for t in logprobs.get("tokens") or ())
        values = tuple(float(v) for v in logprobs.get("token_logprobs") or ())
        text = choice.get("text") or ""
    usage = body.get("usage") or {}
    return Completion(
        text=text, tokens=tokens, logprobs=values, finish_reason=choice.get("finish_reason"),
        prompt_tokens=int(usage.get("prompt_tokens") or 0), completion_tokens=int(usage.get("completion_tokens") or 0),
    )  # fmt: skip


def _spent(results: list[ProbeResult], budget: int) -> str:
    """What the interval's probes cost each role, as the servers counted it."""
    roles = [
        sum(side.prompt_tokens + side.completion_tokens for side in sides)
        for sides in ([r.baseline for r in results], [r.canary for r in results])
    ]
    return f"probes spent {roles[0]:,} tokens on the baseline and {roles[1]:,} on the canary (budget {budget:,} each)"


def load_suite(spec: QualitySpec, read_configmap: Callable[[str], dict[str, str] | None] | None = None) -> Suite:
    """The suite the spec names: built in, or from ConfigMap ``spec.configMap`` read with ``read_configmap``."""
    if spec.suite == "builtin":
        return builtin_suite()
    if not spec.config_map:
        raise ValueError("spec.analysis.quality.configMap: required when suite is 'configmap'")
    if read_configmap is None:
        raise ValueError("a ConfigMap reader is needed for spec.analysis.quality.suite: configmap")
    return suite_from_configmap(spec.config_map, read_configmap(spec.config_map))


class HttpProbes:
    def __init__(
        self,
        suite: Suite | None = None,
        *,
        api: Api = "chat",
        timeout_seconds: float = 120.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        transport: httpx.BaseTransport | None = None,
        api_key: str | None = None,
        tls: ProbeTls | None = None,
        refusal: str | None = None,
    ) -> None:
        """``api_key``: sent as a bearer token to both roles (the key the baseline's vLLM asks for); ``refusal``: why
        these servers cannot be probed (one Error measurement, nothing sent)."""
        self._suite = suite or builtin_suite()
        self._api_key = api_key
        self._tls = tls
        self._refusal = refusal
        self._api = api
        self._timeout = timeout_seconds
        self._clock = clock
        self._transport = transport

    def _client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else None
        verify: ssl.SSLContext | bool = True
        if self._tls is not None:
            verify = ssl.create_default_context(cafile=self._tls.ca_file)  # hostname checked: server_name
        return httpx.Client(timeout=self._timeout, transport=self._transport, headers=headers, verify=verify)

    def _url(self, base_url: str, path: str) -> str:
        base = base_url.rstrip("/")
        if self._tls is not None and base.startswith("http://"):
            base = "https://" + base.removeprefix("http://")
        return base + path

    def _extensions(self) -> dict[str, Any]:
        return {"sni_hostname": self._tls.server_name} if self._tls is not None else {}

    def _post(self, client: httpx.Client, url: str, payload: dict[str, Any]) -> dict[str, Any]:
        r = client.post(url, json=payload, extensions=self._extensions())
        if r.status_code != 200:
            raise ProbeHTTPError(url, r.status_code, r.text)
        body: dict[str, Any] = r.json()
        return body

    def model_card(self, client: httpx.Client, base_url: str) -> tuple[str, int | None]:
        """The served model's id and the longest context the server serves (vLLM's `max_model_len`, if given)."""
        url = self._url(base_url, "/v1/models")
        r = client.get(url, extensions=self._extensions())
        if r.status_code != 200:
            raise ProbeHTTPError(url, r.status_code, r.text)
        card = r.json()["data"][0]
        longest = card.get("max_model_len")
        return str(card["id"]), int(longest) if isinstance(longest, int) else None

    def complete(self, client: httpx.Client, base_url: str, model: str, prompt: str, max_tokens: int) -> Completion:
        common = {"model": model, "temperature": 0, "max_tokens": max_tokens, "seed": 0}
        if self._api == "chat":
            payload = {**common, "messages": [{"role": "user", "content": prompt}], "logprobs": True, "top_logprobs": 1}
            body = self._post(client, self._url(base_url, "/v1/chat/completions"), payload)
        else:
            body = self._post(
                client, self._url(base_url, "/v1/completions"), {**common, "prompt": prompt, "logprobs": 1}
            )
        return completion_from_reply(body)

    def run(self, spec: QualitySpec | AnalysisSpec, baseline_url: str, canary_url: str) -> list[Measurement]:
        quality = spec.quality if isinstance(spec, AnalysisSpec) else spec
        now = self._clock()
        at = rfc3339(now)
        # Whose turn it is to start: one turn per analysis interval of the clock, so every probe is sent in turn.
        interval = spec.interval_seconds if isinstance(spec, AnalysisSpec) else 60.0
        turn = int(now.timestamp() // max(interval, 1.0))
        results: list[ProbeResult] = []
        skipped: list[str] = []
        waiting: list[str] = []
        if self._refusal is not None:
            return [error_measurement("probes", self._refusal, at=at)]
        try:
            with self._client() as client:
                cards = self.model_card(client, baseline_url), self.model_card(client, canary_url)
                models = cards[0][0], cards[1][0]
                served = [length for _, length in cards if length]
                suite = at_served_context(
                    self._suite, min(served) if served else None, quality.max_probe_context_tokens
                )
                sent, waits = within_budget(list(suite.probes), quality.token_budget, turn)
                waiting = [probe.id for probe in waits]
                for probe in sent:
                    sides: list[Completion | None] = []
                    for url, model in zip((baseline_url, canary_url), models, strict=True):
                        try:
                            sides.append(self.complete(client, url, model, probe.prompt, probe.max_tokens))
                        except ProbeHTTPError as exc:
                            if not 400 <= exc.status < 500:
                                raise
                            sides.append(None)
                    base, canary = sides
                    if base is None and canary is None:
                        skipped.append(probe.id)
                        continue
                    if base is None or canary is None:
                        side = "baseline" if base is None else "canary"
                        raise RuntimeError(f"probe {probe.id}: only the {side} rejected it")
                    results.append(ProbeResult(probe, base, canary))
        except (httpx.HTTPError, ProbeHTTPError, RuntimeError, KeyError, ValueError) as exc:
            return [error_measurement("probes", f"{type(exc).__name__}: {exc}", at=at)]
        measurements = assess_quality(quality, results, at=at, suite=suite.name)
        notes = [_spent(results, quality.token_budget)]
        if waiting:
            notes.append(f"waiting for a later interval (over the budget): {', '.join(waiting)}")
        if skipped:
            notes.append(f"skipped (rejected by both): {', '.join(skipped)}")
        first = measurements[0]
        measurements[0] = first.model_copy(update={"message": "; ".join([first.message or "", *notes])})
        return measurements
