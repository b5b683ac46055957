"""Pydantic models of the KVCalibration resource, parsed at the handler boundary; crds/ is generated from them
(python -m kvcal.generated)."""

from kvcal.models.spec import (
    AnalysisSpec,
    CalibrationSpec,
    KVCalibrationSpec,
    LatencyCheck,
    parse_duration,
)
from kvcal.models.status import (
    Condition,
    KVCalibrationStatus,
    Measurement,
    Phase,
)

__all__ = [
    "AnalysisSpec",
    "CalibrationSpec",
    "Condition",
    "KVCalibrationSpec",
    "KVCalibrationStatus",
    "LatencyCheck",
    "Measurement",
    "Phase",
    "parse_duration",
]
