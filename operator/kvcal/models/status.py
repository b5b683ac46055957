"""KVCalibration.status: computed whole by the core, written once per reconcile."""

from enum import StrEnum
from typing import Literal

from pydantic import Field

from kvcal.models.base import Model

MAX_MEASUREMENTS = 48  # six intervals of the default checks (8 measurements each): enough to see why a run failed
MAX_HISTORY = 20


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
    "ReconcileError",
]


class Condition(Model):
    """metav1.Condition."""

    type: ConditionType
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class ClipStats(Model):
    """Share of K and V values clipped by FP8 scales (the calibrator's report and status.calibration)."""

    k: float
    v: float


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
    job: str | None = None
    spec_hash: str | None = None
    artifact: str | None = None
    samples: int | None = None
    tokens: int | None = None
    strategy: str | None = None
    observer: str | None = None
    k_scale_max: float | None = None
    v_scale_max: float | None = None
    holdout_clip_rate_default: ClipStats | None = None
    holdout_clip_rate_calibrated: ClipStats | None = None
    top1_agreement_default: float | None = None
    top1_agreement_calibrated: float | None = None
    duration_seconds: float | None = None
    longest_sample_tokens: int | None = None
    served_context_tokens: int | None = None
    context_warning: str | None = None  # the calibration stops far below the served context (calibrator's rule)
    sensitive_layers: list[int] | None = None  # the report's, for spec.serving.canary.protectedLayers.fromReport
    model_hash: str | None = None  # sha256 of the BF16 weights the Job read
    model_revision: str | None = None  # spec.model.revision, as the Job was given it
    device: str | None = None  # e.g. cuda:0, cuda:0,cuda:1, cpu
    placement: str | None = None  # cpu | one-device | several-devices | layer-by-layer
    dtype: str | None = None
    peak_device_memory_bytes: int | None = None
    tokens_per_second: float | None = None  # the calibration pass's rate
    message: str | None = None
    calibrator_image: str | None = None  # provenance: the image that computed the scales (spec's or the default)


class VerificationStatus(Model):
    job: str | None = None
    layers: int | None = None
    mismatches: int | None = None
    message: str | None = None


class ServingStatus(Model):
    """What the promoted baseline runs, as last verified: a change of image or attention backend re-verifies."""

    image: str | None = None
    attention_backend: str | None = None
    verification: VerificationStatus = VerificationStatus()


class CanaryStatus(Model):
    deployment: str | None = None
    weight: int = 0
    step_index: int = 0
    ready_replicas: int = 0
    # When the router was first seen at 0% on the canary on its way out (rollback, promotion, delete).
    draining_since: str | None = None
    # The shadow stage (spec.serving.traffic.shadow): the percent of live requests mirrored to the canary now, and
    # whether the stage has passed (then the weighted steps run).
    mirror: int = Field(default=0, ge=0, le=100)
    shadowed: bool = False


class Measurement(Model):
    """One analysis measurement: the query, both values, the verdict. Capped history in status."""

    metric: str
    phase: Literal["Successful", "Undecided", "Failed", "Inconclusive", "Error"]
    at: str
    baseline: float | None = None
    canary: float | None = None
    threshold: float | None = None
    query: str | None = None
    message: str | None = None
    # A sequential test past its last look without a decision: the run is undecided (spec.analysis.onUndecided).
    exhausted: bool | None = None


class AnalysisStatus(Model):
    started_at: str | None = None
    last_measured_at: str | None = None
    consecutive_successes: int = 0
    failures: int = 0
    inconclusive: int = 0
    consecutive_errors: int = 0
    ttft_p95_delta: str | None = Field(default=None, description="Canary vs baseline, e.g. '+3.1%'")
    measurements: list[Measurement] = []


class KVCacheRole(Model):
    """The KV cache one role's vLLM reports (vllm:cache_config_info); where pods differ, the one the capacity check
    judges (core/analysis/capacity.py)."""

    cache_dtype: str | None = None
    kv_tokens: int | None = None
    kv_bytes: int | None = None  # None where vLLM reports none (GPU without --kv-cache-memory-bytes)
    bytes_per_token: float | None = None
    max_concurrency: float | None = None


class CapacityStatus(Model):
    """KV capacity of baseline and canary, as last read (kept across steps and after promotion)."""

    measured_at: str | None = None
    baseline: KVCacheRole | None = None
    canary: KVCacheRole | None = None
    token_ratio: float | None = Field(default=None, description="Canary KV tokens / baseline KV tokens")


class HistoryEntry(Model):
    phase: str
    at: str
    reason: str
    message: str = ""


class NotificationsStatus(Model):
    """Webhook deliveries (core.notifications): recorded after the receiver's 2xx, so a restart repeats none."""

    delivered: list[str] = []  # TARGET/UID/PHASE/AT, one per transition per target still in history
    last_error: str | None = None  # the latest failed delivery per target, until that target accepts one


class KVCalibrationStatus(Model):
    phase: str = Phase.PENDING
    message: str | None = None
    observed_generation: int | None = None
    phase_started_at: str | None = None
    conditions: list[Condition] = []
    calibration: CalibrationStatus = CalibrationStatus()
    verification: VerificationStatus = VerificationStatus()
    canary: CanaryStatus = CanaryStatus()
    analysis: AnalysisStatus = AnalysisStatus()
    history: list[HistoryEntry] = []
    serving: ServingStatus = ServingStatus()
    capacity: CapacityStatus = CapacityStatus()
    notifications: NotificationsStatus = NotificationsStatus()
