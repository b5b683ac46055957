"""KVCalibration.spec. Defaults here equal the CRD's defaults (a test checks both agree)."""

import re
from itertools import pairwise
from typing import Literal

from pydantic import Field, field_validator, model_validator

from kvcal.models.base import Model

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")

# Observer names as the CRD spells them -> llm-compressor's names.
OBSERVERS: dict[str, str] = {"static-minmax": "static_minmax", "minmax": "minmax", "mse": "mse"}
# Attention backends of vLLM that honour per-KV-head scales.
PER_HEAD_BACKENDS = frozenset({"FLASH_ATTN"})


def parse_duration(value: str) -> float:
    """'90s', '2m', '1h30m' -> seconds. Raises ValueError naming the accepted form."""
    m = _DURATION.match(value.strip())
    if not value.strip() or m is None or not any(m.groups()):
        raise ValueError(f"invalid duration {value!r}: use e.g. '30s', '2m', '1h30m'")
    h, mi, s = (int(g) if g else 0 for g in m.groups())
    return float(h * 3600 + mi * 60 + s)


class ModelRef(Model):
    source: str = Field(description="Where the BF16 checkpoint lives: pvc://CLAIM/PATH, hostpath:///PATH or s3://")
    revision: str | None = Field(default=None, description="Revision (commit sha or tag) of the checkpoint")


class Dataset(Model):
    source: str = Field(description="configmap://NAME/KEY, pvc://CLAIM/PATH or s3://BUCKET/KEY of a JSONL file")
    format: Literal["chat", "text"] = "chat"


class JobSpec(Model):
    image: str | None = None
    resources: dict[str, dict[str, str]] | None = None
    node_selector: dict[str, str] | None = None
    tolerations: list[dict[str, object]] | None = None
    active_deadline_seconds: int = 3600
    backoff_limit: int = 1


class CalibrationSpec(Model):
    dataset: Dataset
    samples: int = 512
    max_seq_length: int = 4096
    holdout_fraction: float = 0.1
    seed: int = 0
    strategy: Literal["tensor", "head"] = "tensor"
    observer: Literal["static-minmax", "minmax", "mse"] = "static-minmax"
    pipeline: Literal["auto", "basic", "sequential"] = "auto"
    output: str
    job: JobSpec = JobSpec()


class BaselineRef(Model):
    deployment: str
    service: str
    container: str | None = Field(default=None, description="Container running vLLM; default: the first one")


class CanarySpec(Model):
    replicas: int = 1
    kv_cache_dtype: Literal["fp8", "fp8_e4m3"] = "fp8_e4m3"
    attention_backend: str | None = None
    extra_args: list[str] = []


class TrafficSpec(Model):
    router: Literal["replicas", "gateway-api", "none"] = "replicas"
    steps: list[int] = [10, 50]
    http_route: str | None = None
    # After the router reports 0% on the canary, how long in-flight requests get before the canary is deleted.
    drain_delay: str = "30s"

    @field_validator("drain_delay")
    @classmethod
    def _duration(cls, v: str) -> str:
        parse_duration(v)
        return v

    @property
    def drain_delay_seconds(self) -> float:
        return parse_duration(self.drain_delay)


class ServingSpec(Model):
    baseline: BaselineRef
    canary: CanarySpec = CanarySpec()
    traffic: TrafficSpec = TrafficSpec()


class PrometheusRef(Model):
    address: str = "http://prometheus.monitoring:9090"


class LatencyCheck(Model):
    metric: Literal["ttft", "itl", "e2e"]
    quantile: float = 0.95
    max_regression: float = 0.10
    # Absolute noise floor: a canary within this many seconds of the baseline passes whatever the ratio.
    noise_floor_seconds: float = 0.005


class QualitySpec(Model):
    suite: Literal["builtin", "configmap"] = "builtin"
    config_map: str | None = None
    max_accuracy_drop: float = 0.01
    min_token_agreement: float = 0.97


def _default_latency() -> list[LatencyCheck]:
    return [LatencyCheck(metric="ttft"), LatencyCheck(metric="itl"), LatencyCheck(metric="e2e")]


class AnalysisSpec(Model):
    prometheus: PrometheusRef = PrometheusRef()
    interval: str = "60s"
    warmup: str = "120s"
    min_requests: int = 50
    successful_intervals: int = 5
    failure_limit: int = 2
    inconclusive_limit: int = 3
    consecutive_error_limit: int = 4
    max_error_rate: float = 0.01
    latency: list[LatencyCheck] = Field(default_factory=_default_latency)
    quality: QualitySpec = QualitySpec()

    @field_validator("interval", "warmup")
    @classmethod
    def _duration(cls, v: str) -> str:
        parse_duration(v)
        return v

    @property
    def interval_seconds(self) -> float:
        return parse_duration(self.interval)

    @property
    def warmup_seconds(self) -> float:
        return parse_duration(self.warmup)


class PromotionSpec(Model):
    mode: Literal["auto", "manual"] = "auto"


class KVCalibrationSpec(Model):
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
        steps = self.serving.traffic.steps
        if any(b <= a for a, b in pairwise(steps)) or any(not 0 < s <= 100 for s in steps):
            raise ValueError("spec.serving.traffic.steps: must be strictly increasing percentages in (0, 100]")
        if self.serving.traffic.router == "gateway-api" and not self.serving.traffic.http_route:
            raise ValueError("spec.serving.traffic.httpRoute: required when router is gateway-api")
        if not 0 < self.calibration.holdout_fraction <= 0.5:
            raise ValueError("spec.calibration.holdoutFraction: must be in (0, 0.5]")
        return self
