"""Attention layers whose KV cache stays in BF16 (vLLM's --kv-cache-dtype-skip-layers): the layers of
spec.serving.canary.protectedLayers, plus, with fromReport, the calibration report's sensitive layers as the
calibration Job summarised them (status.calibration.sensitiveLayers). The canary, the promoted baseline and the
verification Job all read the one resolved list."""

from kvcal import vllm_flags
from kvcal.core.problems import NeedsFix
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import CalibrationStatus


def with_report_layers(spec: KVCalibrationSpec, calibration: CalibrationStatus) -> KVCalibrationSpec:
    """The spec the builders see: fromReport replaced by the report's layers, once the calibration is known."""
    protected = spec.serving.canary.protected_layers
    if not protected.from_report or calibration.sensitive_layers is None:
        return spec
    layers = sorted(set(protected.layers) | set(calibration.sensitive_layers))
    # model_copy, not validation: the union may exceed the spec's own list limit, and both halves were validated.
    resolved = protected.model_copy(update={"layers": layers, "from_report": False})
    canary = spec.serving.canary.model_copy(update={"protected_layers": resolved})
    serving = spec.serving.model_copy(update={"canary": canary})
    return spec.model_copy(update={"serving": serving})


def skip_layers(spec: KVCalibrationSpec) -> list[int]:
    """Sorted layer indices to keep in BF16; refuses a fromReport that no calibration summary resolved."""
    protected = spec.serving.canary.protected_layers
    if protected.from_report:
        raise NeedsFix(
            "spec.serving.canary.protectedLayers.fromReport: the calibration summary lists no sensitive layers "
            "(status.calibration.sensitiveLayers; calibrated by an older kvcal?): recalibrate or list the layers"
        )
    return sorted(protected.layers)


def skip_layer_args(spec: KVCalibrationSpec) -> list[str]:
    """vLLM arguments for `skip_layers` (none when no layer is protected)."""
    layers = skip_layers(spec)
    return [vllm_flags.KV_CACHE_DTYPE_SKIP_LAYERS.name, *(str(layer) for layer in layers)] if layers else []
