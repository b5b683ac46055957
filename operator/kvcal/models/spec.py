"""KVCalibration.spec. Defaults, bounds, patterns and CEL rules here are the CRD's (tests/unit/test_models*.py walk
both; tests/integration/test_spec_parity.py sends a table of objects through the API server and the model)."""

import re
from itertools import pairwise
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidatorFunctionWrapHandler, field_validator, model_validator
from pydantic_core import PydanticCustomError

from kvcal import vllm_flags
from kvcal.models.base import Model

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


def storage_location(value: Any, validate: ValidatorFunctionWrapHandler, pattern: str, message: str, field: str) -> str:
    """A storage URI field, checked in the CRD's order: `self.matches(PATTERN)` with its message (pydantic's own
    would quote the regex, not the fix), then the field's type and bounds (`validate`), then
    `!self.split('/').exists(s, s == '..')`: a `..` segment is refused, a name like `a..b` is not."""
    if isinstance(value, str) and re.fullmatch(pattern, value) is None:
        raise ValueError(message)
    location: str = validate(value)
    if ".." in location.split("/"):
        raise ValueError(f"{field} must not contain '..' path segments; name the path directly")
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
        pattern=CHECKPOINT_PATTERN,
        description="Where the BF16 checkpoint lives: pvc://CLAIM/PATH or hostpath:///ABS/PATH (no s3://)",
    )
    revision: str | None = Field(
        default=None,
        max_length=256,
        description=(
            "Revision (commit sha or tag) of the checkpoint, recorded in the calibration report's provenance and in "
            "status.calibration beside the weights' sha256"
        ),
    )

    @field_validator("source", mode="wrap")
    @classmethod
    def _location(cls, source: Any, validate: ValidatorFunctionWrapHandler) -> str:
        return storage_location(source, validate, CHECKPOINT_PATTERN, MODEL_SOURCE_MESSAGE, "spec.model.source")


class Dataset(SpecModel):
    source: str = Field(
        max_length=1024,
        pattern=DATASET_PATTERN,
        description="configmap://NAME/KEY, pvc://CLAIM/PATH or hostpath:///ABS/PATH of a JSONL file",
    )
    format: Literal["chat", "text"] = "chat"

    @field_validator("source", mode="wrap")
    @classmethod
    def _location(cls, source: Any, validate: ValidatorFunctionWrapHandler) -> str:
        path = "spec.calibration.dataset.source"
        return storage_location(source, validate, DATASET_PATTERN, DATASET_SOURCE_MESSAGE, path)


class ResourceRequirements(SpecModel):
    limits: dict[str, str] | None = None
    requests: dict[str, str] | None = None


class Toleration(SpecModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class JobSpec(SpecModel):
    image: str | None = Field(default=None, max_length=512)
    resources: ResourceRequirements | None = None
    node_selector: dict[str, str] | None = None
    tolerations: list[Toleration] | None = None
    active_deadline_seconds: int = Field(default=3600, ge=1)
    backoff_limit: int = Field(default=1, ge=0, le=10)


class CalibrationSpec(SpecModel):
    dataset: Dataset
    samples: int = Field(default=512, ge=1, le=65536)
    max_seq_length: int = Field(default=4096, ge=16, le=1048576)
    holdout_fraction: float = 0.1
    seed: int = Field(default=0, ge=0)
    strategy: Literal["tensor", "head"] = "tensor"
    observer: Literal["static-minmax", "minmax", "mse"] = "static-minmax"
    pipeline: Literal["auto", "basic", "sequential"] = "auto"
    # Also calibrate q_scale (llm-compressor's attention scheme): FP8 attention backends quantize Q with it.
    query_scales: bool = False
    output: str = Field(max_length=1024, pattern=CHECKPOINT_PATTERN)
    job: JobSpec = JobSpec()

    @field_validator("holdout_fraction")
    @classmethod
    def _holdout_range(cls, fraction: float) -> float:
        if not 0 < fraction <= 0.5:
            raise ValueError("spec.calibration.holdoutFraction must be in (0, 0.5], e.g. 0.1")
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
    deployment: str = Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    kind: WorkloadKind = "Deployment"
    service: str = Field(max_length=63, pattern=DNS_LABEL_PATTERN)
    container: str | None = Field(
        default=None, max_length=63, description="Container running vLLM; default: the first one"
    )

    @property
    def workload(self) -> str:
        """'Deployment NAME' or 'StatefulSet NAME', as messages name the baseline."""
        return f"{self.kind} {self.deployment}"


class ProtectedLayers(SpecModel):
    """Attention layers whose KV cache stays in BF16 (vLLM's --kv-cache-dtype-skip-layers)."""

    layers: list[Annotated[int, Field(ge=0, le=MAX_LAYER_INDEX)]] = Field(default=[], max_length=MAX_PROTECTED_LAYERS)
    # Also the calibration report's sensitive layers (status.calibration.sensitiveLayers).
    from_report: bool = False

    @field_validator("layers")
    @classmethod
    def _distinct(cls, layers: list[int]) -> list[int]:
        if len(set(layers)) != len(layers):
            raise ValueError("spec.serving.canary.protectedLayers.layers must not repeat a layer")
        return layers


class CanarySpec(SpecModel):
    replicas: int = Field(
        default=1,
        ge=1,
        le=100,
        description=(
            "The fewest canary pods under router gateway-api, inference-pool or none (the step's share may ask for "
            "more): several canary pods average out each pod's own noise, so the latency verdict decides sooner. "
            "Refused above 1 with router replicas, where each step's weight sets the canary's pod count"
        ),
    )
    kv_cache_dtype: Literal["fp8", "fp8_e4m3"] = "fp8_e4m3"
    attention_backend: str | None = Field(
        default=None,
        max_length=64,
        pattern=ATTENTION_BACKEND_PATTERN,
        description=(
            "vLLM attention backend, e.g. FLASH_ATTN, passed as --attention-backend (replacing any the baseline "
            "sets) to the canary, the verification Job and the promoted baseline"
        ),
    )
    protected_layers: ProtectedLayers = ProtectedLayers()
    extra_args: list[Annotated[str, Field(max_length=1024)]] = Field(default=[], max_length=64)

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

    percent: int = Field(default=100, ge=1, le=100)
    intervals: int = Field(default=3, ge=1, le=50)


class TrafficSpec(SpecModel):
    router: Router = "replicas"
    steps: list[int] = Field(default=[10, 50], min_length=1, max_length=10)
    http_route: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    # router inference-pool: the baseline's InferencePool, a backendRef of the HTTPRoute (core.rollout.pool).
    inference_pool: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    # After the router reports 0% on the canary, how long in-flight requests get before the canary is deleted.
    drain_delay: str = Field(default="30s", min_length=2, max_length=16, pattern=DURATION_PATTERN)
    shadow: ShadowSpec | None = None  # off by default

    @field_validator("steps")
    @classmethod
    def _percentages_increasing(cls, steps: list[int]) -> list[int]:
        if any(not 0 < step <= 100 for step in steps):
            raise ValueError("spec.serving.traffic.steps must each be a percentage in (0, 100], e.g. [10, 50]")
        if any(later <= earlier for earlier, later in pairwise(steps)):
            raise ValueError("spec.serving.traffic.steps must be strictly increasing, e.g. [10, 50, 100]")
        return steps

    @model_validator(mode="after")
    def _route_for_gateway(self) -> "TrafficSpec":
        if self.router in ROUTE_ROUTERS and self.http_route is None:
            raise ValueError(f"spec.serving.traffic.httpRoute is required when router is {self.router}")
        if (self.inference_pool is not None) != (self.router == "inference-pool"):
            raise ValueError(
                "spec.serving.traffic.inferencePool is required when router is inference-pool (name the baseline's "
                "InferencePool), and only then"
            )
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
    baseline: BaselineRef
    canary: CanarySpec = CanarySpec()
    traffic: TrafficSpec = TrafficSpec()

    @model_validator(mode="after")
    def _canary_replicas_by_weight(self) -> "ServingSpec":
        if self.canary.replicas > 1 and self.traffic.router == "replicas":
            raise ValueError(CANARY_REPLICAS_WITH_REPLICAS_ROUTER)
        return self


class PrometheusRef(SpecModel):
    # One of the Prometheus servers a cluster admin configured (chart values policy.prometheus.*), picked by name or by
    # its exact address; neither: the chart's default. Any other pick is refused (core.guard.policy): the author never
    # chooses what the operator fetches.
    name: str | None = Field(default=None, max_length=63, pattern=DNS_LABEL_PATTERN)
    address: str | None = Field(default=None, max_length=1024, pattern=PROMETHEUS_URL_PATTERN)


# One message for the schema's CEL rule and the model.
ROLLBACK_ABOVE_MAX = (
    "spec.analysis.latency[].rollbackAbove must be at most maxRegression (a canary is rolled back above "
    "rollbackAbove and never promoted above maxRegression), e.g. rollbackAbove: 0.05 with maxRegression: 0.10"
)


# The default noise floor: a tenth or less of a GPU's inter-token latency (5-30 ms). The floor is promised to pass
# whatever the ratio, so 5 ms (the default before) promoted nearly every 15% slower ITL at 12 ms (docs/operations.md,
# "Tuning the analysis"): the very latency FP8 KV's decode attention moves.
NOISE_FLOOR_SECONDS = 0.0005


class LatencyCheck(SpecModel):
    metric: Literal["ttft", "itl", "e2e"]
    # rank: a sequential Mann-Whitney test on the histograms since the step began (kvcal.core.analysis.ranktest);
    # quantile: this interval's canary quantile vs the baseline's x (1 + maxRegression).
    test: Literal["rank", "quantile"] = "rank"
    quantile: float = 0.95
    # The slowdown never to promote (rank: promoted only when confidently within it; quantile: the limit).
    max_regression: float = Field(default=0.10, ge=0, le=10)
    # rank only: the slowdown that rolls back, when the canary is confidently slower than it (default half of
    # maxRegression); between the two the test needs more data.
    rollback_above: float | None = Field(default=None, ge=0, le=10)
    # Absolute noise floor: a canary within this many seconds of the baseline passes whatever the ratio.
    noise_floor_seconds: float = Field(default=NOISE_FLOOR_SECONDS, ge=0)

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
            raise ValueError("spec.analysis.latency[].quantile must be in (0, 1), e.g. 0.95")
        return quantile


class QualitySpec(SpecModel):
    suite: Literal["builtin", "configmap"] = "builtin"
    config_map: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    max_accuracy_drop: float = Field(default=0.01, ge=0, le=1)
    min_token_agreement: float = Field(default=0.97, ge=0, le=1)

    @model_validator(mode="after")
    def _configmap_for_suite(self) -> "QualitySpec":
        if self.suite == "configmap" and self.config_map is None:
            raise ValueError("spec.analysis.quality.configMap is required when suite is configmap")
        return self


class CapacityCheck(SpecModel):
    """FP8 KV must really be in effect: the canary's KV capacity in tokens (vLLM's vllm:cache_config_info) against
    a BF16 baseline's (core/analysis/capacity.py)."""

    enabled: bool = True
    # FP8 halves the bytes of each KV element, so a BF16 baseline's tokens x2 fit in the same space; protected
    # layers (vLLM --kv-cache-dtype-skip-layers) lower that to 2L/(L+skipped).
    min_ratio: float = Field(default=1.8, ge=1.0, le=2.0)


class SaturationCheck(SpecModel):
    """Requests waiting and preemptions of canary vs baseline at the same offered load (core/analysis/saturation.py)."""

    mode: Literal["disabled", "report", "gate"] = "disabled"
    max_regression: float = Field(default=0.10, ge=0, le=10)


def _default_latency() -> list[LatencyCheck]:
    return [LatencyCheck(metric="ttft"), LatencyCheck(metric="itl"), LatencyCheck(metric="e2e")]


class AnalysisSpec(SpecModel):
    prometheus: PrometheusRef = PrometheusRef()
    interval: str = Field(default="60s", min_length=2, max_length=16, pattern=DURATION_PATTERN)
    warmup: str = Field(default="120s", min_length=2, max_length=16, pattern=DURATION_PATTERN)
    min_requests: int = Field(default=50, ge=0)
    successful_intervals: int = Field(default=5, ge=1, le=1000)
    # Intervals tolerated, as in Argo Rollouts: one more rolls back (core/analysis/verdict.py).
    failure_limit: int = Field(default=1, ge=0, le=1000)
    inconclusive_limit: int = Field(default=2, ge=0, le=1000)
    consecutive_error_limit: int = Field(default=3, ge=0, le=1000)
    max_error_rate: float = Field(default=0.01, ge=0, le=1)
    # A rank test that made its last look undecided: pause (wait in AwaitingPromotion for `kvcal promote` or
    # `kvcal abort`) or rollback (with reason AnalysisUndecided, never "slower").
    on_undecided: Literal["pause", "rollback"] = "pause"
    latency: list[LatencyCheck] = Field(default_factory=_default_latency, max_length=9)
    quality: QualitySpec = QualitySpec()
    capacity: CapacityCheck = CapacityCheck()
    saturation: SaturationCheck = SaturationCheck()

    @field_validator("interval")
    @classmethod
    def _at_least_a_second(cls, interval: str) -> str:
        if parse_duration(interval) < MIN_INTERVAL_SECONDS:
            raise ValueError("spec.analysis.interval must be at least 1s, e.g. 60s")
        return interval

    @field_validator("latency")
    @classmethod
    def _distinct_checks(cls, checks: list[LatencyCheck]) -> list[LatencyCheck]:
        keys = [(check.metric, check.quantile) for check in checks]
        if len(set(keys)) != len(keys):
            raise ValueError("spec.analysis.latency must not repeat a (metric, quantile) pair")
        return checks

    @property
    def interval_seconds(self) -> float:
        return parse_duration(self.interval)

    @property
    def warmup_seconds(self) -> float:
        return parse_duration(self.warmup)


class PromotionSpec(SpecModel):
    mode: Literal["auto", "manual"] = "auto"


class KVCalibrationSpec(SpecModel):
    model: ModelRef
    calibration: CalibrationSpec
    serving: ServingSpec
    analysis: AnalysisSpec = AnalysisSpec()
    promotion: PromotionSpec = PromotionSpec()

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
