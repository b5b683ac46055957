"""Held-out evaluation: per layer x KV head numerics of four scale sets, and end-to-end NLL / KL / top-1 agreement of
BF16, FP8 with scale 1.0, FP8 calibrated per tensor and FP8 calibrated per head — K/V replaced by what an FP8 cache
returns, on the same held-out samples."""

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm import tqdm

from kvcal.calibrator.data import Sample
from kvcal.calibrator.placement import input_device
from kvcal.calibrator.quant import ErrorStats, Rounding, as_saved, scale_for_absmax
from kvcal.calibrator.taps import KINDS, Tap, TensorStats, attach, detach

log = logging.getLogger(__name__)

ScaleSet = dict[str, list[torch.Tensor]]  # kind -> per-layer float32 scales, shape (1,) or (heads, 1, 1)
VARIANTS = ("bf16", "fp8-default", "fp8-tensor", "fp8-head")
KEEP_BUDGET_BYTES = 1 << 30  # holdout K/V kept for the oracle's numerics up to this size, else one more BF16 pass
_LOGIT_CHUNK = 256


def per_head_scales(observed: dict[tuple[int, str], TensorStats], layers: int) -> ScaleSet:
    """Static min-max per KV head, rounded as saved (bf16)."""
    return {
        kind: [as_saved(scale_for_absmax(observed[(i, kind)].absmax)).view(-1, 1, 1) for i in range(layers)]
        for kind in KINDS
    }


def per_tensor_scales(observed: dict[tuple[int, str], TensorStats], layers: int) -> ScaleSet:
    return {
        kind: [as_saved(scale_for_absmax(observed[(i, kind)].absmax.max())).view(1) for i in range(layers)]
        for kind in KINDS
    }


def unit_scales(layers: int) -> ScaleSet:
    return {kind: [torch.ones(1) for _ in range(layers)] for kind in KINDS}


class Switch:
    """One hook per layer for the whole evaluation; which Tap it feeds is switched per pass."""

    def __init__(self) -> None:
        self.tap: Tap | None = None

    def __call__(self, layer: int, kind: str, x: torch.Tensor) -> torch.Tensor | None:
        return self.tap(layer, kind, x) if self.tap is not None else None

    @contextmanager
    def using(self, tap: Tap | None) -> Iterator[None]:
        self.tap = tap
        try:
            yield
        finally:
            self.tap = None


@dataclass
class VariantMetrics:
    nll_sum: float = 0.0
    kl_sum: float = 0.0
    agree: int = 0
    tokens: int = 0

    def as_dict(self) -> dict[str, float]:
        n = max(self.tokens, 1)
        return {"nll": self.nll_sum / n, "kl": self.kl_sum / n, "top1": self.agree / n}


@dataclass
class HoldoutResult:
    observed: dict[tuple[int, str], TensorStats]
    errors: dict[tuple[str, int, str], ErrorStats]
    oracle: ScaleSet
    metrics: dict[str, VariantMetrics] = field(default_factory=dict)
    tokens: int = 0


def _hidden(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    out = model.get_decoder()(input_ids=ids, use_cache=False)  # type: ignore[operator]
    hidden: torch.Tensor = out.last_hidden_state[0]
    return hidden


def _score_tokens(
    head: torch.Tensor, hiddens: dict[str, torch.Tensor], targets: torch.Tensor, metrics: dict[str, VariantMetrics]
) -> None:
    """NLL of the next token, KL(BF16 || variant) and top-1 agreement with BF16, a chunk of positions at a time.

    Logits come from the bf16 hidden states through a float32 copy of the LM head: bf16 GEMMs are ~3x slower on CPUs
    without bf16 instructions, and the variants differ only in K/V, so the comparison is unaffected."""
    n = targets.numel()
    for start in range(0, n, _LOGIT_CHUNK):
        sl = slice(start, min(start + _LOGIT_CHUNK, n))
        t = targets[sl]
        ref = torch.log_softmax(hiddens["bf16"][sl].float() @ head.T, dim=-1)
        ref_prob = ref.exp()  # once per chunk: the exp over the vocabulary costs as much as a log-softmax
        ref_top = ref.argmax(dim=-1)
        for name, h in hiddens.items():
            m = metrics[name]
            m.tokens += t.numel()
            if name == "bf16":  # against itself: KL 0 and full agreement, exactly
                m.nll_sum -= float(ref.gather(1, t.unsqueeze(1)).sum())
                m.agree += t.numel()
                continue
            lp = torch.log_softmax(h[sl].float() @ head.T, dim=-1)
            m.nll_sum -= float(lp.gather(1, t.unsqueeze(1)).sum())
            m.kl_sum += float((ref_prob * (ref - lp)).sum())
            m.agree += int((lp.argmax(dim=-1) == ref_top).sum())


@contextmanager
def quantization_disabled(model: nn.Module) -> Iterator[None]:
    """llm-compressor's DisableQuantization, from compressed-tensors alone (llm-compressor's import costs seconds)."""
    from compressed_tensors.quantization import disable_quantization, enable_quantization

    model.apply(disable_quantization)
    try:
        yield
    finally:
        model.apply(enable_quantization)


def evaluate_holdout(
    model: nn.Module,
    samples: Sequence[Sample],
    per_tensor: ScaleSet,
    per_head: ScaleSet,
    heads: int,
    rounding: Rounding = "nearest",
) -> HoldoutResult:
    """Four passes per held-out sample: BF16 (with statistics), FP8 at scale 1.0, per tensor, per head."""
    layers = len(per_tensor["k"])
    head_dim = int(getattr(model.config, "head_dim", 0) or 128)
    kv_bytes = sum(len(s.input_ids) for s in samples) * layers * 2 * heads * head_dim * 2
    keep = kv_bytes <= KEEP_BUDGET_BYTES
    stats_tap = Tap(
        heads,
        score={"default": unit_scales(layers), "tensor": per_tensor, "head": per_head},
        rounding=rounding,
        keep=keep,
    )
    fp8_taps = {
        "fp8-default": Tap(heads, stats=False, replace=unit_scales(layers), rounding=rounding),
        "fp8-tensor": Tap(heads, stats=False, replace=per_tensor, rounding=rounding),
        "fp8-head": Tap(heads, stats=False, replace=per_head, rounding=rounding),
    }
    metrics = {v: VariantMetrics() for v in VARIANTS}
    switch = Switch()
    lm_head = model.get_output_embeddings()  # type: ignore[operator]
    if not isinstance(lm_head, nn.Linear) or lm_head.bias is not None:
        raise ValueError(f"unsupported LM head {type(lm_head).__name__}: expected a bias-free nn.Linear")
    from compressed_tensors.offload import get_execution_device

    # Where the LM head computes (an offloaded head's weight is onloaded there on access); the last hidden state
    # is moved there, the usual case being that both are on the same device already.
    head_device = torch.device(get_execution_device(lm_head))
    head = lm_head.weight.detach().to(head_device, torch.float32)
    device = input_device(model)
    handles = attach(model, switch)
    tokens = 0
    try:
        with torch.no_grad(), quantization_disabled(model):  # our taps quantize; compressed-tensors must not
            for s in tqdm(samples, desc="holdout (BF16 / FP8 1.0 / per tensor / per head)", unit="sample"):
                ids = torch.tensor([s.input_ids], device=device)
                hiddens: dict[str, torch.Tensor] = {}
                with switch.using(stats_tap):
                    hiddens["bf16"] = _hidden(model, ids)
                for name, tap in fp8_taps.items():
                    with switch.using(tap):
                        hiddens[name] = _hidden(model, ids)
                shifted = {k: h[:-1].to(head_device) for k, h in hiddens.items()}
                _score_tokens(head, shifted, ids[0, 1:].to(head_device), metrics)
                tokens += ids.numel()
            stats_tap.to_cpu()
            oracle = per_head_scales(stats_tap.observed, layers)
            errors = dict(stats_tap.errors)
            errors.update(_oracle_errors(model, samples, stats_tap, oracle, switch, heads, rounding))
    finally:
        detach(handles)
    return HoldoutResult(stats_tap.observed, errors, oracle, metrics, tokens)


def _oracle_errors(
    model: nn.Module,
    samples: Sequence[Sample],
    stats_tap: Tap,
    oracle: ScaleSet,
    switch: Switch,
    heads: int,
    rounding: Rounding,
) -> dict[tuple[str, int, str], ErrorStats]:
    """Numerics of the oracle (the holdout's own max): from the kept K/V, or one more BF16 pass when too big."""
    scorer = Tap(heads, stats=False, score={"oracle": oracle}, rounding=rounding)
    if stats_tap.keep:
        for (layer, kind), xs in stats_tap.kept.items():
            for x in xs:
                scorer(layer, kind, x)
        stats_tap.kept.clear()
    else:
        log.info("holdout K/V too large to keep: one more BF16 pass for the oracle's numerics")
        device = input_device(model)
        with switch.using(scorer):
            for s in tqdm(samples, desc="holdout (oracle numerics)", unit="sample"):
                _hidden(model, torch.tensor([s.input_ids], device=device))
    scorer.to_cpu()
    return scorer.errors
