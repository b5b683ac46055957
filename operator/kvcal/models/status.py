"""KVCalibration.status: computed whole by the core, written once per reconcile. The source of the CRD's status
schema (kvcal.models.crd): the bounds here are the API server's too."""

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from kvcal.models.base import Model
from kvcal.models.markers import kube
from kvcal.models.spec import LatencyMetric

MAX_MEASUREMENTS = 48  # six intervals of the default checks (8 measurements each): enough to see why a run failed
MAX_HISTORY = 20
MAX_CONDITIONS = 16  # room beside the ten ConditionType values
# Delivered notifications: one per transition still in history (and the one before) per webhook target, at most
# MAX_WEBHOOKS (chart values notifications.webhooks); core.notifications trims to this.
MAX_WEBHOOKS = 8
MAX_DELIVERED = (MAX_HISTORY + 1) * MAX_WEBHOOKS
# metav1.Condition's own bounds.
MAX_REASON_LENGTH = 1024
MAX_CONDITION_MESSAGE_LENGTH = 32768


class Phase(StrEnum):
    """The phases of the CRD's status.phase enum. What each one does, and which moves are allowed, is declared once in
    core/phases.py; the status fields hold plain strings, so a descriptor with another phase needs no model edit."""

    PENDING = "Pending"
    CALIBRATING = "Calibrating"
    VERIFYING = "Verifying"
    DEPLOYING = "Deploying"
    ANALYZING = "Analyzing"
    AWAITING_PROMOTION = "AwaitingPromotion"
    PROMOTING = "Promoting"
    SUCCEEDED = "Succeeded"
    ROLLING_BACK = "RollingBack"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"
    INVALID_SPEC = "InvalidSpec"


ConditionType = Literal[
    "Calibrated",
    "ScalesVerified",
    "CanaryReady",
    "AnalysisPassed",
    "Promoted",
    "Ready",
    "ServingVerified",
    "SpecCurrent",
    "CalibrationCurrent",
    "ReconcileError",
]


class Condition(Model):
    """metav1.Condition."""

    type: ConditionType = Field(description="Condition type.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(max_length=MAX_REASON_LENGTH, description="CamelCase reason of the last transition.")
    message: str = Field(default="", max_length=MAX_CONDITION_MESSAGE_LENGTH, description="Human-readable details.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation the condition was set for."
    )


class ClipStats(Model):
    """Share of K and V values clipped by FP8 scales (the calibrator's report and status.calibration)."""

    k: float = Field(description="Clip rate of keys.")
    v: float = Field(description="Clip rate of values.")


# The calibration Job's termination-message summary (the contract between the calibrator and the operator): these keys
# are copied into status.calibration; the calibrator also writes `artifact` and `reportVersion`.
CALIBRATION_SUMMARY_FIELDS = frozenset(
    {
        "samples",
        "tokens",
        "strategy",
        "observer",
        "kScaleMax",
        "vScaleMax",
        "holdoutClipRateDefault",
        "holdoutClipRateCalibrated",
        "top1AgreementDefault",
        "top1AgreementCalibrated",
        "durationSeconds",
        "longestSampleTokens",
        "servedContextTokens",
        "contextWarning",
        "sensitiveLayers",
        "modelHash",
        "modelRevision",
        "device",
        "placement",
        "dtype",
        "peakDeviceMemoryBytes",
        "tokensPerSecond",
    }
)


class CalibrationStatus(Model):
    job: str | None = Field(default=None, description="Name of the calibration Job.")
    spec_hash: str | None = Field(default=None, description="Hash of the calibration spec the artifact was made from.")
    artifact: str | None = Field(default=None, description="Where the calibrated checkpoint was written.")
    samples: int | None = Field(default=None, description="Calibration prompts used.")
    tokens: int | None = Field(default=None, description="Calibration tokens seen.")
    strategy: str | None = Field(default=None, description="Scale strategy used.")
    observer: str | None = Field(default=None, description="Observer used.")
    k_scale_max: float | None = Field(default=None, description="Largest k_scale over layers (and heads).")
    sensitive_layers: list[int] | None = Field(
        default=None, description="Layers the calibration report names sensitive (protectedLayers.fromReport)."
    )
    model_hash: str | None = Field(
        default=None, description="sha256 of the BF16 weights the calibration Job read (*.safetensors and config.json)."
    )
    model_revision: str | None = Field(
        default=None, description="spec.model.revision as the calibration Job was given it."
    )
    device: str | None = Field(
        default=None, description="The devices the calibration computed on, e.g. cuda:0, cuda:0,cuda:1 or cpu."
    )
    placement: str | None = Field(
        default=None, description="cpu, one-device, several-devices or layer-by-layer (weights onloaded per layer)."
    )
    dtype: str | None = Field(default=None, description="The dtype the model computed in.")
    peak_device_memory_bytes: int | None = Field(
        default=None,
        json_schema_extra=kube(format="int64"),
        description="Largest peak memory allocated on any accelerator the calibration used.",
    )
    tokens_per_second: float | None = Field(
        default=None, description="Calibration tokens per second of the calibration pass."
    )
    v_scale_max: float | None = Field(default=None, description="Largest v_scale over layers (and heads).")
    holdout_clip_rate_default: ClipStats | None = Field(
        default=None, description="Fraction of held-out K/V values that clip at scale 1.0 (no calibration)."
    )
    holdout_clip_rate_calibrated: ClipStats | None = Field(
        default=None, description="Fraction of held-out K/V values that clip with the calibrated scales."
    )
    top1_agreement_default: float | None = Field(
        default=None, description="Held-out top-1 agreement with BF16 of FP8 KV at scale 1.0."
    )
    top1_agreement_calibrated: float | None = Field(
        default=None, description="Held-out top-1 agreement with BF16 of FP8 KV with the calibrated scales."
    )
    duration_seconds: float | None = Field(default=None, description="Calibration wall time.")
    longest_sample_tokens: int | None = Field(
        default=None, description="Longest calibration sample in tokens, as calibrated (after truncation)."
    )
    served_context_tokens: int | None = Field(
        default=None,
        description=(
            "Longest context the service serves, the calibration's length coverage is judged against: the "
            "baseline's --max-model-len, else the model's max_position_embeddings."
        ),
    )
    context_warning: str | None = Field(
        default=None,
        description=(
            "Set when the calibration stops under a quarter of the served context (also a Warning event "
            "CalibrationContextShort)."
        ),
    )
    message: str | None = Field(default=None, description="Details, e.g. why the Job failed.")
    calibrator_image: str | None = Field(
        default=None,
        description=(
            "Image that computed the scales (spec.calibration.job.image, else the operator's default); provenance"
            " only, never part of specHash."
        ),
    )


class VerificationStatus(Model):
    job: str | None = Field(default=None, description="Name of the verification Job.")
    layers: int | None = Field(default=None, description="Attention layers whose scales vLLM reported.")
    mismatches: int | None = Field(default=None, description="Layers whose loaded scale differs from the checkpoint's.")
    message: str | None = Field(default=None, description="Details of the verification.")


class ServingStatus(Model):
    """What the promoted baseline runs, as last verified: a change of image or attention backend re-verifies."""

    image: str | None = Field(default=None, description="vLLM image of the baseline when last verified.")
    attention_backend: str | None = Field(
        default=None, description="Attention backend of the baseline when last verified; vLLM's default when unset."
    )
    verification: VerificationStatus = Field(
        default=VerificationStatus(), description="The last verification Job in that image."
    )
    chat_template: str | None = Field(
        default=None,
        description=(
            "The --chat-template the baseline served when promoted ('' for the model's own): another one renders "
            "prompts unlike the calibration data (condition CalibrationCurrent)."
        ),
    )


class CanaryStatus(Model):
    deployment: str | None = Field(default=None, description="Name of the canary Deployment.")
    weight: int = Field(default=0, ge=0, le=100, description="Percentage of traffic the canary receives.")
    step_index: int = Field(default=0, ge=0, description="Index into spec.serving.traffic.steps.")
    ready_replicas: int = Field(default=0, ge=0, description="Ready canary pods.")
    draining_since: str | None = Field(
        default=None,
        description=(
            "When the router was first seen sending 0% to the canary on its way out; the canary is deleted "
            "spec.serving.traffic.drainDelay later."
        ),
    )
    mirror: int = Field(
        default=0, ge=0, le=100, description="Percent of live requests mirrored to the canary now (the shadow stage)."
    )
    shadowed: bool = Field(
        default=False, description="The shadow stage (spec.serving.traffic.shadow) passed; the weighted steps run."
    )
    baseline_replicas: int | None = Field(
        default=None,
        ge=1,
        description=(
            "spec.serving.canary.capacity fromBaseline: the baseline's replicas before kvcal scaled it down for the "
            "canary, restored when the canary goes (rollback, promotion, delete); unset when none are taken."
        ),
    )


class Measurement(Model):
    """One analysis measurement: the query, both values, the verdict. Capped history in status."""

    metric: str = Field(description="What was measured, e.g. ttft-p95, errors, quality.")
    phase: Literal["Successful", "Undecided", "Failed", "Inconclusive", "Error"] = Field(
        description="Verdict of this measurement."
    )
    at: str = Field(description="When it was measured (RFC 3339).")
    baseline: float | None = Field(default=None, description="Baseline value.")
    canary: float | None = Field(default=None, description="Canary value.")
    threshold: float | None = Field(default=None, description="Limit the canary was held to.")
    query: str | None = Field(default=None, description="PromQL query or probe suite used.")
    message: str | None = Field(default=None, description="Details.")
    exhausted: bool | None = Field(
        default=None, description="The sequential test made its last look without deciding (the run is undecided)."
    )


class AnalysisStatus(Model):
    started_at: str | None = Field(default=None, description="When analysis of the current step began (RFC 3339).")
    last_measured_at: str | None = Field(default=None, description="When the last measurement was taken (RFC 3339).")
    consecutive_successes: int = Field(default=0, description="Successful intervals in a row in the current step.")
    failures: int = Field(default=0, description="Failed intervals.")
    inconclusive: int = Field(default=0, description="Inconclusive intervals.")
    consecutive_errors: int = Field(default=0, description="Measurement errors in a row.")
    ttft_p95_delta: str | None = Field(
        default=None, description="Canary vs baseline p95 time to first token, e.g. '+3.1%'."
    )
    measurements: list[Measurement] = Field(
        default=[], max_length=MAX_MEASUREMENTS, description="The last measurements, newest last (capped)."
    )


class NoiseStatus(Model):
    """How much one pod's latency moves on its own, as the rank test counts it (docs/concepts.md, "Noise learned
    from the baseline's history"): learned from the baseline pods' history, or estimated in each step (and why)."""

    metric: LatencyMetric = Field(description="The latency metric (a rank test's check).")
    source: Literal["learned", "estimated"] | None = Field(
        default=None,
        description="learned: from the baseline pods' history; estimated: from each step's pods and intervals.",
    )
    learned_at: str | None = Field(default=None, description="When the history was read (RFC 3339).")
    message: str | None = Field(default=None, description="What was learned, or why the history could not be used.")
    pods: int | None = Field(default=None, description="Baseline pods in the history.")
    intervals: int | None = Field(default=None, description="Sampled past intervals with two pods or more.")
    node_variance: float | None = Field(
        default=None, description="A pod's fixed offset (its node), as a variance of the rank test's effect."
    )
    node_degrees: int | None = Field(default=None, description="The node variance's degrees of freedom (pods - 1).")
    own_variance: float | None = Field(
        default=None, description="A pod's own load in one interval, as a variance of the rank test's effect."
    )
    own_degrees: int | None = Field(default=None, description="The own-load variance's degrees of freedom.")
    requests_per_pod: float | None = Field(
        default=None, description="A baseline pod's mean requests per analysis interval in the history."
    )
    slowdown_effect: float | None = Field(
        default=None,
        description=(
            "The rank test's effect (P(slower) - 1/2) of a canary 10% slower than the history's latencies "
            "(kvcal plan sizes the canary with it)."
        ),
    )


class KVCacheRole(Model):
    """The KV cache one role's vLLM reports (vllm:cache_config_info); where pods differ, the one the capacity check
    judges (core/analysis/capacity.py)."""

    cache_dtype: str | None = Field(
        default=None, description="vLLM's --kv-cache-dtype as it runs (auto, fp8, fp8_e4m3, ...)."
    )
    kv_tokens: int | None = Field(default=None, description="KV cache capacity in tokens (kv_cache_size_tokens).")
    kv_bytes: int | None = Field(
        default=None, description="KV cache memory in bytes (kv_cache_memory_bytes; absent where vLLM reports none)."
    )
    bytes_per_token: float | None = Field(default=None, description="kvBytes / kvTokens.")
    max_concurrency: float | None = Field(
        default=None, description="Requests of the longest model length that fit at once (kv_cache_max_concurrency)."
    )


class CapacityStatus(Model):
    """KV capacity of baseline and canary, as last read (kept across steps and after promotion)."""

    measured_at: str | None = Field(default=None, description="When it was read (RFC 3339).")
    token_ratio: float | None = Field(
        default=None, description="Canary KV tokens / baseline KV tokens (about 2 for FP8 beside BF16)."
    )
    baseline: KVCacheRole | None = Field(default=None, description="The baseline's KV cache.")
    canary: KVCacheRole | None = Field(
        default=None, description="The canary's KV cache (the pod with the fewest tokens where pods differ)."
    )


class HistoryEntry(Model):
    phase: str = Field(json_schema_extra=kube(enum=Phase), description="Phase entered.")
    at: str = Field(description="When (RFC 3339).")
    reason: str = Field(description="Why.")
    message: str = Field(default="", description="Details.")
    # Structured, so that notifications never parse the message: set on entering Analyzing at a weighted step.
    step: int | None = Field(default=None, ge=1, description="The traffic step entered (1-based; Analyzing only).")
    steps: int | None = Field(default=None, ge=1, description="How many traffic steps the rollout has.")
    weight: int | None = Field(default=None, ge=0, le=100, description="The canary's weight at that step (percent).")


class NotificationsStatus(Model):
    """Webhook deliveries (core.notifications): recorded after the receiver's 2xx, so a restart repeats none."""

    delivered: list[Annotated[str, Field(max_length=512)]] = Field(
        default=[],
        max_length=MAX_DELIVERED,
        description=(
            "Deliveries the receivers accepted, as TARGET/UID/PHASE/AT (the part after the target is the "
            "Idempotency-Key sent); one per target per transition still in history."
        ),
    )
    last_error: str | None = Field(
        default=None,
        description=(
            'The latest failed delivery of each target that has not accepted one since (HTTP status or "no '
            "answer\"; never the URL or an answer's body)."
        ),
    )


class KVCalibrationStatus(Model):
    """Observed state, computed by the operator and written once per reconcile."""

    phase: str = Field(
        default=Phase.PENDING,
        json_schema_extra=kube(enum=Phase),
        description="Lifecycle phase; Succeeded, RolledBack and Failed are terminal.",
    )
    message: str | None = Field(default=None, description="Human-readable reason for the current phase.")
    observed_generation: int | None = Field(default=None, description="The metadata.generation this status describes.")
    phase_started_at: str | None = Field(default=None, description="When the current phase began (RFC 3339).")
    conditions: list[Condition] = Field(
        default=[],
        max_length=MAX_CONDITIONS,
        json_schema_extra=kube(list_type="map", list_map_keys=["type"]),
        description=(
            "Calibrated, ScalesVerified, CanaryReady, AnalysisPassed, Promoted, Ready; when they apply: "
            "ServingVerified (the promoted baseline's image/backend re-verified), SpecCurrent (a spec change "
            "after a terminal phase), CalibrationCurrent (after a promotion: False when the baseline serves a longer "
            "context than was calibrated, or another chat template), ReconcileError (the last reconcile pass failed)."
        ),
    )
    calibration: CalibrationStatus = Field(
        default=CalibrationStatus(), description="The calibration Job and the summary of its report."
    )
    verification: VerificationStatus = Field(
        default=VerificationStatus(),
        description="The verification Job that loads the checkpoint in vLLM and reads the scales back.",
    )
    canary: CanaryStatus = Field(default=CanaryStatus(), description="The canary Deployment and its traffic.")
    analysis: AnalysisStatus = Field(
        default=AnalysisStatus(), description="Analysis counters and the last measurements."
    )
    capacity: CapacityStatus = Field(
        default=CapacityStatus(),
        description="KV capacity of baseline and canary as vLLM reports it (vllm:cache_config_info).",
    )
    noise: list[NoiseStatus] = Field(
        default=[],
        max_length=3,
        json_schema_extra=kube(list_type="map", list_map_keys=["metric"]),
        description=(
            "The pods' own latency noise each rank test uses (one per metric): learned from the baseline's history, "
            "or why not."
        ),
    )
    history: list[HistoryEntry] = Field(
        default=[], max_length=MAX_HISTORY, description="Phase transitions, newest last (capped)."
    )
    serving: ServingStatus = Field(
        default=ServingStatus(),
        description=(
            "What the promoted baseline runs, as last verified; a change of its vLLM image or attention backend "
            "re-runs the verification Job (condition ServingVerified)."
        ),
    )
    notifications: NotificationsStatus = Field(
        default=NotificationsStatus(),
        description=(
            "Webhook notifications of phase changes (chart values notifications.webhooks; docs/notifications.md),"
            " recorded after the receiver answered 2xx so that an operator restart neither repeats nor loses one."
        ),
    )
