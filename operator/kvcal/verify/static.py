"""`kvcal verify CHECKPOINT_DIR`: checks, without vLLM, that a checkpoint carries FP8 K/V scales vLLM will load.

`check()` is pure (config dict + scale tensors + optional calibration report in, problems out); `load()` does the
file reading. Every problem names the layer and the tensor, and says what vLLM would do and how to fix it."""

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcal.verify import names
from kvcal.verify.digest import weights_digest
from kvcal.verify.problems import Problem
from kvcal.verify.tensors import Tensor, index_checkpoint, load_tensors

FP8_E4M3_MAX = 448.0
# A scale saved in bf16 is the float32 value rounded to 8 significant bits: relative error up to 2**-8.
BF16_REL_TOL = 2.0**-8
STRATEGIES = ("tensor", "attn_head")
REPORT_NAME = "kvcal-report.json"


@dataclass(frozen=True)
class ModelShape:
    layers: int
    kv_heads: int


@dataclass
class LayerScales:
    k: tuple[float, ...] = ()
    v: tuple[float, ...] = ()
    q: tuple[float, ...] = ()


@dataclass
class StaticResult:
    shape: ModelShape
    strategy: str | None
    scales: dict[int, LayerScales] = field(default_factory=dict)  # as vLLM will load them (after remapping)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def model_shape(config: Mapping[str, Any]) -> ModelShape:
    text = config.get("text_config") or config  # multimodal configs nest the decoder's
    try:
        layers = int(text["num_hidden_layers"])
        kv_heads = int(text.get("num_key_value_heads") or text["num_attention_heads"])
    except KeyError as err:
        raise ValueError(
            f"config.json: {err.args[0]} is missing: cannot tell how many attention layers to expect"
        ) from None
    return ModelShape(layers, kv_heads)


def check_scheme(config: Mapping[str, Any]) -> tuple[str | None, list[Problem]]:
    """The kv_cache_scheme's strategy, and what is wrong with the scheme."""
    where = "config.json"
    qc = config.get("quantization_config")
    if not isinstance(qc, Mapping) or not isinstance(qc.get("kv_cache_scheme"), Mapping):
        return None, [
            Problem(
                "scheme-missing",
                "quantization_config.kv_cache_scheme is missing: vLLM ignores k_scale/v_scale without it and runs "
                "FP8 KV at scale 1.0; save the checkpoint with llm-compressor's kv_cache_scheme",
                tensor=where,
            )
        ]
    scheme = qc["kv_cache_scheme"]
    problems = []
    if qc.get("quant_method") != "compressed-tensors":
        problems.append(
            Problem(
                "scheme",
                f"quantization_config.quant_method is {qc.get('quant_method')!r}, expected 'compressed-tensors' "
                "(the format whose kv_cache_scheme vLLM reads)",
                tensor=where,
            )
        )
    expected = {"num_bits": 8, "type": "float", "dynamic": False}
    for key, want in expected.items():
        if scheme.get(key) != want:
            problems.append(
                Problem(
                    "scheme",
                    f"kv_cache_scheme.{key} is {scheme.get(key)!r}, expected {want!r} (FP8 E4M3 with static scales)",
                    tensor=where,
                )
            )
    if scheme.get("symmetric") is False:
        problems.append(
            Problem("scheme", "kv_cache_scheme.symmetric is false: FP8 KV scales are symmetric", tensor=where)
        )
    strategy = scheme.get("strategy")
    if strategy not in STRATEGIES:
        problems.append(
            Problem("scheme", f"kv_cache_scheme.strategy is {strategy!r}, expected one of {STRATEGIES}", tensor=where)
        )
        strategy = None
    return strategy, problems


def _shape_ok(shape: tuple[int, ...], strategy: str | None, kv_heads: int) -> bool:
    if strategy == "attn_head":
        return shape in ((kv_heads, 1, 1), (kv_heads,))
    if strategy == "tensor":
        return shape in ((1,), ())
    return shape in ((1,), (), (kv_heads, 1, 1), (kv_heads,))


def _shape_text(strategy: str | None, kv_heads: int) -> str:
    if strategy == "attn_head":
        return f"({kv_heads}, 1, 1) or ({kv_heads},) for strategy attn_head with {kv_heads} KV heads"
    return "(1,) or () for strategy tensor"


def check_values(tensor: Tensor, layer: int, strategy: str | None, kv_heads: int) -> list[Problem]:
    problems = []
    if not _shape_ok(tensor.shape, strategy, kv_heads):
        problems.append(
            Problem("shape", f"shape {tensor.shape}, expected {_shape_text(strategy, kv_heads)}", layer, tensor.name)
        )
    bad = [x for x in tensor.values if not math.isfinite(x)]
    if bad:
        problems.append(Problem("not-finite", f"not finite: {bad[0]}", layer, tensor.name))
    elif any(x <= 0 for x in tensor.values):
        low = min(tensor.values)
        problems.append(Problem("not-positive", f"not positive: {low} (a scale must be > 0)", layer, tensor.name))
    return problems


def calibration_maxima(report: Mapping[str, Any]) -> dict[tuple[int, str], tuple[float, ...]]:
    """Per (layer, 'k'|'v'): the largest |K| or |V| the calibration observed, per KV head or one value.

    kvcal.calibrator.report (version 1): `layers: [{layer, k: [{head, scale, calibration: {absmax, ...}}], v: ...}]`.
    Read defensively (a flat `kAbsMax`/`vAbsMax` per layer works too): a report we cannot read checks nothing."""
    out: dict[tuple[int, str], tuple[float, ...]] = {}
    layers = report.get("layers")
    if not isinstance(layers, list):
        return out
    for entry in layers:
        if not isinstance(entry, Mapping):
            continue
        index = entry.get("layer", entry.get("index"))
        if not isinstance(index, int):
            continue
        for kind in ("k", "v"):
            heads = entry.get(kind)
            if isinstance(heads, list):
                maxima = [_head_absmax(h) for h in heads]
                if maxima and all(m is not None for m in maxima):
                    out[(index, kind)] = tuple(float(m) for m in maxima if m is not None)
                continue
            value = _first(entry, (f"{kind}AbsMax", f"{kind}_absmax", f"{kind}Absmax", f"{kind}_abs_max"))
            if isinstance(value, int | float):
                out[(index, kind)] = (float(value),)
    return out


def _head_absmax(head: Any) -> float | None:
    calibration = head.get("calibration") if isinstance(head, Mapping) else None
    value = calibration.get("absmax") if isinstance(calibration, Mapping) else None
    return float(value) if isinstance(value, int | float) else None


def _first(entry: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if key in entry:
            return entry[key]
    return None


def check_coverage(scale: tuple[float, ...], absmax: tuple[float, ...], layer: int, tensor: str) -> Problem | None:
    """A scale must map the largest calibration value into FP8's range: absmax / 448 <= scale (bf16-rounded)."""
    if len(absmax) != len(scale):  # per-head maxima vs one scale, or the other way round: compare the largest
        absmax, scale = (max(absmax),), (max(scale),)
    for head, (amax, s) in enumerate(zip(absmax, scale, strict=True)):
        need = amax / FP8_E4M3_MAX
        if s * (1 + BF16_REL_TOL) < need:
            which = f" head {head}" if len(scale) > 1 else ""
            return Problem(
                "clipped",
                f"scale{which} {s:.6g} is below the calibration max {amax:.6g}/448 = {need:.6g}: values up to "
                f"{amax:.6g} seen in calibration clip to {s * FP8_E4M3_MAX:.6g} (use the static_minmax observer)",
                layer,
                tensor,
            )
    return None


def check_query(config: Mapping[str, Any], tensors: Mapping[str, Tensor], result: StaticResult, required: bool) -> None:
    """q_scale per layer: finite and positive where present, present everywhere when `required`; and an attention
    config group in the one form vLLM 0.32 accepts (a single target naming the attention class)."""
    qc = config.get("quantization_config")
    groups = qc.get("config_groups") if isinstance(qc, Mapping) else None
    for name, group in (groups or {}).items():
        targets = group.get("targets") if isinstance(group, Mapping) else None
        if not isinstance(targets, list) or not any("att" in str(t).lower() for t in targets):
            continue
        if len(targets) != 1 or not str(targets[0]).endswith("Attention"):
            result.problems.append(
                Problem(
                    "scheme",
                    f"config_groups.{name}.targets {targets}: vLLM 0.32 skips attention quantization only for a "
                    "group whose one target is the attention class (e.g. LlamaAttention), and fails to load this",
                    tensor="config.json",
                )
            )
    found = {layer: t for name, t in tensors.items() if (layer := names.query_layer(name)) is not None}
    prefix = names.layer_prefix(list(tensors))
    for layer in range(result.shape.layers):
        tensor = found.get(layer)
        if tensor is None:
            if required:
                result.problems.append(
                    Problem(
                        "q-missing",
                        "missing: FP8 attention backends (FlashAttention 3, FlashInfer) then quantize Q with k_scale "
                        "(calibrate with queryScales)",
                        layer,
                        f"{prefix}layers.{layer}.self_attn.q_scale",
                    )
                )
            continue
        result.scales.setdefault(layer, LayerScales()).q = tensor.values
        bad = [x for x in tensor.values if not math.isfinite(x) or x <= 0]
        if bad:
            result.problems.append(
                Problem("not-positive", f"q_scale {bad[0]} is not finite and positive", layer, tensor.name)
            )


def check(
    config: Mapping[str, Any],
    tensors: Mapping[str, Tensor],
    report: Mapping[str, Any] | None = None,
    require_query: bool = False,
) -> StaticResult:
    shape = model_shape(config)
    strategy, problems = check_scheme(config)
    result = StaticResult(shape, strategy, problems=problems)
    prefix = names.layer_prefix(list(tensors))
    found: dict[tuple[int, str], list[tuple[names.ScaleName, Tensor]]] = {}
    for name, tensor in tensors.items():
        scale_name = names.classify(name)
        if scale_name is None:
            continue
        for kind in scale_name.kinds:
            found.setdefault((scale_name.layer, kind), []).append((scale_name, tensor))
    for (layer, _kind), entries in sorted(found.items()):
        if layer >= shape.layers:
            result.problems.append(
                Problem(
                    "extra",
                    f"layer {layer} does not exist: config.json has {shape.layers} layers",
                    layer,
                    entries[0][1].name,
                )
            )
    maxima = calibration_maxima(report) if report else {}
    kind_: names.Kind
    for layer in range(shape.layers):
        scales = result.scales.setdefault(layer, LayerScales())
        for kind_ in ("k", "v"):
            want = names.canonical_name(prefix, layer, kind_)
            entries = found.get((layer, kind_), [])
            for scale_name, tensor in entries:
                if scale_name.fate != "canonical" and (kind_ == scale_name.kinds[0]):  # once per tensor
                    result.problems.append(
                        Problem(
                            "legacy-name",
                            f"legacy name ({scale_name.fate} by vLLM): {scale_name.why}",
                            layer,
                            tensor.name,
                        )
                    )
            loaded = [(n, t) for n, t in entries if n.fate != "dropped"]
            if not entries:
                result.problems.append(
                    Problem("missing", "missing: vLLM will run this layer's FP8 KV at scale 1.0", layer, want)
                )
                continue
            if not loaded:
                continue
            tensor = loaded[0][1]
            result.problems.extend(check_values(tensor, layer, strategy, shape.kv_heads))
            if kind_ == "k":
                scales.k = tensor.values
            else:
                scales.v = tensor.values
            amax = maxima.get((layer, kind_))
            if amax and tensor.values and all(math.isfinite(x) for x in tensor.values):
                clipped = check_coverage(tensor.values, amax, layer, tensor.name)
                if clipped:
                    result.problems.append(clipped)
    check_query(config, tensors, result, require_query)
    values = [x for s in result.scales.values() for x in (*s.k, *s.v)]
    if values and all(x == 1.0 for x in values):
        result.problems.append(
            Problem(
                "all-default",
                f"all {len(values)} K/V scale values are 1.0: the default, not a calibration (run kvcal calibrate)",
            )
        )
    return result


def load(directory: Path) -> tuple[dict[str, Any], dict[str, Tensor], dict[str, Any] | None]:
    """config.json, the K/V scale tensors (only those, however large the checkpoint), and kvcal-report.json if any."""
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: not found (CHECKPOINT_DIR must be a Hugging Face model folder)")
    config = json.loads(config_path.read_text())
    infos = index_checkpoint(directory)
    wanted = (info for name, info in infos.items() if names.classify(name) or names.query_layer(name) is not None)
    scales = load_tensors(wanted)
    report_path = directory / REPORT_NAME
    report = json.loads(report_path.read_text()) if report_path.is_file() else None
    return config, scales, report if isinstance(report, dict) else None


def recorded_artifact_hash(report: Mapping[str, Any] | None) -> str | None:
    """The report's `provenance.artifactHash` (the calibrator's field artifact_hash, written camelCase): the
    weights_digest of the folder it saved."""
    provenance = report.get("provenance") if report else None
    if not isinstance(provenance, Mapping):
        return None
    recorded = _first(provenance, ("artifactHash", "artifact_hash"))
    return recorded if isinstance(recorded, str) and recorded else None


def check_unchanged(recorded: str, actual: str) -> Problem | None:
    """The checkpoint's weights must be the ones calibrated: a folder rewritten in place (same path, other weights)
    would otherwise carry scales computed for a different model."""
    if actual == recorded:
        return None
    return Problem(
        "changed-in-place",
        f"the weights and config.json hash to sha256 {actual[:12]}, but the calibrator recorded {recorded[:12]} "
        "when it saved this checkpoint: it was changed after calibration, so its scales may not fit it (recalibrate, "
        "or restore the calibrated files)",
        tensor=REPORT_NAME,
    )


def verify(directory: Path, require_query: bool = False) -> StaticResult:
    config, scales, report = load(directory)
    result = check(config, scales, report, require_query)
    recorded = recorded_artifact_hash(report)
    if recorded:  # hashing reads every weight file: only when there is a hash to compare with
        changed = check_unchanged(recorded, weights_digest(directory))
        if changed:
            result.problems.append(changed)
    return result
