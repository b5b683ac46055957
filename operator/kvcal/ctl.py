"""`kvcal status|promote|abort|retry|recalibrate NAME` (also installed as the kubectl plugin `kubectl-kvcal`).

promote / abort / retry / recalibrate only set an annotation (``kvcal.dev/<command>`` = the current time); the operator
acts on it at its next reconcile and removes it, so the command works through RBAC that allows patching the
resource, and the status records what the annotation caused.
"""

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ValidationError

from kvcal.adapters.kubeconfig import connect
from kvcal.core.manifests.common import GROUP, PLURAL, VERSION
from kvcal.core.observations import ABORT_ANNOTATION, PROMOTE_ANNOTATION, RECALIBRATE_ANNOTATION, RETRY_ANNOTATION
from kvcal.core.phases import LIFECYCLE, Lifecycle
from kvcal.core.timestamps import rfc3339
from kvcal.models.spec import AnalysisSpec, TrafficSpec
from kvcal.models.status import (
    CapacityStatus,
    Condition,
    KVCacheRole,
    KVCalibrationStatus,
    Measurement,
)

ANNOTATIONS = {
    "promote": PROMOTE_ANNOTATION,
    "abort": ABORT_ANNOTATION,
    "retry": RETRY_ANNOTATION,
    "recalibrate": RECALIBRATE_ANNOTATION,
}
SectionT = TypeVar("SectionT", bound=BaseModel)
HELP = {
    "status": "show a KVCalibration as a tree: phase, conditions, steps, weights, last measurements",
    "promote": "promote a KVCalibration waiting in AwaitingPromotion",
    "abort": "abort a KVCalibration: roll back the canary",
    "retry": "re-run the analysis of a rolled-back or failed KVCalibration",
    "recalibrate": "calibrate a finished KVCalibration anew from its current spec (never happens by itself)",
}


def _api(args: argparse.Namespace) -> tuple[client.CustomObjectsApi, str]:
    try:
        connection = connect(args.kubeconfig)
    except config.ConfigException as exc:
        raise SystemExit(f"kvcal: no cluster to talk to ({exc}); pass --kubeconfig FILE or set KUBECONFIG") from None
    return client.CustomObjectsApi(connection.api_client), args.namespace or connection.namespace


def _get(api: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return cast(dict[str, Any], obj)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _value(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    if metric.split("-")[0] in ("ttft", "itl", "e2e"):
        return f"{value * 1000:.1f}ms"
    if metric in ("errorRate", "accuracy", "tokenAgreement", "kvCacheUsage"):
        return f"{value:.2%}"
    return f"{value:g}"


def _measurement_line(measurement: Measurement) -> str:
    metric, threshold = measurement.metric, measurement.threshold
    limit = f"  limit {_value(metric, threshold)}" if threshold is not None else ""
    base, canary = _value(metric, measurement.baseline), _value(metric, measurement.canary)
    line = f"{metric:<15} {measurement.phase:<12} baseline {base:>9}  canary {canary:>9}"
    explained = measurement.message and measurement.phase != "Successful"
    return line + limit + (f"  ({measurement.message})" if explained else "")


def _kv_line(role: str, kv: KVCacheRole | None) -> str:
    if kv is None:
        return f"{role}: not reported"
    per_token = f"{kv.bytes_per_token:g} bytes/token" if kv.bytes_per_token is not None else "bytes/token unknown"
    return f"{role}: {kv.cache_dtype} KV, {kv.kv_tokens} tokens, {per_token}, max concurrency {kv.max_concurrency}"


def _capacity_lines(capacity: CapacityStatus, limits: AnalysisSpec) -> list[str]:
    if capacity.baseline is None and capacity.canary is None:
        return []
    check = limits.capacity
    gate = f"check needs >= {check.min_ratio:g}x a BF16 baseline" if check.enabled else "check disabled"
    ratio = f"{capacity.token_ratio:.2f}x" if capacity.token_ratio is not None else "-"
    return [
        _kv_line("baseline", capacity.baseline),
        _kv_line("canary", capacity.canary),
        f"canary/baseline: {ratio} ({gate})",
    ]


def _condition_line(condition: Condition) -> str:
    line = f"{condition.type:<15} {condition.status:<8} {condition.reason}"
    return line + (f": {condition.message}" if condition.message else "")


def last_interval(measurements: list[Measurement]) -> list[Measurement]:
    """The newest interval: walking back from the end until a metric repeats."""
    seen: set[str] = set()
    out: list[Measurement] = []
    for measurement in reversed(measurements):
        if measurement.metric in seen:
            break
        seen.add(measurement.metric)
        out.append(measurement)
    return out[::-1]


def _tree(lines: list[tuple[str, list[str]]]) -> list[str]:
    """Sections with children drawn as a tree."""
    out: list[str] = []
    for index, (head, children) in enumerate(lines):
        last = index == len(lines) - 1
        out.append(("└─ " if last else "├─ ") + head)
        pad = "   " if last else "│  "
        out += [
            pad + ("└─ " if position == len(children) - 1 else "├─ ") + child for position, child in enumerate(children)
        ]
    return out


def _section(model: type[SectionT], value: Any) -> SectionT:
    """A spec section with the model's defaults; the defaults alone when it does not parse."""
    try:
        return model.model_validate(value or {})
    except ValidationError:
        return model()


def _phase_section(status: KVCalibrationStatus, lifecycle: Lifecycle) -> tuple[str, list[str]]:
    """The phase, the machine it belongs to, and which commands the operator acts on now (core.phases)."""
    head = f"Phase: {status.phase}" + (f"  since {status.phase_started_at}" if status.phase_started_at else "")
    lines = [status.message] if status.message else []
    if status.phase not in lifecycle:
        return head + " (unknown to this kvcal)", lines
    commands = [command for command in ANNOTATIONS if status.phase in lifecycle.acts_on(command)]
    lines.append(f"commands acted on now: {', '.join(commands) or 'none'}")
    return f"{head} ({lifecycle[status.phase].machine})", lines


def render_status(obj: dict[str, Any], lifecycle: Lifecycle = LIFECYCLE) -> str:
    """The tree `kvcal status` prints (pure: the object as the API serves it)."""
    meta, spec = obj.get("metadata", {}), obj.get("spec", {})
    st = KVCalibrationStatus.model_validate(obj.get("status") or {})
    traffic = _section(TrafficSpec, (spec.get("serving") or {}).get("traffic"))
    steps, router = traffic.steps, traffic.router
    analysis = st.analysis
    limits = _section(AnalysisSpec, spec.get("analysis"))
    sections: list[tuple[str, list[str]]] = [
        _phase_section(st, lifecycle),
        ("Conditions", [_condition_line(each) for each in st.conditions]),
        ("Calibration", [f"{key}: {value}" for key, value in st.calibration.to_wire().items()]),
        ("Verification", [f"{key}: {value}" for key, value in st.verification.to_wire().items()]),
        (
            "Serving (after promotion)",
            [f"{key}: {value}" for key, value in st.serving.to_wire().items() if key != "verification"]
            + [f"verification {key}: {value}" for key, value in st.serving.verification.to_wire().items()],
        ),
        ("Canary", [
            f"deployment: {st.canary.deployment or '-'} (ready {st.canary.ready_replicas})",
            f"router: {router}, steps: {', '.join(f'{step}%' for step in steps)}, "
            f"step {min(st.canary.step_index + 1, len(steps))}/{len(steps)}, weight now {st.canary.weight}%",
        ]),
        ("Analysis", [
            f"successful in a row: {analysis.consecutive_successes}/{limits.successful_intervals}",
            f"failed: {analysis.failures} (tolerates {limits.failure_limit}), inconclusive: {analysis.inconclusive} "
            f"(tolerates {limits.inconclusive_limit}), errors in a row: {analysis.consecutive_errors} (tolerates "
            f"{limits.consecutive_error_limit})",
            f"TTFT p95 delta: {analysis.ttft_p95_delta or '-'}, last measured: {analysis.last_measured_at or '-'}",
        ]),
    ]  # fmt: skip
    sections.append((f"KV capacity ({st.capacity.measured_at})", _capacity_lines(st.capacity, limits)))
    sections.append(("Latency noise (kvcal plan sizes the canary with it)", [
        f"{noise.metric}: {noise.source} at {noise.learned_at}: {noise.message}" for noise in st.noise
    ]))  # fmt: skip
    if analysis.measurements:
        last = last_interval(analysis.measurements)
        sections.append((f"Last measurements ({last[0].at})", [_measurement_line(measurement) for measurement in last]))
    if st.history:
        sections.append(("History", [f"{entry.at} {entry.phase}: {entry.reason}" for entry in st.history[-5:]]))
    sections = [(head, children) for head, children in sections if children or head.startswith("Phase")]
    header = f"KVCalibration {meta.get('namespace', '?')}/{meta.get('name', '?')}"
    header += f" (generation {meta.get('generation', '?')}, observed {st.observed_generation or '-'})"
    return "\n".join([header, *_tree(sections)])


def _fetch(args: argparse.Namespace) -> tuple[client.CustomObjectsApi, str, dict[str, Any]] | None:
    """The KVCalibration named on the command line; None (said on stderr) when it does not exist."""
    api, namespace = _api(args)
    obj = _get(api, namespace, args.name)
    if obj is None:
        print(f"KVCalibration {args.name!r} not found in namespace {namespace!r}", file=sys.stderr)
        return None
    return api, namespace, obj


def status(args: argparse.Namespace) -> int:
    fetched = _fetch(args)
    if fetched is None:
        return 1
    print(render_status(fetched[2]))
    return 0


def annotate(action: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        fetched = _fetch(args)
        if fetched is None:
            return 1
        api, namespace, obj = fetched
        phase = (obj.get("status") or {}).get("phase", "Pending")
        if phase not in LIFECYCLE.acts_on(action):
            wanted = ", ".join(sorted(LIFECYCLE.acts_on(action)))
            print(f"note: phase is {phase}; the operator acts on {action} in {wanted}", file=sys.stderr)
        key = ANNOTATIONS[action]
        now = rfc3339(datetime.now(UTC))
        api.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, args.name, {"metadata": {"annotations": {key: now}}}
        )
        print(f"kvcalibration {namespace}/{args.name}: {key}={now}")
        return 0

    return run


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for command, func in (("status", status), *((action, annotate(action)) for action in ANNOTATIONS)):
        parser = sub.add_parser(command, help=HELP[command], description=HELP[command])
        parser.add_argument("name", metavar="NAME", help="the KVCalibration")
        parser.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's, else 'default')")
        parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
        parser.set_defaults(func=func)
