"""`kvcal status|promote|abort|retry|recalibrate NAME` (also installed as the kubectl plugin `kubectl-kvcal`).

promote / abort / retry / recalibrate only set an annotation (``kvcal.dev/<command>`` = the current time); the operator
acts on it at its next reconcile and removes it, so the command works through RBAC that allows patching the
resource, and the status records what the annotation caused.
"""

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from kvcal.models.status import KVCalibrationStatus, Measurement

GROUP, VERSION, PLURAL = "kvcal.dev", "v1alpha1", "kvcalibrations"
ANNOTATIONS = {
    "promote": "kvcal.dev/promote",
    "abort": "kvcal.dev/abort",
    "retry": "kvcal.dev/retry",
    "recalibrate": "kvcal.dev/recalibrate",
}
# Phases in which the operator acts on each annotation (others: it is kept until then, or ignored).
ACTS_IN = {
    "promote": {"AwaitingPromotion"},
    "abort": {"Deploying", "Analyzing", "AwaitingPromotion", "Calibrating", "Verifying", "Pending"},
    "retry": {"RolledBack", "Failed"},
    "recalibrate": {"Succeeded", "RolledBack", "Failed"},
}
HELP = {
    "status": "show a KVCalibration as a tree: phase, conditions, steps, weights, last measurements",
    "promote": "promote a KVCalibration waiting in AwaitingPromotion",
    "abort": "abort a KVCalibration: roll back the canary",
    "retry": "re-run the analysis of a rolled-back or failed KVCalibration",
    "recalibrate": "calibrate a finished KVCalibration anew from its current spec (never happens by itself)",
}


def _api(args: argparse.Namespace) -> tuple[client.CustomObjectsApi, str]:
    try:
        api_client = config.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
        _, context = config.list_kube_config_contexts(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
        default_ns = context.get("context", {}).get("namespace") or "default"
    except config.ConfigException as exc:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            raise SystemExit(
                f"kvcal: no cluster to talk to ({exc}); pass --kubeconfig FILE or set KUBECONFIG"
            ) from None
        api_client, default_ns = client.ApiClient(), "default"
    return client.CustomObjectsApi(api_client), args.namespace or default_ns


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


def _measurement_line(m: Measurement) -> str:
    limit = f"  limit {_value(m.metric, m.threshold)}" if m.threshold is not None else ""
    base, canary = _value(m.metric, m.baseline), _value(m.metric, m.canary)
    line = f"{m.metric:<15} {m.phase:<12} baseline {base:>9}  canary {canary:>9}"
    return line + limit + (f"  ({m.message})" if m.message and m.phase != "Successful" else "")


def last_interval(measurements: list[Measurement]) -> list[Measurement]:
    """The newest interval: walking back from the end until a metric repeats."""
    seen: set[str] = set()
    out: list[Measurement] = []
    for m in reversed(measurements):
        if m.metric in seen:
            break
        seen.add(m.metric)
        out.append(m)
    return out[::-1]


def _tree(lines: list[tuple[str, list[str]]]) -> list[str]:
    """Sections with children drawn as a tree."""
    out: list[str] = []
    for i, (head, children) in enumerate(lines):
        last = i == len(lines) - 1
        out.append(("└─ " if last else "├─ ") + head)
        pad = "   " if last else "│  "
        out += [pad + ("└─ " if j == len(children) - 1 else "├─ ") + c for j, c in enumerate(children)]
    return out


def render_status(obj: dict[str, Any]) -> str:
    """The tree `kvcal status` prints (pure: the object as the API serves it)."""
    meta, spec = obj.get("metadata", {}), obj.get("spec", {})
    st = KVCalibrationStatus.model_validate(obj.get("status") or {})
    steps = (spec.get("serving", {}).get("traffic", {}) or {}).get("steps", [10, 50])
    router = (spec.get("serving", {}).get("traffic", {}) or {}).get("router", "replicas")
    a = st.analysis
    analysis_spec = spec.get("analysis", {}) or {}
    sections: list[tuple[str, list[str]]] = [
        (f"Phase: {st.phase.value}" + (f"  since {st.phase_started_at}" if st.phase_started_at else ""),
         [st.message] if st.message else []),
        ("Conditions", [f"{c.type:<15} {c.status:<8} {c.reason}" + (f": {c.message}" if c.message else "")
                        for c in st.conditions]),
        ("Calibration", [f"{k}: {v}" for k, v in st.calibration.to_wire().items()]),
        ("Verification", [f"{k}: {v}" for k, v in st.verification.to_wire().items()]),
        ("Serving (after promotion)", [f"{k}: {v}" for k, v in st.serving.to_wire().items() if k != "verification"]
         + [f"verification {k}: {v}" for k, v in st.serving.verification.to_wire().items()]),
        ("Canary", [
            f"deployment: {st.canary.deployment or '-'} (ready {st.canary.ready_replicas})",
            f"router: {router}, steps: {', '.join(f'{s}%' for s in steps)}, "
            f"step {min(st.canary.step_index + 1, len(steps))}/{len(steps)}, weight now {st.canary.weight}%",
        ]),
        ("Analysis", [
            f"successful in a row: {a.consecutive_successes}/{analysis_spec.get('successfulIntervals', 5)}",
            f"failed: {a.failures}/{analysis_spec.get('failureLimit', 2)}, inconclusive: {a.inconclusive}/"
            f"{analysis_spec.get('inconclusiveLimit', 3)}, errors in a row: {a.consecutive_errors}/"
            f"{analysis_spec.get('consecutiveErrorLimit', 4)}",
            f"TTFT p95 delta: {a.ttft_p95_delta or '-'}, last measured: {a.last_measured_at or '-'}",
        ]),
    ]  # fmt: skip
    if a.measurements:
        last = last_interval(a.measurements)
        sections.append((f"Last measurements ({last[0].at})", [_measurement_line(m) for m in last]))
    if st.history:
        sections.append(("History", [f"{h.at} {h.phase.value}: {h.reason}" for h in st.history[-5:]]))
    sections = [(h, c) for h, c in sections if c or h.startswith("Phase")]
    header = f"KVCalibration {meta.get('namespace', '?')}/{meta.get('name', '?')}"
    header += f" (generation {meta.get('generation', '?')}, observed {st.observed_generation or '-'})"
    return "\n".join([header, *_tree(sections)])


def status(args: argparse.Namespace) -> int:
    api, namespace = _api(args)
    obj = _get(api, namespace, args.name)
    if obj is None:
        print(f"KVCalibration {args.name!r} not found in namespace {namespace!r}", file=sys.stderr)
        return 1
    print(render_status(obj))
    return 0


def annotate(action: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        api, namespace = _api(args)
        obj = _get(api, namespace, args.name)
        if obj is None:
            print(f"KVCalibration {args.name!r} not found in namespace {namespace!r}", file=sys.stderr)
            return 1
        phase = (obj.get("status") or {}).get("phase", "Pending")
        if phase not in ACTS_IN[action]:
            wanted = ", ".join(sorted(ACTS_IN[action]))
            print(f"note: phase is {phase}; the operator acts on {action} in {wanted}", file=sys.stderr)
        key = ANNOTATIONS[action]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        api.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, args.name, {"metadata": {"annotations": {key: now}}}
        )
        print(f"kvcalibration {namespace}/{args.name}: {key}={now}")
        return 0

    return run


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for command, func in (("status", status), *((a, annotate(a)) for a in ANNOTATIONS)):
        p = sub.add_parser(command, help=HELP[command], description=HELP[command])
        p.add_argument("name", metavar="NAME", help="the KVCalibration")
        p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's, else 'default')")
        p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
        p.set_defaults(func=func)
