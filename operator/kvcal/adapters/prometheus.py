"""Metrics from Prometheus (its HTTP API over httpx): runs the core's measurement plan over one window.

Implements ``kvcal.ports.MetricsSource``. What to ask, and how the answers are judged, is the core's
(``kvcal.core.analysis.plan``); this module runs the plan's queries and parses each answer into the plain values of its
shape. The Prometheus queried is the one the cluster admin configured that the spec picks
(``kvcal.core.guard.policy.resolve_prometheus``), with its CA, client certificate and credentials; certificates are
always verified. A Prometheus that cannot be used (no answer, TLS refused, credentials refused) gives one Error
measurement (it counts toward consecutiveErrorLimit); a query that fails gives an Error measurement for that metric;
an empty or NaN result is Inconclusive (decided by the core).

No answer's body reaches a measurement: errors say the HTTP status and a fixed description; the body goes to the
operator's log, redacted.
"""

import logging
import ssl
from collections.abc import Callable, Sequence
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx

from kvcal.core.analysis import plan, promql
from kvcal.core.analysis.capacity import KVCacheReadings
from kvcal.core.analysis.fleetnoise import from_status
from kvcal.core.analysis.plan import Estimator
from kvcal.core.analysis.verdict import error_measurement
from kvcal.core.guard.policy import Policy, PrometheusAccess, resolve_prometheus
from kvcal.core.guard.redact import redact
from kvcal.core.timestamps import rfc3339
from kvcal.models.spec import AnalysisSpec
from kvcal.models.status import Measurement, NoiseStatus

log = logging.getLogger(__name__)
# How much of an error answer's body the log keeps (redacted): enough to see what the server said.
LOGGED_BODY_CHARS = 1000
# HTTP statuses of an error answer, each with the fixed description the status gets instead of the body.
_DESCRIPTIONS = {
    400: "the query was refused",
    404: "no Prometheus API at this address",
    422: "the query could not be executed",
    503: "Prometheus is unavailable",
}
_RETRIED = (502, 503, 504)


class QueryClient(Protocol):
    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class QueryError(RuntimeError):
    """A query Prometheus answered with an error or an unexpected shape."""


class Unreachable(RuntimeError):
    """Prometheus cannot be used at all: no answer, TLS failed, or it refused the operator's credentials."""


def _read(path: str, what: str, access: PrometheusAccess) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        log.warning("Prometheus %s: cannot read its %s %s: %s", access.name, what, path, exc)
        raise Unreachable(f"Prometheus {access.name!r}: its {what} cannot be read (see the operator's log)") from exc


def _tls_context(access: PrometheusAccess) -> ssl.SSLContext:
    """Certificates verified against the configured CA (else the system's), hostname included; never disabled."""
    try:
        context = ssl.create_default_context(cafile=access.ca_file)
        if access.cert_file and access.key_file:
            context.load_cert_chain(access.cert_file, access.key_file)
    except (OSError, ssl.SSLError) as exc:
        log.warning("Prometheus %s: cannot load its CA or client certificate: %s", access.name, exc)
        raise Unreachable(
            f"Prometheus {access.name!r}: its CA or client certificate cannot be loaded (see the operator's log)"
        ) from exc
    return context


def _transport_failure(access: PrometheusAccess, exc: httpx.TransportError) -> Unreachable:
    """A fixed description of why no answer came (the exception's text, with its URL, goes to the log)."""
    log.warning("Prometheus %s at %s: %s: %s", access.name, access.address, type(exc).__name__, exc)
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        why = "its TLS certificate is not trusted (the configured CA) or does not name its address"
    elif cause is not None or "SSL" in str(exc) or "certificate" in str(exc):
        why = "the TLS handshake failed"
    elif isinstance(exc, httpx.TimeoutException):
        why = "no answer within the timeout"
    else:
        why = "connection failed"
    return Unreachable(f"Prometheus {access.name!r} unreachable: {why}")


class PrometheusClient:
    """Instant queries to one configured Prometheus. Redirects are not followed (an answer elsewhere would be a URL
    nobody configured) and the environment's proxies and .netrc are ignored: only the configured address and
    credentials are used."""

    def __init__(self, access: PrometheusAccess, timeout_seconds: float = 10) -> None:
        self.access = access
        headers: dict[str, str] = {}
        auth: tuple[str, str] | None = None
        if access.bearer_token_file:
            headers["Authorization"] = f"Bearer {_read(access.bearer_token_file, 'bearerTokenFile', access)}"
        if access.username_file and access.password_file:
            auth = (
                _read(access.username_file, "usernameFile", access),
                _read(access.password_file, "passwordFile", access),
            )
        self._url = access.address.rstrip("/") + "/api/v1/query"
        self._http = httpx.Client(
            verify=_tls_context(access),
            auth=auth,
            headers=headers,
            timeout=timeout_seconds,
            follow_redirects=False,
            trust_env=False,
        )

    def close(self) -> None:
        self._http.close()

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        for attempt in range(2):  # one retry, no more: a reconcile must not stall on a dead Prometheus
            try:
                response = self._http.get(self._url, params={"query": query, **(params or {})})
            except httpx.TransportError as exc:
                if attempt == 0:
                    continue
                raise _transport_failure(self.access, exc) from None
            if response.status_code not in _RETRIED or attempt == 1:
                break
        return self._result(response, query)

    def _result(self, response: httpx.Response, query: str) -> list[dict[str, Any]]:
        code, name = response.status_code, self.access.name
        if code == 200:
            try:
                body = response.json()
                result = body["data"]["result"] if body.get("status") == "success" else None
            except (ValueError, KeyError, TypeError, AttributeError):
                result = None
            if isinstance(result, list):
                return result
        log.warning(
            "Prometheus %s answered HTTP %d to %s: %s",
            name, code, query, redact(response.text[:LOGGED_BODY_CHARS]),
        )  # fmt: skip
        if code == 200:
            raise QueryError(f"Prometheus {name!r} answered HTTP 200 with an unexpected body (see the operator's log)")
        if code in (401, 403):
            raise Unreachable(f"Prometheus {name!r} refused the operator's credentials (HTTP {code})")
        if 300 <= code < 400:
            raise Unreachable(f"Prometheus {name!r} answered with a redirect (HTTP {code}), which is not followed")
        raise QueryError(f"Prometheus {name!r} answered HTTP {code}: {_DESCRIPTIONS.get(code, 'an error')}")


def connect(access: PrometheusAccess, timeout_seconds: int = 10) -> QueryClient:
    return PrometheusClient(access, timeout_seconds)


def run_query(client: QueryClient, expression: str) -> list[dict[str, Any]]:
    """An instant query's series; Unreachable when Prometheus cannot be used, QueryError when it refuses the query."""
    return client.custom_query(expression)


def scalar(client: QueryClient, query: str) -> float | None:
    """The single value of an instant query; None when the result is empty."""
    result = run_query(client, query)
    if not result:
        return None
    if len(result) > 1:
        raise QueryError(f"expected one series, got {len(result)}: the query must aggregate (sum/max)")
    return float(result[0]["value"][1])


def series_labels(client: QueryClient, query: str) -> list[dict[str, str]]:
    """The label sets of an instant vector query's series (empty when there is none)."""
    result = run_query(client, query)
    return [dict(series.get("metric") or {}) for series in result]


def buckets(client: QueryClient, query: str) -> list[tuple[float, float]]:
    """(le, cumulative rate) pairs of a ``sum by (le)`` bucket query; empty when there is no data."""
    return next(iter(pod_buckets(client, query)), [])


def pod_buckets(client: QueryClient, query: str) -> list[list[tuple[float, float]]]:
    """One ``buckets`` list per pod of a ``sum by (pod, instance, le)`` query, in a stable order (one list, or none,
    for a ``sum by (le)`` query)."""
    result = run_query(client, query)
    pods: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for series in result:
            labels = series["metric"]
            key = (labels.get("pod", ""), labels.get("instance", ""))
            pods.setdefault(key, []).append((float(labels["le"]), float(series["value"][1])))
    except (KeyError, ValueError) as exc:
        raise QueryError(f"bucket query returned series without a numeric 'le' label: {exc}") from exc
    return [pods[key] for key in sorted(pods)]


def interval_buckets(client: QueryClient, query: str) -> dict[float, list[tuple[float, float]]]:
    """A ``sum by (le)`` bucket subquery's samples: one ``buckets`` list per evaluation time (a matrix result)."""
    return {at: next(iter(pods.values())) for at, pods in _matrix_buckets(client, query).items()}


def history_buckets(client: QueryClient, query: str) -> list[dict[str, list[tuple[float, float]]]]:
    """A ``sum by (pod, instance, le)`` bucket subquery's samples: per evaluation time (oldest first), one ``buckets``
    list per pod (named ``pod/instance``)."""
    times = _matrix_buckets(client, query)
    return [times[at] for at in sorted(times)]


def _matrix_buckets(client: QueryClient, query: str) -> dict[float, dict[str, list[tuple[float, float]]]]:
    """A bucket subquery's samples: per evaluation time, one ``buckets`` list per ``pod/instance`` ("/" without)."""
    result = run_query(client, query)
    times: dict[float, dict[str, list[tuple[float, float]]]] = {}
    try:
        for series in result:
            labels = series["metric"]
            pod, le = f"{labels.get('pod', '')}/{labels.get('instance', '')}", float(labels["le"])
            for at, value in series["values"]:
                times.setdefault(float(at), {}).setdefault(pod, []).append((le, float(value)))
    except (KeyError, ValueError, TypeError) as exc:
        raise QueryError(f"bucket subquery returned series without a numeric 'le' label or samples: {exc}") from exc
    return times


class PrometheusSource:
    """Measures one KVCalibration's baseline and canary; ``selector`` ties series to roles (see core.analysis.promql).

    ``estimator`` (core.analysis.plan.Estimator): ``"buckets"`` (default) reads the per-bucket rates for kvcal's
    quantile estimate, ``"histogram_quantile"`` asks Prometheus for the quantile, as a Grafana panel would.
    ``policy``: the Prometheus servers the operator may query (chart values policy.prometheus.*); a spec that picks
    none of them gets an Error measurement and nothing is fetched.
    """

    def __init__(
        self,
        selector: promql.Selector,
        *,
        policy: Policy | None = None,
        estimator: Estimator = "buckets",
        connect: Callable[[PrometheusAccess], QueryClient] = connect,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._selector = selector
        self._policy = policy or Policy()
        self._estimator = estimator
        self._connect = connect
        self._clock = clock

    @property
    def selector(self) -> promql.Selector:
        """The label matchers of each role's series."""
        return self._selector

    def _client(self, spec: AnalysisSpec) -> QueryClient:
        access = resolve_prometheus(spec.prometheus, self._policy)
        if access is None:  # decide() refuses the spec too; here, nothing is fetched meanwhile
            raise Unreachable(
                "spec.analysis.prometheus: not a Prometheus the operator may query (see the spec's status)"
            )
        return self._connect(access)

    def measure(
        self,
        spec: AnalysisSpec,
        window_seconds: float,
        step_seconds: float | None = None,
        noise: Sequence[NoiseStatus] = (),
    ) -> list[Measurement]:
        at = rfc3339(self._clock())
        windows = plan.windows(spec, window_seconds, step_seconds)
        learned = from_status(noise)
        try:
            client = self._client(spec)
        except Unreachable as exc:
            return [error_measurement(plan.UNUSABLE, str(exc), at=at)]
        with closing(client):
            measuring = plan.analysis_plan(spec, self._selector, windows, self._estimator, learned)
            return plan.measurements(spec, measuring, run_plan(client, measuring), at, learned)

    def learn_noise(self, spec: AnalysisSpec) -> list[NoiseStatus]:
        """The baseline pods' own noise per rank-tested metric, learned from their history (core.analysis.fleetnoise);
        where Prometheus cannot be used, each metric says so and the rank test estimates it in each step."""
        at = rfc3339(self._clock())
        learning = plan.history_plan(spec, self._selector)
        try:
            client = self._client(spec)
        except Unreachable as exc:
            answers = plan.Answers()
            for query in learning.queries:
                answers.failures[query.feeds] = plan.Failure(query.expression, str(exc), unusable=True)
            return plan.learned_noise(spec, answers, at)
        with closing(client):
            return plan.learned_noise(spec, run_plan(client, learning), at)

    def kv_cache(self, spec: AnalysisSpec) -> KVCacheReadings:
        """The KV cache configuration each role's pods report (vllm:cache_config_info)."""
        try:
            client = self._client(spec)
        except Unreachable as exc:
            return KVCacheReadings(query="", error=str(exc))
        with closing(client):
            asking = plan.kv_cache_plan(self._selector)
            return plan.kv_cache_readings(asking, run_plan(client, asking))


def run_plan(client: QueryClient, planned: plan.Plan) -> plan.Answers:
    """Each query the plan still needs, in order, its answer parsed by its shape; a failure is recorded, not raised."""
    answers = plan.Answers()
    for query in planned.queries:
        if not plan.needed(query, answers, planned.learned):
            continue
        try:
            _ask(client, query, answers)
        except (Unreachable, QueryError) as exc:
            failure = plan.Failure(query.expression, str(exc), unusable=isinstance(exc, Unreachable))
            answers.failures[query.feeds] = failure
    return answers


def _ask(client: QueryClient, query: plan.Query, answers: plan.Answers) -> None:
    name, expression = query.name, query.expression
    match query.shape:
        case "value":
            answers.values[name] = scalar(client, expression)
        case "buckets":
            answers.buckets[name] = buckets(client, expression)
        case "pod_buckets":
            answers.pod_buckets[name] = pod_buckets(client, expression)
        case "interval_buckets":
            answers.interval_buckets[name] = interval_buckets(client, expression)
        case "history":
            answers.history[name] = history_buckets(client, expression)
        case "labels":
            answers.labels[name] = series_labels(client, expression)
