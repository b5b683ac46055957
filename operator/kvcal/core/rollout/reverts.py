"""After a promotion: is the calibrated checkpoint still what the baseline serves? Pure like decide.

kvcal does not own the baseline, so whoever does can put BF16 back: Argo CD's self-heal or next sync (unless told to
keep kvcal's fields, docs/operations.md), `kubectl rollout undo`, a person's edit. kvcal does not fight them (a
re-apply would only start a tug of war with self-heal); it says so: the Promoted condition turns False (reason
Reverted, naming the field managers that changed the vLLM args), one Warning event PromotionReverted, the
kvcal_promotion_reverted metric, Ready False, and Argo CD's health Degraded (argocd/health.lua). When the baseline
serves the checkpoint again (the fields restored, or the promotion committed to Git), Promoted turns True again.
"""

import json

from kvcal import vllm_flags
from kvcal.core.artifact.record import checkpoint as recorded_checkpoint
from kvcal.core.manifests import FIELD_MANAGER, BaselineError, Manifest
from kvcal.core.manifests.canary import (
    PROMOTED_ANNOTATION,
    baseline_container_index,
    promotion_marker,
    served_model,
)
from kvcal.core.manifests.common import locate
from kvcal.core.rollout.serving import WATCH_SECONDS
from kvcal.core.status.builder import Builder
from kvcal.core.status.conditions import get_condition
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import KVCalibrationStatus

REVERTED = "Reverted"
UNQUANTIZED_KV = ("", "auto")


def is_reverted(status: KVCalibrationStatus) -> bool:
    promoted = get_condition(status.conditions, "Promoted")
    return promoted is not None and promoted.status == "False" and promoted.reason == REVERTED


def serves_checkpoint(container: Manifest, checkpoint_path: str) -> bool:
    """The container serves `checkpoint_path` with an FP8 KV cache (any --kv-cache-dtype but auto)."""
    argv = [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
    kv_dtype = vllm_flags.find(argv, vllm_flags.KV_CACHE_DTYPE)
    return served_model(container) == checkpoint_path and kv_dtype is not None and kv_dtype.value not in UNQUANTIZED_KV


def args_managers(baseline: Manifest, container: str) -> list[str]:
    """The field managers (managedFields) that own the container's args, kvcal left out: who changed them."""
    key = "k:" + json.dumps({"name": container}, separators=(",", ":"))
    owners = []
    for entry in baseline.get("metadata", {}).get("managedFields") or []:
        fields = entry.get("fieldsV1") or {}
        for step in ("f:spec", "f:template", "f:spec", "f:containers", key):
            fields = fields.get(step) or {}
        if "f:args" in fields and entry.get("manager") != FIELD_MANAGER:
            owners.append(f"{entry.get('manager')} ({entry.get('operation')})")
    return owners


def watch_promotion(draft: Builder, spec: KVCalibrationSpec) -> bool:
    """In Succeeded: report a reverted promotion (see the module docstring). False while it is reverted, so the
    serving re-verification (core.rollout.serving) waits: nothing of this calibration runs there."""
    baseline, recorded_hash = draft.obs.baseline, draft.status.calibration.spec_hash
    if baseline is None or recorded_hash is None:
        return True
    annotations = baseline.manifest.get("metadata", {}).get("annotations") or {}
    if annotations.get(PROMOTED_ANNOTATION) not in (None, promotion_marker(draft.obs.owner, recorded_hash)):
        return True  # another calibration was promoted into it since: superseded, not reverted
    output = recorded_checkpoint(draft.status, spec.calibration.output)
    checkpoint = locate(output, field="status.calibration.artifact").path
    container_name = spec.serving.baseline.container or ""
    try:
        pod = baseline.manifest["spec"]["template"]["spec"]
        container = pod["containers"][baseline_container_index(baseline.manifest, spec.serving.baseline.container)]
        container_name = container["name"]
        serving = serves_checkpoint(container, checkpoint)
    except BaselineError:
        serving = False  # the container or its model is gone: not what was promoted
    name = spec.serving.baseline.deployment
    if serving:
        if is_reverted(draft.status):
            message = f"{name} serves the calibrated checkpoint with FP8 KV again"
            draft.condition("Promoted", "True", "Restored", message)
            draft.event("Normal", "PromotionRestored", message)
            draft.update(message=message)
        return True
    who = ", ".join(args_managers(baseline.manifest, container_name)) or "another field manager"
    message = (
        f"the baseline {name} no longer serves the calibrated checkpoint {checkpoint} with FP8 KV: its vLLM args "
        f"were changed by {who}. kvcal does not promote again by itself; to keep a promotion under Argo CD, set "
        f"ignoreDifferences managedFieldsManagers [{FIELD_MANAGER}] with RespectIgnoreDifferences=true "
        f"(docs/operations.md), then `kvcal recalibrate {draft.obs.owner.name}`"
    )
    if not is_reverted(draft.status):
        draft.event("Warning", "PromotionReverted", message)
    draft.condition("Promoted", "False", REVERTED, message)
    draft.update(message=message)
    draft.requeue = WATCH_SECONDS  # the baseline's own watch events wake the operator sooner (handlers.operator)
    return False
