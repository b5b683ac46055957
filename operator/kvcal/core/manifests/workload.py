"""What differs between the workload kinds a baseline may be (spec.serving.baseline.kind), in one place.

Both kinds are apps/v1 and share `replicas`, `selector` and `template`: the canary copies the baseline's template
(core.manifests.canary) and promotion applies the same template fields (core.manifests.promotion) whatever the kind.
The rest is the kind's own:

- **Deployment.** The canary copies the baseline's `strategy`. Promotion keeps the baseline's own way of rolling
  where it has spare room: a rolling update with surge becomes one that never drops below the ready replicas
  (maxUnavailable 0, the baseline's maxSurge). Where it has none, the promotion names no strategy and the baseline
  rolls as its owner set it: `Recreate`, or a rolling update with maxSurge 0 (common where GPUs are tight; there
  maxUnavailable 0 would be refused by the API server, and a surge would need GPUs the cluster lacks).
- **StatefulSet.** The canary copies `serviceName`, `podManagementPolicy`, `minReadySeconds` and
  `volumeClaimTemplates` (a template that mounts a claim template's volume needs it), but not `updateStrategy`: the
  canary is kvcal's, and its pods always follow its template (an OnDelete canary would keep an outdated one). Its pods
  are `CANARY-0..N`, so under the baseline's governing Service their DNS names never collide with the baseline's
  (`NAME-0..N`). Its claims are deleted with it and on scale-down (`persistentVolumeClaimRetentionPolicy` Delete): a
  canary leaves no storage behind. Promotion applies `updateStrategy` RollingUpdate with partition 0, so every pod
  rolls (an OnDelete baseline would never roll, a partition would stop half way). A StatefulSet replaces a pod by
  deleting it first: one baseline pod is down at a time while the promotion rolls (it has no surge).
"""

import copy

from kvcal.core.manifests.common import Manifest
from kvcal.models.spec import WorkloadKind

API_VERSION = "apps/v1"
# kubectl's short resource names, for the commands messages suggest.
SHORT_NAMES: dict[WorkloadKind, str] = {"Deployment": "deploy", "StatefulSet": "sts"}
_STATEFULSET_COPIED = ("serviceName", "podManagementPolicy", "minReadySeconds")
_CANARY_CLAIMS_DELETED = {"whenDeleted": "Delete", "whenScaled": "Delete"}


def canary_workload_fields(kind: WorkloadKind, baseline: Manifest) -> Manifest:
    """The canary's spec fields of its kind, beside replicas, selector and template (see the module docstring)."""
    source = baseline["spec"]
    if kind == "Deployment":
        return {"strategy": copy.deepcopy(source["strategy"])} if "strategy" in source else {}
    fields: Manifest = {key: copy.deepcopy(source[key]) for key in _STATEFULSET_COPIED if key in source}
    if source.get("volumeClaimTemplates"):
        fields["volumeClaimTemplates"] = [_claim_template(claim) for claim in source["volumeClaimTemplates"]]
        fields["persistentVolumeClaimRetentionPolicy"] = dict(_CANARY_CLAIMS_DELETED)
    return fields


def _claim_template(claim: Manifest) -> Manifest:
    """A claim template as a create takes it: its name, labels, annotations and spec (no status)."""
    meta = claim.get("metadata") or {}
    kept = {key: copy.deepcopy(meta[key]) for key in ("name", "labels", "annotations") if key in meta}
    return {"metadata": kept, "spec": copy.deepcopy(claim.get("spec") or {})}


def promotion_rollout_fields(kind: WorkloadKind, baseline: Manifest) -> Manifest:
    """The rollout fields the promotion applies beside the template (see the module docstring)."""
    if kind == "StatefulSet":
        return {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}}
    strategy = baseline["spec"].get("strategy") or {}
    surge = (strategy.get("rollingUpdate") or {}).get("maxSurge", 1)
    if strategy.get("type") == "Recreate" or _is_zero(surge):
        return {}
    return {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": surge}}}


def _is_zero(value: object) -> bool:
    """An int-or-string that means no pod: 0, "0" or "0%"."""
    return str(value).strip().removesuffix("%") in ("0", "")
