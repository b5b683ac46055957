"""Checks that run before any heavy work (model load, forward passes): each failure names the problem and the fix."""

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcal.calibrator.config import CalibrationConfig

WEIGHT_SUFFIXES = (".safetensors", ".bin")
DISK_MARGIN_BYTES = 64 << 20


class InputError(ValueError):
    """Bad input to the calibrator: the message says what is wrong and how to fix it."""


@dataclass(frozen=True)
class ModelInfo:
    config: dict[str, Any]
    weight_bytes: int
    max_positions: int
    layers: int
    kv_heads: int
    head_dim: int
    hidden_size: int = 0
    intermediate_size: int = 0
    vocab_size: int = 0


def inspect_model(model_dir: Path) -> ModelInfo:
    if not model_dir.is_dir():
        raise InputError(f"model {model_dir}: folder not found; pass a Hugging Face checkpoint folder (config.json)")
    cfg_path = model_dir / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise InputError(f"model {model_dir}: no config.json; is this a Hugging Face checkpoint folder?") from e
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"model {cfg_path}: unreadable ({e}); check the file and its permissions") from e
    if not isinstance(cfg, dict):
        raise InputError(f"model {cfg_path}: not a JSON object")
    text = cfg.get("text_config") or cfg
    archs = cfg.get("architectures") or []
    if not any(str(a).endswith("ForCausalLM") for a in archs):
        raise InputError(
            f"model {model_dir}: unsupported architecture {archs or 'unknown'}; the calibrator handles decoder-only "
            "*ForCausalLM checkpoints with attention K/V (e.g. Llama, Qwen, Mistral)"
        )
    # light import (no modeling code), so a wrong model fails fast
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # type: ignore[attr-defined]

    if cfg.get("model_type") not in CONFIG_MAPPING_NAMES:
        raise InputError(
            f"model {model_dir}: model_type {cfg.get('model_type')!r} is unknown to this transformers; "
            "upgrade transformers or use a supported architecture"
        )
    weights = [f for f in model_dir.iterdir() if f.suffix in WEIGHT_SUFFIXES and f.is_file()]
    if not weights:
        raise InputError(f"model {model_dir}: no *.safetensors weights; save the checkpoint with save_pretrained")
    for f in weights:
        try:
            with f.open("rb") as fh:
                fh.read(8)
        except OSError as e:
            raise InputError(f"model {f}: unreadable ({e}); check permissions") from e
    heads = int(text.get("num_attention_heads", 0))
    kv_heads = int(text.get("num_key_value_heads") or heads)
    if not kv_heads:
        raise InputError(f"model {cfg_path}: no num_key_value_heads / num_attention_heads: no attention to calibrate")
    head_dim = int(text.get("head_dim") or int(text.get("hidden_size", 0)) // max(heads, 1))
    return ModelInfo(
        config=cfg,
        weight_bytes=sum(f.stat().st_size for f in weights),
        max_positions=int(text.get("max_position_embeddings") or 0),
        layers=int(text.get("num_hidden_layers", 0)),
        kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=int(text.get("hidden_size") or 0),
        intermediate_size=int(text.get("intermediate_size") or 0),
        vocab_size=int(text.get("vocab_size") or cfg.get("vocab_size") or 0),
    )


def check_lengths(config: CalibrationConfig, info: ModelInfo) -> None:
    if info.max_positions and config.max_seq_length > info.max_positions:
        raise InputError(
            f"maxSeqLength {config.max_seq_length} is above the model's maximum {info.max_positions} "
            f"(max_position_embeddings); use --max-seq-length {info.max_positions} or less"
        )


def check_output(config: CalibrationConfig, info: ModelInfo) -> None:
    out = config.out.resolve()
    if out == config.model_dir.resolve() or config.model_dir.resolve() in out.parents:
        raise InputError(f"output {config.out}: must not be inside the model folder; choose another --out")
    if out.exists() and not out.is_dir():
        raise InputError(f"output {config.out}: exists and is not a folder; choose another --out")
    if out.is_dir() and any(out.iterdir()) and not config.force:
        raise InputError(f"output {config.out}: folder is not empty; choose an empty --out or pass --force")
    parent = next(p for p in [out, *out.parents] if p.exists())
    free = shutil.disk_usage(parent).free
    need = info.weight_bytes + DISK_MARGIN_BYTES
    if free < need:
        raise InputError(
            f"output {config.out}: {free >> 20} MiB free on its disk, the calibrated checkpoint needs about "
            f"{need >> 20} MiB; free space or choose another --out"
        )


def prepare_output(config: CalibrationConfig) -> None:
    """Empty (with --force) or create the output folder. Runs after every check passed.

    Empties it rather than removing it: in the Job the folder is a mount point (its own subPath or hostPath).
    """
    config.out.mkdir(parents=True, exist_ok=True)
    for entry in config.out.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def check_attention(model_dir: Path) -> None:
    """Refuse, before the weights load, a model whose attention the KV cache hook cannot take (e.g. GPT-NeoX's fused
    query_key_value): the calibration pass would otherwise run to its end and find no K/V to scale. The model is
    built on the meta device from its config (no weights, no memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from kvcal.calibrator.taps import uncalibratable

    try:
        config = AutoConfig.from_pretrained(model_dir)
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    except (OSError, ValueError, KeyError, TypeError, NotImplementedError):
        return  # the model load reports what is wrong with it, in its own words
    why = uncalibratable(skeleton)
    if why is not None:
        raise InputError(f"model {model_dir}: {why}")
