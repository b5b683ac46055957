"""The promotion of the baseline as a server-side apply configuration: only the fields kvcal owns.

kvcal does not own the baseline (Git and Argo CD, Helm or a person do), so the promotion is applied as field manager
`kvcal` and names nothing but what it changes: the vLLM container's args (its command too when the model is named
there), the checkpoint's volume and mount, the rollout strategy of the baseline's kind (core.manifests.workload), the
hardening the canary added, and the marker annotations. The API server records these fields as kvcal's
(managedFields), which is what Argo CD's `ignoreDifferences.managedFieldsManagers: [kvcal]` keeps out of its diff;
every other field of the baseline stays with its owner, so a later Git change to them still lands.

A field kvcal applied once and leaves out of a later apply is removed by the API server when nobody else owns it,
so every apply names the checkpoint's volume and mount and the hardening again, even when the baseline has them.
"""

from kvcal.core.manifests.canary import (
    CHECKPOINT_ANNOTATION,
    PROMOTED_ANNOTATION,
    baseline_container_index,
    fp8_pod_spec,
    promotion_marker,
)
from kvcal.core.manifests.common import Manifest, Owner, container_security_context, volumes_and_mounts
from kvcal.core.manifests.jobs import checkpoint_location
from kvcal.core.manifests.workload import API_VERSION, promotion_rollout_fields
from kvcal.models.spec import KVCalibrationSpec

FIELD_MANAGER = "kvcal"
_POD_HARDENING = {"seccompProfile": {"type": "RuntimeDefault"}}


def build_promoted_baseline(owner: Owner, spec: KVCalibrationSpec, spec_hash: str, baseline: Manifest) -> Manifest:
    """The apply configuration that rolls the baseline to the calibrated checkpoint with FP8 KV (apply it as
    FIELD_MANAGER with force: kvcal takes these fields over from whoever set them)."""
    pod = baseline["spec"]["template"]["spec"]
    promoted = fp8_pod_spec(baseline, spec)
    index = baseline_container_index(baseline, spec.serving.baseline.container)
    before, after = pod["containers"][index], promoted["containers"][index]
    checkpoint = checkpoint_location(spec)
    volumes, mounts = volumes_and_mounts([(checkpoint, False)])
    container: Manifest = {"name": after["name"], "args": after["args"]}
    if "command" in after and (after["command"] != before.get("command") or checkpoint.path in after["command"]):
        container["command"] = after["command"]  # `vllm serve CHECKPOINT`: the model is in the command
    if mounts:
        container["volumeMounts"] = mounts
    if before.get("securityContext") in (None, {}, container_security_context()):
        container["securityContext"] = container_security_context()
    pod_fields: Manifest = {"containers": [container]}
    if volumes:
        pod_fields["volumes"] = volumes
    if pod.get("securityContext") in (None, {}, _POD_HARDENING):
        pod_fields["securityContext"] = _POD_HARDENING
    kind = spec.serving.baseline.kind
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": {
            "name": baseline["metadata"]["name"],
            "namespace": owner.namespace,
            "annotations": {
                PROMOTED_ANNOTATION: promotion_marker(owner, spec_hash),
                CHECKPOINT_ANNOTATION: checkpoint.uri,
            },
        },
        "spec": {**promotion_rollout_fields(kind, baseline), "template": {"spec": pod_fields}},
    }


def promotion_patch(applied: Manifest) -> Manifest:
    """The promotion as a strategic-merge patch to commit beside the baseline (kustomize `patches:`, or merged into
    the workload's YAML by hand): the apply configuration without a namespace, so it matches wherever it lands."""
    metadata = {key: value for key, value in applied["metadata"].items() if key != "namespace"}
    return {**applied, "metadata": metadata}
