"""KVCalibration.spec, the source of the CRD's spec schema (kvcal.models.crd generates crds/ from it): types,
descriptions, defaults and bounds are the fields'; each CEL rule sits beside the validator that is its Python twin
(tests/integration/test_spec_parity.py sends a table of objects through the API server and the model)."""

import re
from itertools import pairwise
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidatorFunctionWrapHandler, field_validator, model_validator
from pydantic.config import JsonDict
from pydantic_core import PydanticCustomError

from kvcal import vllm_flags
from kvcal.models.base import Model
from kvcal.models.markers import cel, kube

# The CRD's patterns (OpenAPI `pattern` and CEL `matches`), one constant each.
DURATION_PATTERN = r"^([0-9]+h)?([0-9]+m)?([0-9]+s)?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
DNS_LABEL_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# Storage URIs: only schemes kvcal mounts into its pods (kvcal.core.manifests.common.SCHEMES); no object stores.
CHECKPOINT_PATTERN = r"^(pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/.*)?|hostpath:///.+)$"
DATASET_PATTERN = (
    r"^(configmap://[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[-._a-zA-Z0-9]+|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/.+"
    r"|hostpath:///.+)$"
)
# The CRD's messages for those patterns, word for word: the field, the forms accepted and the fix.
NO_OBJECT_STORES = "object stores (s3://) are not supported"
MODEL_SOURCE_MESSAGE = (
    f"spec.model.source must be pvc://CLAIM/PATH or hostpath:///ABS/PATH; {NO_OBJECT_STORES}: copy the checkpoint "
    "to a PVC"
)
DATASET_SOURCE_MESSAGE = (
    "spec.calibration.dataset.source must be configmap://NAME/KEY, pvc://CLAIM/PATH or hostpath:///ABS/PATH (a "
    f"file, not a directory); {NO_OBJECT_STORES}: copy the file to a PVC or a ConfigMap"
)
OUTPUT_MESSAGE = (
    f"spec.calibration.output must be pvc://CLAIM/PATH or hostpath:///ABS/PATH; {NO_OBJECT_STORES}: write to a "
    "PVC and copy it to the object store from there"
)
PROMETHEUS_URL_PATTERN = r"^https?://[^\s/]+(/\S*)?$"
ATTENTION_BACKEND_PATTERN = r"^[A-Z][A-Z0-9_]*$"
MIN_INTERVAL_SECONDS = 1.0
MIN_LOOKBACK_SECONDS = 600.0
MAX_LAYER_INDEX = 4095
MAX_PROTECTED_LAYERS = 256
_DURATION = re.compile(DURATION_PATTERN)

# Observer names as the CRD spells them -> llm-compressor's names.
OBSERVERS: dict[str, str] = {"static-minmax": "static_minmax", "minmax": "minmax", "mse": "mse"}
# Attention backends of vLLM that honour per-KV-head scales.
PER_HEAD_BACKENDS = frozenset({"FLASH_ATTN"})


def parse_duration(value: str) -> float:
    """'90s', '2m', '1h30m' -> seconds. Raises ValueError naming the accepted form."""
    match = _DURATION.match(value.strip())
    if not value.strip() or match is None or not any(match.groups()):
        raise ValueError(f"invalid duration {value!r}: use e.g. '30s', '2m', '1h30m'")
    hours, minutes, seconds = (int(group[:-1]) if group else 0 for group in match.groups())  # "90s" -> 90
    return float(hours * 3600 + minutes * 60 + seconds)


def path_segments(location: str) -> list[str]:
    """`location` split on `/` with '' and '.' dropped, as the CRD's CEL compares paths: pvc://m/llama/,
    pvc://m//llama and pvc://m/./llama are all pvc://m/llama."""
    return [segment for segment in location.split("/") if segment not in ("", ".")]


def no_dotdot_message(field: str) -> str:
    return f"{field} must not contain '..' path segments; name the path directly"


def storage_rules(pattern: str, message: str, field: str) -> JsonDict:
    """The CEL twin of storage_location: the pattern as a rule (so the API server answers with `message`, not the
    regex), then no `..` segment."""
    return kube(
        cel(f"self.matches('{pattern}')", message),
        cel("!self.split('/').exists(s, s == '..')", no_dotdot_message(field)),
    )


def storage_location(value: Any, validate: ValidatorFunctionWrapHandler, pattern: str, message: str, field: str) -> str:
    """A storage URI field, checked in the CRD's order: `self.matches(PATTERN)` with its message (pydantic's own
    would quote the regex, not the fix), then the field's type and bounds (`validate`), then
    `!self.split('/').exists(s, s == '..')`: a `..` segment is refused, a name like `a..b` is not."""
    if isinstance(value, str) and re.fullmatch(pattern, value) is None:
        raise ValueError(message)
    location: str = validate(value)
    if ".." in location.split("/"):
        raise ValueError(no_dotdot_message(field))
    return location


class SpecModel(Model):
    """Typed as strictly as the API server: no "5" for 5, no 5.0 for an integer."""

    model_config = ConfigDict(strict=True)

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        # The API server prunes null values of non-nullable fields before defaulting; so does the model.
        return {key: value for key, value in data.items() if value is not None} if isinstance(data, dict) else data


class ModelRef(SpecModel):
    source: str = Field(
        max_length=1024,
        json_schema_extra=storage_rules(CHECKPOINT_PATTERN, MODEL_SOURCE_MESSAGE, "spec.model.source"),
        description=(
            "Where the BF16 checkpoint lives: pvc://CLAIM/PATH or hostpath:///ABS/PATH, mounted read-only into "
            "the calibration Job. Object stores (s3://) are not supported: copy the checkpoint to a PVC."
        ),
    )
    revision: str | None = Field(
        default=None,
        max_length=256,
        description=(
            "Revision (commit sha or tag) of the checkpoint, recorded in the calibration report's provenance and "
            "in status.calibration beside the weights' sha256."
        ),
    )

    @field_validator("source", mode="wrap")
    @classmethod
    def _location(cls, source: Any, validate: ValidatorFunctionWrapHandler) -> str:
        return storage_location(source, validate, CHECKPOINT_PATTERN, MODEL_SOURCE_MESSAGE, "spec.model.source")


class Dataset(SpecModel):
    source: str = Field(
        max_length=1024,
        json_schema_extra=storage_rules(DATASET_PATTERN, DATASET_SOURCE_MESSAGE, "spec.calibration.dataset.source"),
        description=(
            "The JSONL file: configmap://NAME/KEY, pvc://CLAIM/PATH or hostpath:///ABS/PATH. Object stores "
            "(s3://) are not supported."
        ),
    )
    format: Literal["chat", "text"] = Field(
        default="chat",
        description=(
            'chat: lines are {"messages": [...]} rendered with the model\'s chat template; text: lines are '
            '{"text": "..."} used as is.'
        ),
    )

    @field_validator("source", mode="wrap")
    @classmethod
    def _location(cls, source: Any, validate: ValidatorFunctionWrapHandler) -> str:
        path = "spec.calibration.dataset.source"
        return storage_location(source, validate, DATASET_PATTERN, DATASET_SOURCE_MESSAGE, path)


class ResourceRequirements(SpecModel):
    limits: dict[str, str] | None = Field(
        default=None, description='Maximum resources, e.g. nvidia.com/gpu "1", memory "32Gi".'
    )
    requests: dict[str, str] | None = Field(
        default=None, description='Requested resources, e.g. cpu "4", memory "32Gi".'
    )


class Toleration(SpecModel):
    key: str | None = Field(default=None, description="Taint key the toleration applies to.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal (default Equal).")
    value: str | None = Field(default=None, description="Taint value matched with operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all."
    )
    toleration_seconds: int | None = Field(default=None, description="How long a NoExecute taint is tolerated.")


class JobSpec(SpecModel):
    image: str | None = Field(
        default=None,
        max_length=512,
        description="Calibrator image; default the operator's configured calibrator image.",
    )
    resources: ResourceRequirements | None = Field(
        default=None, description='Container resources (limits/requests of quantity strings, e.g. "1", "16Gi").'
    )
    node_selector: dict[str, str] | None = Field(
        default=None, description="Node labels the calibration pod must match."
    )
    tolerations: list[Toleration] | None = Field(
        default=None, description="Tolerations of the calibration pod (core/v1 Toleration)."
    )
    active_deadline_seconds: int = Field(
        default=3600, ge=1, description="The calibration Job fails after this many seconds."
    )
    backoff_limit: int = Field(
        default=1, ge=0, le=10, description="Retries of the calibration pod before the Job fails."
    )


HOLDOUT_RANGE = "spec.calibration.holdoutFraction must be in (0, 0.5], e.g. 0.1"


class CalibrationSpec(SpecModel):
    dataset: Dataset = Field(description="Calibration prompts, one JSON object per line (JSONL).")
    samples: int = Field(
        default=512, ge=1, le=65536, description="Number of calibration prompts (before the holdout split)."
    )
    max_seq_length: int = Field(
        default=4096, ge=16, le=1048576, description="Prompts are truncated to this many tokens."
    )
    holdout_fraction: float = Field(
        default=0.1,
        json_schema_extra=kube(cel("self > 0.0 && self <= 0.5", HOLDOUT_RANGE)),
        description=(
            "Share of the prompts used that is held out to measure clipping and top-1 agreement, in (0, 0.5]: a "
            "seeded split holds out this fraction of the dataset, and the report scores ceil(samples x f / (1 - "
            "f)) of them (57 beside 512 samples at 0.1), so its cost follows the calibration, not the dataset's "
            "size."
        ),
    )
    seed: int = Field(default=0, ge=0, description="Seed of the shuffle that picks samples and the holdout split.")
    strategy: Literal["tensor", "head"] = Field(
        default="tensor",
        description=(
            "tensor: one k_scale/v_scale per layer (every vLLM backend); head: one per KV head (needs vLLM's "
            "FLASH_ATTN backend, spec.serving.canary.attentionBackend)."
        ),
    )
    observer: Literal["static-minmax", "minmax", "mse"] = Field(
        default="static-minmax",
        description=(
            "llm-compressor observer. static-minmax tracks the true max|K|,|V| (recommended); minmax is a moving "
            "average that undershoots and clips; mse searches a clipping range."
        ),
    )
    pipeline: Literal["auto", "basic", "sequential"] = Field(
        default="auto",
        description=(
            "llm-compressor pipeline, where its oneshot runs. auto (basic): kvcal's placement already spreads a "
            "model over the pod's GPUs or onloads it layer by layer when it fits none; sequential runs every "
            "sample through one layer before onloading the next."
        ),
    )
    query_scales: bool = Field(
        default=False,
        description=(
            "Also calibrate q_scale (llm-compressor's attention scheme). vLLM quantizes Q only on FP8 attention "
            "backends (FlashAttention 3, FlashInfer); without q_scale it reuses k_scale."
        ),
    )
    output: str = Field(
        max_length=1024,
        json_schema_extra=storage_rules(CHECKPOINT_PATTERN, OUTPUT_MESSAGE, "spec.calibration.output"),
        description=(
            "Where the calibrated checkpoint is written: pvc://CLAIM/PATH or hostpath:///ABS/PATH, a folder the "
            "canary and the promoted baseline then mount. Must differ from spec.model.source. Object stores "
            "(s3://) are not supported."
        ),
    )
    job: JobSpec = Field(default=JobSpec(), description="The calibration Job's pod settings.")

    @field_validator("holdout_fraction")
    @classmethod
    def _holdout_range(cls, fraction: float) -> float:
        if not 0 < fraction <= 0.5:
            raise ValueError(HOLDOUT_RANGE)
        return fraction

    @field_validator("output", mode="wrap")
    @classmethod
    def _location(cls, output: Any, validate: ValidatorFunctionWrapHandler) -> str:
        return storage_location(output, validate, CHECKPOINT_PATTERN, OUTPUT_MESSAGE, "spec.calibration.output")


# The workload kinds a baseline may be (core.manifests.workload maps each to its API group and rollout fields).
WorkloadKind = Literal["Deployment", "StatefulSet"]


class BaselineRef(SpecModel):
    # The name of the baseline workload, of `kind`; called `deployment` since Deployments came first, so every spec
    # written before `kind` existed keeps its meaning.
    deployment: str = Field(
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description=(
            "Name of the baseline vLLM workload in this namespace, of `kind` (named `deployment` for "
            "compatibility: a spec without `kind` names a Deployment)."
        ),
    )
    kind: WorkloadKind = Field(
        default="Deployment",
        description=(
            "Kind of the baseline workload (apps/v1). The canary is a workload of the same kind with the "
            "baseline's pod template, and promotion rolls the baseline by server-side apply."
        ),
    )
    service: str = Field(
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
        description="Name of the Service in front of the baseline (the canary joins it).",
    )
    container: str | None = Field(
        default=None, max_length=63, description="Container running vLLM; default the first one."
    )

    @property
    def workload(self) -> str:
        """'Deployment NAME' or 'StatefulSet NAME', as messages name the baseline."""
        return f"{self.kind} {self.deployment}"


class ProtectedLayers(SpecModel):
    """Attention layers whose KV cache stays in BF16 (vLLM's --kv-cache-dtype-skip-layers)."""

    layers: list[Annotated[int, Field(ge=0, le=MAX_LAYER_INDEX)]] = Field(
        default=[],
        max_length=MAX_PROTECTED_LAYERS,
        json_schema_extra=kube(list_type="set"),  # the API server's twin of _distinct
        description="Layer indices (0-based), e.g. [0, 31].",
    )
    from_report: bool = Field(
        default=False,
        description=(
            "Also protect the calibration report's sensitive layers (lowest held-out SQNR; "
            "status.calibration.sensitiveLayers)."
        ),
    )

    @field_validator("layers")
    @classmethod
    def _distinct(cls, layers: list[int]) -> list[int]:
        if len(set(layers)) != len(layers):
            raise ValueError("spec.serving.canary.protectedLayers.layers must not repeat a layer")
        return layers


class SchedulingSpec(SpecModel):
    """What kvcal does when the scheduler cannot place the canary's pods (e.g. no Node has a free GPU)."""

    timeout: str = Field(
        default="5m",
        min_length=2,
        max_length=16,
        pattern=DURATION_PATTERN,
        description=(
            "How long canary pods may stay unschedulable before onTimeout applies, e.g. 5m (0s: at once). They are "
            "reported at once either way: CanaryReady False with reason Unschedulable and a Warning event that "
            "quote the scheduler (the resource no Node had free, e.g. nvidia.com/gpu)."
        ),
    )
    on_timeout: Literal["rollback", "wait"] = Field(
        default="rollback",
        description=(
            "rollback rolls back with reason CanaryUnschedulable (the baseline untouched); wait keeps waiting for "
            "capacity (a Node added or freed), past the Deployment's progress deadline too."
        ),
    )

    @property
    def timeout_seconds(self) -> float:
        return parse_duration(self.timeout)


# Admission's share of _no_owned_flags (vllm_flags builds both from its list of owned flags).
EXTRA_ARG_RULES = [cel(rule["rule"], rule["message"]) for rule in vllm_flags.admission_item_rules()]
EXTRA_ARGS_START_WITH_A_FLAG = (
    "spec.serving.canary.extraArgs must start with a flag: a bare value there would become vLLM's positional model "
    "argument"
)


class CanarySpec(SpecModel):
    replicas: int = Field(
        default=1,
        ge=1,
        le=100,
        description=(
            "The fewest canary pods under router gateway-api, inference-pool or none (the step's share may ask "
            "for more): several canary pods average out each pod's own noise, so the latency verdict decides "
            "sooner. Refused above 1 with router replicas, where each step's weight sets the canary's pod count."
        ),
    )
    kv_cache_dtype: Literal["fp8", "fp8_e4m3"] = Field(
        default="fp8_e4m3", description="vLLM --kv-cache-dtype of the canary."
    )
    attention_backend: str | None = Field(
        default=None,
        max_length=64,
        pattern=ATTENTION_BACKEND_PATTERN,
        description=(
            "vLLM attention backend, e.g. FLASH_ATTN, passed as --attention-backend (replacing any the baseline "
            "sets) to the canary, the verification Job and the promoted baseline; required with "
            "spec.calibration.strategy head."
        ),
    )
    protected_layers: ProtectedLayers = Field(
        default=ProtectedLayers(),
        description=(
            "Attention layers whose KV cache stays in BF16 (vLLM --kv-cache-dtype-skip-layers) on the canary and "
            "the promoted baseline; the verification Job checks vLLM keeps them in BF16."
        ),
    )
    capacity: Literal["surge", "fromBaseline"] = Field(
        default="surge",
        description=(
            "Where the canary's pods (and their GPUs) come from. surge: beside the baseline, which keeps all its "
            "pods (a rollback is instant; the cluster needs room for the canary). fromBaseline: the baseline is "
            "scaled down by the canary's pods first, so the pod and GPU count never grows (for clusters without "
            "spare GPUs); its replicas are restored on rollback, promotion and delete (a rollback then waits for "
            "vLLM pods to start). Needs 2+ baseline pods and no HorizontalPodAutoscaler on the baseline."
        ),
    )
    scheduling: SchedulingSpec = Field(
        default=SchedulingSpec(),
        description=(
            "Canary pods the scheduler cannot place (GPUs full): how long to wait, then roll back or keep waiting."
        ),
    )
    extra_args: list[Annotated[str, Field(max_length=1024, json_schema_extra=kube(*EXTRA_ARG_RULES))]] = Field(
        default=[],
        max_length=64,
        json_schema_extra=kube(cel(vllm_flags.admission_list_rule(), EXTRA_ARGS_START_WITH_A_FLAG)),
        description=(
            "Extra vLLM arguments appended to the baseline's, on the canary and, promoted, on the baseline. Only "
            "the flags the operator's chart value policy.vllmFlags.allowed allows (default: tuning flags, "
            "docs/security.md), each value of the type vLLM declares; never the flags kvcal owns (model, "
            "checkpoint, KV dtype and scales, skip layers, attention backend, served name, host, port), in any "
            "spelling vLLM accepts."
        ),
    )

    @field_validator("extra_args")
    @classmethod
    def _no_owned_flags(cls, args: list[str]) -> list[str]:
        # The CRD's CEL rejects most of these at admission; this catches the rest (e.g. a positional after
        # --flag=value) and specs that never went through an API server.
        problems = [f"spec.serving.canary.extraArgs[{i}]: {why}" for i, why in vllm_flags.extra_args_problems(args)]
        if problems:
            raise PydanticCustomError("owned_vllm_flag", "{problems}", {"problems": "; ".join(problems)})
        return args


Router = Literal["replicas", "gateway-api", "inference-pool", "none"]
# The routers that set weights on an HTTPRoute (spec.serving.traffic.httpRoute), read them back and drain through it.
ROUTE_ROUTERS: frozenset[Router] = frozenset({"gateway-api", "inference-pool"})


# One message for the schema's CEL rule and the model (a Gateway API RequestMirror needs an HTTPRoute to carry it).
SHADOW_NEEDS_GATEWAY = (
    "spec.serving.traffic.shadow mirrors requests with the HTTPRoute's RequestMirror filter: it needs "
    "router: gateway-api (remove shadow, or route through an HTTPRoute)"
)


class ShadowSpec(SpecModel):
    """A first stage before any weight moves: the HTTPRoute mirrors ``percent`` of live requests to the canary
    (Gateway API RequestMirror; users only ever see the baseline's answers) for ``intervals`` passing analysis
    intervals."""

    percent: int = Field(
        default=100, ge=1, le=100, description="Percent of the route's requests mirrored to the canary."
    )
    intervals: int = Field(
        default=3,
        ge=1,
        le=50,
        description="Passing analysis intervals on mirrored load before the first weighted step.",
    )


STEPS_ARE_PERCENTAGES = "spec.serving.traffic.steps must each be a percentage in (0, 100], e.g. [10, 50]"
STEPS_INCREASE = "spec.serving.traffic.steps must be strictly increasing, e.g. [10, 50, 100]"
POOL_FOR_INFERENCE_POOL = (
    "spec.serving.traffic.inferencePool is required when router is inference-pool (name the baseline's "
    "InferencePool), and only then"
)


class TrafficSpec(SpecModel):
    model_config = ConfigDict(
        json_schema_extra=kube(
            cel(
                "has(self.httpRoute) || !has(self.router) || !(self.router in ['gateway-api', 'inference-pool'])",
                "spec.serving.traffic.httpRoute is required when router is gateway-api or inference-pool: name the "
                "HTTPRoute whose backend weights the operator sets",
                field_path=".httpRoute",
                reason="FieldValueRequired",
            ),
            cel(
                "has(self.inferencePool) == (has(self.router) && self.router == 'inference-pool')",
                POOL_FOR_INFERENCE_POOL,
                field_path=".inferencePool",
                reason="FieldValueInvalid",
            ),
            cel(
                "!has(self.shadow) || (has(self.router) && self.router == 'gateway-api')",
                SHADOW_NEEDS_GATEWAY,
                field_path=".shadow",
                reason="FieldValueForbidden",
            ),
        )
    )

    router: Router = Field(
        default="replicas",
        description=(
            "replicas: canary pods join the baseline Service, weight = replica ratio; gateway-api: the operator "
            "sets weights between the baseline and canary Services on spec.serving.traffic.httpRoute; "
            "inference-pool: the canary gets its own InferencePool (and endpoint picker) and the operator sets "
            "weights between the two pools on the HTTPRoute (allowed by the chart value rbac.inferencePool); "
            "none: probes only, no user traffic."
        ),
    )
    steps: list[int] = Field(
        default=[10, 50],
        min_length=1,
        max_length=10,
        json_schema_extra=kube(
            cel("self.all(s, s > 0 && s <= 100)", STEPS_ARE_PERCENTAGES),
            cel("self.isSorted() && self.all(s, self.exists_one(t, t == s))", STEPS_INCREASE),
        ),
        description=(
            "Canary traffic percentages, strictly increasing, each in (0, 100]; each step is analysed before the next."
        ),
    )
    http_route: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Gateway API HTTPRoute in this namespace (routers gateway-api, inference-pool).",
    )
    # router inference-pool: the baseline's InferencePool, a backendRef of the HTTPRoute (core.rollout.pool).
    inference_pool: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description=(
            "The baseline's InferencePool (inference.networking.k8s.io/v1) in this namespace, a backendRef of "
            "spec.serving.traffic.httpRoute (router inference-pool): the canary's pool copies its target ports "
            "and endpoint picker."
        ),
    )
    drain_delay: str = Field(
        default="30s",
        min_length=2,
        max_length=16,
        pattern=DURATION_PATTERN,
        description=(
            "On rollback, promotion and delete: once the router reports 0% on the canary, how long in-flight "
            "requests get before the canary is deleted (routers gateway-api, inference-pool), e.g. 30s."
        ),
    )
    shadow: ShadowSpec | None = Field(
        default=None,
        description=(
            "Off by default. A first stage before any weight moves (router gateway-api): the HTTPRoute mirrors "
            "percent of live requests to the canary (Gateway API RequestMirror; users only see the baseline's "
            "answers) and the latency analysis runs on the mirrored load for intervals passing intervals. The "
            "Gateway's class must list HTTPRouteRequestMirror (and, below 100%, HTTPRouteRequestPercentageMirror)"
            " in status.supportedFeatures, else the run is Blocked before the canary exists."
        ),
    )

    @field_validator("steps")
    @classmethod
    def _percentages_increasing(cls, steps: list[int]) -> list[int]:
        if any(not 0 < step <= 100 for step in steps):
            raise ValueError(STEPS_ARE_PERCENTAGES)
        if any(later <= earlier for earlier, later in pairwise(steps)):
            raise ValueError(STEPS_INCREASE)
        return steps

    @model_validator(mode="after")
    def _route_for_gateway(self) -> "TrafficSpec":
        if self.router in ROUTE_ROUTERS and self.http_route is None:
            raise ValueError(f"spec.serving.traffic.httpRoute is required when router is {self.router}")
        if (self.inference_pool is not None) != (self.router == "inference-pool"):
            raise ValueError(POOL_FOR_INFERENCE_POOL)
        if self.shadow is not None and self.router != "gateway-api":
            raise ValueError(SHADOW_NEEDS_GATEWAY)
        return self

    @property
    def routes(self) -> bool:
        """Weights are set on (and read back from) the HTTPRoute."""
        return self.router in ROUTE_ROUTERS

    @property
    def drain_delay_seconds(self) -> float:
        return parse_duration(self.drain_delay)


# One message for the schema's CEL rule and the model.
CANARY_REPLICAS_WITH_REPLICAS_ROUTER = (
    "spec.serving.canary.replicas: router replicas sets the canary's pod count from each step's weight (canary pods "
    "/ all pods); remove replicas, or route by weight with router gateway-api or inference-pool"
)


class ServingSpec(SpecModel):
    model_config = ConfigDict(
        json_schema_extra=kube(
            cel(
                "!has(self.canary) || !has(self.canary.replicas) || self.canary.replicas <= 1 || "
                "(has(self.traffic) && has(self.traffic.router) && self.traffic.router != 'replicas')",
                CANARY_REPLICAS_WITH_REPLICAS_ROUTER,
                field_path=".canary.replicas",
            )
        )
    )

    baseline: BaselineRef = Field(
        description=(
            "The existing vLLM workload (a Deployment or a StatefulSet) and Service that serve the BF16 model."
        )
    )
    canary: CanarySpec = Field(
        default=CanarySpec(), description="The canary Deployment running the calibrated checkpoint with FP8 KV cache."
    )
    traffic: TrafficSpec = Field(default=TrafficSpec(), description="How traffic moves to the canary, step by step.")

    @model_validator(mode="after")
    def _canary_replicas_by_weight(self) -> "ServingSpec":
        if self.canary.replicas > 1 and self.traffic.router == "replicas":
            raise ValueError(CANARY_REPLICAS_WITH_REPLICAS_ROUTER)
        return self


class PrometheusRef(SpecModel):
    # One of the Prometheus servers a cluster admin configured (chart values policy.prometheus.*), picked by name or by
    # its exact address; neither: the chart's default. Any other pick is refused (core.guard.policy): the author never
    # chooses what the operator fetches.
    name: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
        description="Name of a Prometheus configured in the chart's values, e.g. default.",
    )
    address: str | None = Field(
        default=None,
        max_length=1024,
        pattern=PROMETHEUS_URL_PATTERN,
        description=(
            "Exact address of a Prometheus configured in the chart's values (the operator then uses that entry's "
            "TLS and credentials), e.g. http://prometheus.monitoring:9090."
        ),
    )


# One message for the schema's CEL rule and the model.
ROLLBACK_ABOVE_MAX = (
    "spec.analysis.latency[].rollbackAbove must be at most maxRegression (a canary is rolled back above "
    "rollbackAbove and never promoted above maxRegression), e.g. rollbackAbove: 0.05 with maxRegression: 0.10"
)


# The default noise floor: a tenth or less of a GPU's inter-token latency (5-30 ms). The floor is promised to pass
# whatever the ratio, so 5 ms (the default before) promoted nearly every 15% slower ITL at 12 ms (docs/operations.md,
# "Tuning the analysis"): the very latency FP8 KV's decode attention moves.
NOISE_FLOOR_SECONDS = 0.0005


MAX_REGRESSION = 0.1
QUANTILE_RANGE = "spec.analysis.latency[].quantile must be in (0, 1), e.g. 0.95"


LatencyMetric = Literal["ttft", "itl", "e2e"]


class LatencyCheck(SpecModel):
    model_config = ConfigDict(
        json_schema_extra=kube(
            cel(
                "!has(self.rollbackAbove) || self.rollbackAbove <= "
                f"(has(self.maxRegression) ? self.maxRegression : {MAX_REGRESSION})",
                ROLLBACK_ABOVE_MAX,
                field_path=".rollbackAbove",
            )
        )
    )

    metric: LatencyMetric = Field(description="ttft time to first token, itl inter-token latency, e2e request latency.")
    test: Literal["rank", "quantile"] = Field(
        default="rank",
        description=(
            "rank: sequential Mann-Whitney test on each pod's histograms since the step began (rolls back above "
            "rollbackAbove, promotes only when confidently within maxRegression); quantile: this interval's "
            "canary quantile vs baseline x (1 + maxRegression)."
        ),
    )
    quantile: float = Field(
        default=0.95,
        json_schema_extra=kube(cel("self > 0.0 && self < 1.0", QUANTILE_RANGE)),
        description="Quantile compared (quantile test) or recorded for people (rank test), in (0, 1).",
    )
    max_regression: float = Field(
        default=MAX_REGRESSION,
        ge=0,
        le=10,
        description=(
            "The slowdown never to promote, e.g. 0.10 for +10%: the rank test promotes only a canary confidently "
            "within it; the quantile test's highest canary/baseline - 1 that passes."
        ),
    )
    rollback_above: float | None = Field(
        default=None,
        ge=0,
        le=10,
        description=(
            "rank test only: the slowdown that rolls back, when the canary is confidently slower than baseline x "
            "(1 + rollbackAbove); default maxRegression / 2. Between the two the test needs more data."
        ),
    )
    noise_floor_seconds: float = Field(
        default=NOISE_FLOOR_SECONDS,
        ge=0,
        description=(
            "A canary within this many seconds of the baseline passes whatever the ratio. Keep it well below the "
            "metric's own values: a 5 ms floor passes a 15% slower 12 ms ITL."
        ),
    )

    @model_validator(mode="after")
    def _rollback_within_max(self) -> "LatencyCheck":
        if self.rollback_above is not None and self.rollback_above > self.max_regression:
            raise ValueError(ROLLBACK_ABOVE_MAX)
        return self

    @property
    def rollback_tolerance(self) -> float:
        """The rank test's rollback boundary (canary/baseline - 1)."""
        return self.max_regression / 2 if self.rollback_above is None else self.rollback_above

    @field_validator("quantile")
    @classmethod
    def _quantile_range(cls, quantile: float) -> float:
        if not 0 < quantile < 1:
            raise ValueError(QUANTILE_RANGE)
        return quantile


class QualitySpec(SpecModel):
    model_config = ConfigDict(
        json_schema_extra=kube(
            cel(
                "has(self.configMap) || !has(self.suite) || self.suite != 'configmap'",
                "spec.analysis.quality.configMap is required when suite is configmap: name the ConfigMap holding the "
                "probe suite",
                field_path=".configMap",
                reason="FieldValueRequired",
            )
        )
    )

    suite: Literal["builtin", "configmap"] = Field(
        default="builtin",
        description="builtin probes shipped with kvcal, or configmap (spec.analysis.quality.configMap).",
    )
    config_map: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="ConfigMap in this namespace holding the probe suite (suite configmap).",
    )
    max_accuracy_drop: float = Field(
        default=0.01, ge=0, le=1, description="Highest drop in probe accuracy, canary vs baseline, e.g. 0.01."
    )
    min_token_agreement: float = Field(
        default=0.97,
        ge=0,
        le=1,
        description="Lowest fraction of greedy tokens the canary must agree on with the baseline.",
    )
    api: Literal["chat", "completions"] = Field(
        default="chat",
        description=(
            "How the probes ask: chat (/v1/chat/completions, through the model's chat template) or completions "
            "(/v1/completions, the prompt as it is: a model without a chat template)."
        ),
    )
    max_probe_context_tokens: int = Field(
        default=32768,
        ge=256,
        le=10_000_000,
        description=(
            "The longest probe context: the needle at the served context (85% of --max-model-len) is cut to this, "
            "so a 128k model is not sent 110k-token probes on production pods every interval."
        ),
    )
    token_budget: int = Field(
        default=65536,
        ge=1024,
        le=100_000_000,
        description=(
            "Prompt and completion tokens the probes may spend on each role per interval (estimated before "
            "sending); the probes over it wait for later intervals, in turn, and the accuracy measurement says "
            "what each interval spent."
        ),
    )

    @model_validator(mode="after")
    def _configmap_for_suite(self) -> "QualitySpec":
        if self.suite == "configmap" and self.config_map is None:
            raise ValueError("spec.analysis.quality.configMap is required when suite is configmap")
        return self


class CapacityCheck(SpecModel):
    """FP8 KV must really be in effect: the canary's KV capacity in tokens (vLLM's vllm:cache_config_info) against
    a BF16 baseline's (core/analysis/capacity.py)."""

    enabled: bool = Field(
        default=True, description="Check the KV capacity every interval (missing series are Inconclusive)."
    )
    # FP8 halves the bytes of each KV element, so a BF16 baseline's tokens x2 fit in the same space; protected
    # layers (vLLM --kv-cache-dtype-skip-layers) lower that to 2L/(L+skipped).
    min_ratio: float = Field(
        default=1.8,
        ge=1,
        le=2,
        description=(
            "Lowest canary KV tokens / BF16 baseline KV tokens, e.g. 1.8; lower it for layers kept in BF16 "
            "(2L/(L+skipped) at most)."
        ),
    )


class SaturationCheck(SpecModel):
    """Requests waiting and preemptions of canary vs baseline at the same offered load (core/analysis/saturation.py)."""

    mode: Literal["disabled", "report", "gate"] = Field(
        default="disabled", description="disabled, report (values in status), or gate (a canary that is worse fails)."
    )
    max_regression: float = Field(
        default=0.10,
        ge=0,
        le=10,
        description="Highest canary/baseline - 1 that passes the gate, above the noise floors.",
    )


INTERVAL_AT_LEAST_A_SECOND = "spec.analysis.interval must be at least 1s, e.g. 60s"
LOOKBACK_AT_LEAST = "spec.analysis.history.lookback must be at least 10m, e.g. 24h"
LATENCY_REPEATED = "spec.analysis.latency must not repeat a (metric, quantile) pair"


class NoiseHistory(SpecModel):
    """Where the rank test learns how much one pod's latency moves on its own: the baseline pods' own history."""

    learn: bool = Field(
        default=True,
        description=(
            "Learn the baseline pods' own noise (node offsets, own load) from their latency histograms in Prometheus "
            "before the first step, and use it in the rank test while the canary behaves like a baseline pod; false: "
            "estimate it from the step's pods and intervals only."
        ),
    )
    lookback: str = Field(
        default="24h",
        min_length=2,
        max_length=16,
        pattern=DURATION_PATTERN,
        json_schema_extra=kube(cel("duration(self) >= duration('10m')", LOOKBACK_AT_LEAST)),
        description="How far back the history reaches, e.g. 24h, 6h (at least 10m; within Prometheus' retention).",
    )
    samples: int = Field(
        default=96,
        ge=12,
        le=1000,
        description=(
            "Past intervals read, spread evenly over the lookback, each one analysis interval long (one range query "
            "per latency check; the cost grows with samples x baseline pods x buckets)."
        ),
    )
    refresh: str = Field(
        default="1h",
        min_length=2,
        max_length=16,
        pattern=DURATION_PATTERN,
        description="Learn again when the last history is this old (while a rollout runs), e.g. 1h.",
    )

    @field_validator("lookback")
    @classmethod
    def _long_enough(cls, lookback: str) -> str:
        if parse_duration(lookback) < MIN_LOOKBACK_SECONDS:
            raise ValueError(LOOKBACK_AT_LEAST)
        return lookback

    @property
    def lookback_seconds(self) -> float:
        return parse_duration(self.lookback)

    @property
    def refresh_seconds(self) -> float:
        return parse_duration(self.refresh)


def _default_latency() -> list[LatencyCheck]:
    return [LatencyCheck(metric="ttft"), LatencyCheck(metric="itl"), LatencyCheck(metric="e2e")]


class AnalysisSpec(SpecModel):
    prometheus: PrometheusRef = Field(
        default=PrometheusRef(),
        description=(
            "Prometheus that scrapes the baseline and canary vLLM pods: one the cluster admin configured (chart "
            "values policy.prometheus.default and policy.prometheus.additional), picked by name or by its exact "
            "address; neither picks the chart's default. Any other Prometheus is refused before anything is "
            "created."
        ),
    )
    interval: str = Field(
        default="60s",
        min_length=2,
        max_length=16,
        pattern=DURATION_PATTERN,
        json_schema_extra=kube(cel("duration(self) >= duration('1s')", INTERVAL_AT_LEAST_A_SECOND)),
        description="Time between measurements, e.g. 60s, 2m, 1h30m (at least 1s).",
    )
    warmup: str = Field(
        default="120s",
        min_length=2,
        max_length=16,
        pattern=DURATION_PATTERN,
        description="Wait after the canary is ready before the first measurement, e.g. 120s, 2m.",
    )
    min_requests: int = Field(
        default=50,
        ge=0,
        description="Requests the canary must serve in an interval for it to count (else Inconclusive).",
    )
    successful_intervals: int = Field(
        default=5, ge=1, le=1000, description="Consecutive successful intervals needed to pass a step."
    )
    # Intervals tolerated, as in Argo Rollouts: one more rolls back (core/analysis/verdict.py).
    failure_limit: int = Field(
        default=1,
        ge=0,
        le=1000,
        description=(
            "Failed intervals tolerated; one more rolls back (1: the second failed interval rolls back; 0: the first)."
        ),
    )
    inconclusive_limit: int = Field(
        default=2,
        ge=0,
        le=1000,
        description=(
            "Inconclusive intervals (no data, too few requests) tolerated; one more rolls back (0: the first)."
        ),
    )
    consecutive_error_limit: int = Field(
        default=3,
        ge=0,
        le=1000,
        description=("Consecutive errors querying Prometheus or probes tolerated; one more rolls back (0: the first)."),
    )
    max_error_rate: float = Field(
        default=0.01, ge=0, le=1, description="Highest canary request error ratio in an interval, e.g. 0.01 for 1%."
    )
    on_undecided: Literal["pause", "rollback"] = Field(
        default="pause",
        description=(
            "A rank test that made its last look (2 x successfulIntervals) without deciding: pause waits in "
            "AwaitingPromotion for `kvcal promote` or `kvcal abort` (traffic stays at the step's weight); "
            "rollback rolls back with reason AnalysisUndecided."
        ),
    )
    latency: list[LatencyCheck] = Field(
        default_factory=_default_latency,
        max_length=9,
        json_schema_extra=kube(
            cel("self.all(c, self.exists_one(d, d.metric == c.metric && d.quantile == c.quantile))", LATENCY_REPEATED)
        ),
        description="Latency checks, canary vs baseline quantiles from vLLM's histograms.",
    )
    quality: QualitySpec = Field(
        default=QualitySpec(),
        description="Quality probes sent to baseline and canary (exact match, needle, token agreement).",
    )
    capacity: CapacityCheck = Field(
        default=CapacityCheck(),
        description=(
            "FP8 must really be in effect: the canary's KV capacity in tokens (vllm:cache_config_info) against a "
            "BF16 baseline's; an FP8 baseline counts as half its tokens in BF16."
        ),
    )
    saturation: SaturationCheck = Field(
        default=SaturationCheck(),
        description=(
            "Requests waiting per pod and preemptions per request, canary vs baseline at the same offered load."
        ),
    )
    history: NoiseHistory = Field(
        default=NoiseHistory(),
        description=(
            "The baseline pods' own latency noise learned from their history (status.noise): the rank test decides "
            "sooner and more often than with the few pods and intervals of a step."
        ),
    )

    @field_validator("interval")
    @classmethod
    def _at_least_a_second(cls, interval: str) -> str:
        if parse_duration(interval) < MIN_INTERVAL_SECONDS:
            raise ValueError(INTERVAL_AT_LEAST_A_SECOND)
        return interval

    @field_validator("latency")
    @classmethod
    def _distinct_checks(cls, checks: list[LatencyCheck]) -> list[LatencyCheck]:
        keys = [(check.metric, check.quantile) for check in checks]
        if len(set(keys)) != len(keys):
            raise ValueError(LATENCY_REPEATED)
        return checks

    @property
    def interval_seconds(self) -> float:
        return parse_duration(self.interval)

    @property
    def warmup_seconds(self) -> float:
        return parse_duration(self.warmup)


class PromotionSpec(SpecModel):
    mode: Literal["auto", "manual"] = Field(
        default="auto",
        description=(
            "auto promotes at once; manual waits in AwaitingPromotion for `kubectl kvcal promote` (or the "
            "annotation kvcal.dev/promote)."
        ),
    )


class KVCalibrationSpec(SpecModel):
    """What to calibrate, how, and how to roll it out. The operator never writes spec."""

    model_config = ConfigDict(
        json_schema_extra=kube(
            cel(
                "self.calibration.strategy != 'head' || (has(self.serving.canary) && "
                "has(self.serving.canary.attentionBackend) && self.serving.canary.attentionBackend == 'FLASH_ATTN')",
                "spec.calibration.strategy 'head' needs spec.serving.canary.attentionBackend: FLASH_ATTN (other vLLM "
                "backends collapse per-head scales to one per layer); use strategy 'tensor' or set the backend",
                field_path=".calibration.strategy",
                reason="FieldValueInvalid",
            ),
            # Compared as path segments ('' and '.' dropped, as path_segments does), so pvc://m/llama/ and
            # pvc://m//llama are the same folder as pvc://m/llama.
            cel(
                "!has(self.calibration.output) || "
                "self.calibration.output.split('/').filter(s, s != '' && s != '.') != "
                "self.model.source.split('/').filter(s, s != '' && s != '.')",
                "spec.calibration.output must differ from spec.model.source: the calibrated checkpoint is written "
                "beside the BF16 one, never over it",
                field_path=".calibration.output",
                reason="FieldValueInvalid",
            ),
        )
    )

    model: ModelRef = Field(description="The BF16 checkpoint the baseline serves, which gets calibrated.")
    calibration: CalibrationSpec = Field(
        description=(
            "How to calibrate: the prompts, how many, the scale strategy and observer, where the calibrated "
            "checkpoint goes, and the Job that runs llm-compressor."
        )
    )
    serving: ServingSpec = Field(
        description="The BF16 baseline being served, and how the calibrated canary is run and receives traffic."
    )
    analysis: AnalysisSpec = Field(
        default=AnalysisSpec(),
        description=(
            "Canary analysis every interval: latency from Prometheus and quality probes sent to both baseline and"
            " canary; counters decide pass or fail."
        ),
    )
    promotion: PromotionSpec = Field(default=PromotionSpec(), description="What happens after the analysis passes.")

    @model_validator(mode="after")
    def _cross_field(self) -> "KVCalibrationSpec":
        # Same rules as the CRD's CEL; kept here so the CLI and unit tests reject bad specs without an API server.
        if self.calibration.strategy == "head" and self.serving.canary.attention_backend not in PER_HEAD_BACKENDS:
            raise ValueError(
                "spec.calibration.strategy: 'head' needs spec.serving.canary.attentionBackend: FLASH_ATTN "
                "(other vLLM backends collapse per-head scales to one per layer)"
            )
        if path_segments(self.calibration.output) == path_segments(self.model.source):
            raise ValueError(
                "spec.calibration.output must differ from spec.model.source (compared as path segments): the "
                "calibrated checkpoint is written beside the BF16 one, never over it"
            )
        return self
