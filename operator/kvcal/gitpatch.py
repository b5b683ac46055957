"""`kvcal promotion-patch NAME`: the promotion as a patch to commit to Git, for baselines that Git owns.

With `spec.promotion.mode: manual` the run waits in AwaitingPromotion (Argo CD: Suspended). Instead of `kvcal
promote` (kvcal applies the promotion itself), commit this patch beside the baseline: once Argo CD has synced it, the
baseline carries the promotion marker, and kvcal finishes the promotion (Promoting: rollout, canary removed,
Succeeded) without writing the baseline. The patch is a strategic-merge patch (a kustomize `patches:` entry, or merge
it into the Deployment's YAML); the comment lines above it give the same fields as plain values.
"""

import argparse
import sys

import yaml

from kvcal.adapters.kube import KubeClient
from kvcal.adapters.kubeconfig import connect
from kvcal.core.manifests import Owner, build_promoted_baseline
from kvcal.core.manifests.promotion import promotion_patch
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import Phase

HELP = "print the promotion of a KVCalibration as a patch to commit to Git (kustomize patch + plain values)"


def _flow(value: object) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=999).strip()


def render(patch: dict[str, object]) -> str:
    """The plain values as comments, then the patch."""
    spec = patch["spec"]
    assert isinstance(spec, dict)
    pod = spec["template"]["spec"]
    lines = [f"# kvcal promotion: commit as a kustomize patch, or set these fields on the {patch['kind']}:"]
    for container in pod["containers"]:
        lines.append(f"#   container {container['name']} args: {' '.join(container['args'])}")
        lines += [
            f"#   container {container['name']} volumeMount: {_flow(m)}" for m in container.get("volumeMounts") or []
        ]
    lines += [f"#   volume: {_flow(volume)}" for volume in pod.get("volumes") or []]
    return "\n".join(lines) + "\n" + yaml.safe_dump(patch, sort_keys=False)


def run(args: argparse.Namespace) -> int:
    connection = connect(args.kubeconfig, in_cluster=False)
    kube, namespace = KubeClient(connection.api_client), args.namespace or connection.namespace
    obj = kube.get("KVCalibration", namespace, args.name)
    if obj is None:
        print(f"KVCalibration {args.name!r} not found in namespace {namespace!r}", file=sys.stderr)
        return 1
    status = obj.get("status") or {}
    spec_hash = (status.get("calibration") or {}).get("specHash")
    if status.get("phase") != Phase.AWAITING_PROMOTION or not spec_hash:
        print(f"note: phase is {status.get('phase')}; the patch is meant for AwaitingPromotion", file=sys.stderr)
    if not spec_hash:
        print("no calibration yet: nothing to promote", file=sys.stderr)
        return 1
    spec = KVCalibrationSpec.model_validate(obj["spec"])
    ref = spec.serving.baseline
    baseline = kube.get(ref.kind, namespace, ref.deployment)
    if baseline is None:
        print(f"the baseline {ref.kind} {ref.deployment!r} is not there", file=sys.stderr)
        return 1
    owner = Owner(args.name, namespace, obj["metadata"]["uid"])
    print(render(promotion_patch(build_promoted_baseline(owner, spec, spec_hash, baseline))), end="")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("promotion-patch", help=HELP, description=HELP)
    parser.add_argument("name", metavar="NAME", help="the KVCalibration (in AwaitingPromotion)")
    parser.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's, else 'default')")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    parser.set_defaults(func=run)
