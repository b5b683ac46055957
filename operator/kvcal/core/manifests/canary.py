"""The canary workload (of the baseline's kind) and Service, derived from the baseline (core.manifests.promotion rolls
the baseline).

The canary is the baseline's pod template with one change: the vLLM container serves the calibrated checkpoint with
FP8 KV. Image, resources, volumes, probes, tensor-parallel flags stay the same, so the comparison measures the KV
cache change and nothing else. The served model name is pinned to the baseline's, so clients behind the shared
Service see one model. Its pods carry the baseline's labels only under `router: replicas` (the Service splits by pod
count); under the other routers they leave out the baseline Service's selector keys (labels_kept_off_canary).
"""

import copy

from kvcal import vllm_flags
from kvcal.core.manifests.common import (
    LABEL_ROLE,
    Manifest,
    Owner,
    canary_name,
    container_security_context,
    metadata,
    service_in_front_of,
    volumes_and_mounts,
)
from kvcal.core.manifests.endpoints import canary_pod_labels
from kvcal.core.manifests.jobs import checkpoint_location
from kvcal.core.manifests.protected import skip_layer_args
from kvcal.core.manifests.traffic import canary_behind_baseline_service
from kvcal.core.manifests.workload import API_VERSION, canary_workload_fields
from kvcal.models.spec import KVCalibrationSpec, Router

PROMOTED_ANNOTATION = "kvcal.dev/promoted-from"
CHECKPOINT_ANNOTATION = "kvcal.dev/checkpoint"
# Baseline flags that would override or contradict the calibrated scales, in any spelling vLLM accepts.
_DROPPED_FLAGS = (vllm_flags.KV_CACHE_DTYPE, vllm_flags.CALCULATE_KV_SCALES, vllm_flags.KV_CACHE_DTYPE_SKIP_LAYERS)


class BaselineError(ValueError):
    """The baseline workload cannot be turned into a canary (names the field and the fix)."""


def baseline_container_index(deployment: Manifest, container: str | None) -> int:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    if not containers:
        raise BaselineError("the baseline's pod template has no containers: nothing serves vLLM there")
    if container is None:
        return 0
    for i, c in enumerate(containers):
        if c["name"] == container:
            return i
    names = ", ".join(c["name"] for c in containers)
    raise BaselineError(f"spec.serving.baseline.container: no container {container!r} in the baseline (has: {names})")


def _replace_model(command: list[str], args: list[str], checkpoint: str) -> tuple[list[str], list[str], str]:
    """Point vLLM at `checkpoint`: `--model X`, `--model=X`, or `vllm serve X` (X in command or args)."""
    found = vllm_flags.find(args, vllm_flags.MODEL)
    if found is not None:
        new_args = list(args)
        if found.inline:
            new_args[found.index] = f"--model={checkpoint}"
        else:
            new_args[found.index + 1] = checkpoint
        return command, new_args, found.value
    argv = command + args
    if "serve" in argv:
        i = argv.index("serve") + 1
        if i < len(argv) and not argv[i].startswith("-"):
            old = argv[i]
            new_command, new_args = list(command), list(args)
            if i < len(command):
                new_command[i] = checkpoint
            else:
                new_args[i - len(command)] = checkpoint
            return new_command, new_args, old
    raise BaselineError(
        "spec.serving.baseline: cannot find the model in the baseline container's command/args; "
        "pass it as `--model PATH` or `vllm serve PATH`"
    )


def served_model(container: Manifest) -> str:
    """The model a vLLM container serves (`--model X` or `vllm serve X`); BaselineError when it names none."""
    return _replace_model(list(container.get("command") or []), list(container.get("args") or []), "")[2]


def fp8_container(container: Manifest, spec: KVCalibrationSpec, checkpoint: str, mounts: list[Manifest]) -> Manifest:
    """The vLLM container rolled to the calibrated checkpoint with FP8 KV."""
    out = copy.deepcopy(container)
    command, args, old_model = _replace_model(list(out.get("command") or []), list(out.get("args") or []), checkpoint)
    command, args = vllm_flags.without(command, _DROPPED_FLAGS), vllm_flags.without(args, _DROPPED_FLAGS)
    if vllm_flags.find(command + args, vllm_flags.SERVED_MODEL_NAME) is None:
        args += ["--served-model-name", old_model]
    args += ["--kv-cache-dtype", spec.serving.canary.kv_cache_dtype, *skip_layer_args(spec)]
    backend = spec.serving.canary.attention_backend
    if backend:
        args = [*vllm_flags.without(args, [vllm_flags.ATTENTION_BACKEND]), "--attention-backend", backend]
    args += spec.serving.canary.extra_args
    if command:
        out["command"] = command
    out["args"] = args
    existing = {m["name"] for m in out.get("volumeMounts") or []}
    out["volumeMounts"] = [*(out.get("volumeMounts") or []), *(m for m in mounts if m["name"] not in existing)]
    return out


def fp8_pod_spec(baseline: Manifest, spec: KVCalibrationSpec) -> Manifest:
    pod: Manifest = copy.deepcopy(baseline["spec"]["template"]["spec"])
    checkpoint = checkpoint_location(spec)
    volumes, mounts = volumes_and_mounts([(checkpoint, False)])
    index = baseline_container_index(baseline, spec.serving.baseline.container)
    pod["containers"][index] = fp8_container(pod["containers"][index], spec, checkpoint.path, mounts)
    _harden(pod, index)
    existing = {v["name"] for v in pod.get("volumes") or []}
    pod["volumes"] = [*(pod.get("volumes") or []), *(v for v in volumes if v["name"] not in existing)]
    return pod


def _harden(pod: Manifest, index: int) -> None:
    """Where the baseline sets no securityContext, the canary (and so the promoted baseline) gets one that takes
    nothing vLLM uses: no privilege escalation, no capabilities, the runtime's seccomp profile. A baseline's own
    securityContext is kept as is. No non-root user is forced: the vLLM image runs as root unless the baseline says
    otherwise, and the canary must start wherever the baseline does (docs/security.md)."""
    if not pod.get("securityContext"):
        pod["securityContext"] = {"seccompProfile": {"type": "RuntimeDefault"}}
    container = pod["containers"][index]
    if not container.get("securityContext"):
        container["securityContext"] = container_security_context()


def canary_selector_labels(owner: Owner) -> dict[str, str]:
    return canary_pod_labels(owner.name)


def labels_kept_off_canary(
    router: Router, baseline_service: Manifest | None, baseline_pool_keys: frozenset[str] = frozenset()
) -> frozenset[str]:
    """The baseline pod labels the canary's pods leave out: none under `replicas` (the baseline Service's selector
    must match them: traffic splits by pod count), else the baseline Service's selector keys, so that the Service
    never sends the canary a request (core.manifests.traffic.canary_behind_baseline_service), and under `inference-pool`
    the baseline InferencePool's matchLabels keys too (`baseline_pool_keys`), so that the baseline pool never picks a
    canary pod. kvcal's own labels stay."""
    if canary_behind_baseline_service(router):
        return frozenset()
    if baseline_service is None:
        raise ValueError("the baseline Service is needed to keep its selector off the canary's pods")
    return frozenset((baseline_service.get("spec") or {}).get("selector") or {}) | baseline_pool_keys


def _selector_without(selector: Manifest, dropped: frozenset[str]) -> Manifest:
    out: Manifest = copy.deepcopy(selector)
    out["matchLabels"] = {k: v for k, v in (out.get("matchLabels") or {}).items() if k not in dropped}
    expressions = [e for e in out.get("matchExpressions") or [] if e.get("key") not in dropped]
    if expressions:
        out["matchExpressions"] = expressions
    else:
        out.pop("matchExpressions", None)
    return out


def build_canary_workload(
    owner: Owner,
    spec: KVCalibrationSpec,
    baseline: Manifest,
    replicas: int,
    baseline_service: Manifest | None = None,
    baseline_pool_keys: frozenset[str] = frozenset(),
) -> Manifest:
    """The baseline's pod template serving the calibrated checkpoint, in a workload of the baseline's kind; pods keep
    the baseline's labels plus role=canary, but for the baseline Service's (and InferencePool's) selector keys under
    every router but `replicas` (labels_kept_off_canary): only `replicas` splits traffic through the baseline
    Service."""
    template = baseline["spec"]["template"]
    dropped = labels_kept_off_canary(spec.serving.traffic.router, baseline_service, baseline_pool_keys)
    selector = _selector_without(baseline["spec"]["selector"], dropped)
    selector["matchLabels"] = {**selector["matchLabels"], **canary_selector_labels(owner)}
    baseline_labels = template.get("metadata", {}).get("labels", {})
    pod_labels = {**{k: v for k, v in baseline_labels.items() if k not in dropped}, **canary_selector_labels(owner)}
    pod_meta: Manifest = {"labels": pod_labels}
    if template.get("metadata", {}).get("annotations"):
        pod_meta["annotations"] = dict(template["metadata"]["annotations"])
    kind = spec.serving.baseline.kind
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": metadata(owner, canary_name(owner.name), "canary", {LABEL_ROLE: "canary"}),
        "spec": {
            "replicas": replicas,
            "selector": selector,
            "template": {"metadata": pod_meta, "spec": fp8_pod_spec(baseline, spec)},
            **canary_workload_fields(kind, baseline),
        },
    }


def keep_existing_selector(canary: Manifest, existing: Manifest) -> Manifest:
    """`canary` with the selector and pod labels of the canary already running: a workload's selector is immutable,
    so a canary created by an older kvcal (whose pods kept every baseline label) keeps its labels until it is
    re-created (the next calibration run), instead of failing every apply."""
    old_selector = (existing.get("spec") or {}).get("selector")
    if not old_selector or old_selector == canary["spec"]["selector"]:
        return canary
    out = copy.deepcopy(canary)
    out["spec"]["selector"] = copy.deepcopy(old_selector)
    old_labels = (((existing["spec"].get("template") or {}).get("metadata") or {}).get("labels")) or {}
    out["spec"]["template"]["metadata"]["labels"] = dict(old_labels)
    return out


def build_canary_service(owner: Owner, baseline_service: Manifest) -> Manifest:
    """A Service selecting only the canary pods (by kvcal's labels, which every router's canary carries): the target
    of Gateway API backendRefs."""
    meta = metadata(owner, canary_name(owner.name), "canary", {LABEL_ROLE: "canary"})
    return service_in_front_of(meta, canary_selector_labels(owner), baseline_service)


def promotion_marker(owner: Owner, spec_hash: str) -> str:
    """The value of PROMOTED_ANNOTATION once this calibration's promotion patch is applied (the patch sets the
    annotation and the template atomically, so the marker proves the template was rolled)."""
    return f"{owner.namespace}/{owner.name}@{spec_hash[:8]}"


def is_promoted(baseline: Manifest, owner: Owner, spec_hash: str) -> bool:
    annotations = baseline.get("metadata", {}).get("annotations") or {}
    return bool(annotations.get(PROMOTED_ANNOTATION) == promotion_marker(owner, spec_hash))
