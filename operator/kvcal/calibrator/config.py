"""CalibrationConfig: the calibration Job's config file (JSON, camelCase, written by the operator) and the parsed
form of `kvcal calibrate` flags. One model for both, so the CLI and the Job cannot drift apart."""

import math
from itertools import pairwise
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from kvcal.models.base import Model
from kvcal.models.spec import OBSERVERS

DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")
# Without an explicit `samples`, take every available sample up to this many (the bundled demo set has 38 records).
DEFAULT_MAX_SAMPLES = 512


class CalibrationConfig(Model):
    model_dir: Path = Field(description="BF16 Hugging Face checkpoint folder (config.json, safetensors, tokenizer)")
    data: Path = Field(description="JSONL file, or a folder of *.jsonl, with {'messages': [...]} or {'text': ...}")
    holdout_data: Path | None = Field(
        default=None, description="Separate held-out JSONL; when unset, holdoutFraction of `data` is held out"
    )
    out: Path = Field(description="Output folder: calibrated checkpoint + kvcal-report.json + report.md + plots")
    strategy: Literal["tensor", "head"] = "tensor"
    observer: Literal["static-minmax", "minmax", "mse"] = "static-minmax"
    samples: int | None = Field(
        default=None, ge=1, description=f"Calibration samples (default: all available, up to {DEFAULT_MAX_SAMPLES})"
    )
    max_seq_length: int = Field(default=4096, ge=16, description="Longer samples are truncated (and counted)")
    holdout_fraction: float = Field(default=0.1, gt=0, le=0.5)
    holdout_samples: int | None = Field(
        default=None,
        ge=1,
        description="Held-out samples scored (default: holdoutFraction's share of the samples used)",
    )
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        description="Longest context the service serves (vLLM --max-model-len), to judge the calibration data's "
        "length coverage; default: the model's max_position_embeddings",
    )
    seed: int = 0
    pipeline: Literal["auto", "basic", "sequential"] = "auto"
    query_scales: bool = Field(
        default=False, description="Also calibrate q_scale (llm-compressor's attention scheme): FP8 attention reads it"
    )
    rounding: Literal["nearest", "toward-zero"] = Field(
        default="nearest", description="FP8 rounding emulated in the report: CUDA kernels (nearest) or vLLM CPU"
    )
    length_buckets: list[int] = Field(
        default=[256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072],
        description="Upper bounds (tokens) of the length buckets used to sample toward lengthDistribution",
    )
    length_distribution: dict[int, float] | None = Field(
        default=None,
        description="Target share of samples per bucket upper bound; default: the pool's own length distribution",
    )
    oneshot: bool = Field(
        default=False,
        description="Run llm-compressor's oneshot even where one plain forward pass gives the same checkpoint",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="Where the model computes: the visible CUDA devices when there are any (one, several, or layer "
        "by layer through the first), else the CPU",
    )
    deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Refuse before the model loads a calibration estimated to need longer (default: no limit; in "
        "the Job, its activeDeadlineSeconds, passed as KVCAL_DEADLINE_SECONDS)",
    )
    model_revision: str | None = Field(
        default=None, description="The model's revision (spec.model.revision), recorded in the report and status"
    )
    plots: bool = True
    force: bool = Field(default=False, description="Replace a non-empty output folder")
    termination_log: Path | None = Field(default=None, description="Where the <=4096-byte summary JSON goes")

    @field_validator("length_buckets")
    @classmethod
    def _increasing(cls, v: list[int]) -> list[int]:
        if not v or any(b <= a for a, b in pairwise(v)) or v[0] <= 0:
            raise ValueError("lengthBuckets: must be positive, strictly increasing token counts")
        return v

    @model_validator(mode="after")
    def _distribution(self) -> "CalibrationConfig":
        dist = self.length_distribution
        if dist is not None:
            unknown = sorted(set(dist) - set(self.length_buckets))
            if unknown:
                raise ValueError(f"lengthDistribution: keys {unknown} are not in lengthBuckets {self.length_buckets}")
            if any(w < 0 for w in dist.values()) or sum(dist.values()) <= 0:
                raise ValueError("lengthDistribution: weights must be >= 0 with a positive sum")
        return self

    def sample_count(self, available: int) -> int:
        """Samples to calibrate on: the explicit `samples` (checked against `available` by the caller), else all
        available up to DEFAULT_MAX_SAMPLES."""
        return self.samples if self.samples is not None else min(available, DEFAULT_MAX_SAMPLES)

    def holdout_count(self, calibration_samples: int, available: int) -> int:
        """Held-out samples to score: the explicit `holdoutSamples`, else holdoutFraction's share of the samples used
        (calibration + held-out), so that the report's four passes stay a fixed share of the calibration pass however
        large the dataset (the split holds out holdoutFraction of every record); at most `available`."""
        if self.holdout_samples is not None:
            return min(self.holdout_samples, available)
        per_calibration_sample = self.holdout_fraction / (1 - self.holdout_fraction)
        # round() first: 9 * (0.1 / 0.9) is 1.0000000000000002 in floating point, which must not become 2.
        return min(available, max(1, math.ceil(round(calibration_samples * per_calibration_sample, 9))))

    @property
    def compressor_observer(self) -> str:
        """llm-compressor's name for the observer."""
        return OBSERVERS[self.observer]

    @property
    def compressor_strategy(self) -> str:
        return "attn_head" if self.strategy == "head" else "tensor"
