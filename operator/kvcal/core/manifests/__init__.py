"""Pure builders of every child manifest (dicts as the API takes them), checked against tests/golden/."""

from kvcal.core.manifests.canary import (
    BaselineError,
    build_canary_service,
    build_canary_workload,
    is_promoted,
)
from kvcal.core.manifests.common import (
    LABEL_CALIBRATION,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    Manifest,
    Owner,
    calibration_job_name,
    canary_name,
    verification_job_name,
)
from kvcal.core.manifests.jobs import build_calibration_configmap, build_calibration_job, build_verification_job
from kvcal.core.manifests.promotion import FIELD_MANAGER, build_promoted_baseline

__all__ = [
    "FIELD_MANAGER",
    "LABEL_CALIBRATION",
    "LABEL_COMPONENT",
    "LABEL_MANAGED_BY",
    "MANAGED_BY",
    "BaselineError",
    "Manifest",
    "Owner",
    "build_calibration_configmap",
    "build_calibration_job",
    "build_canary_service",
    "build_canary_workload",
    "build_promoted_baseline",
    "build_verification_job",
    "calibration_job_name",
    "canary_name",
    "is_promoted",
    "verification_job_name",
]
