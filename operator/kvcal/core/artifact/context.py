"""The longest context the baseline serves: its vLLM `--max-model-len`, which the calibrator judges the calibration
data's length coverage against. None when the flag is absent or `auto`/-1: vLLM then serves the model's own limit,
which the calibrator reads from the checkpoint itself."""

import re

from kvcal.core.manifests.canary import baseline_container_index
from kvcal.core.observations import DeploymentState
from kvcal.vllm_flags import Flag, find

MAX_MODEL_LEN = Flag(("--max-model-len",), "read only: it sizes the calibration's length coverage")
# vLLM's human_readable_int: '1k' = 1000, '25.6k' = 25600 (decimal), '1K' = 1024 (binary, whole numbers only).
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kmgt])|(\d+)([KMGT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def token_count(value: str) -> int | None:
    """A `--max-model-len` value as vLLM reads it; None for auto (-1, 'auto') or anything vLLM would refuse."""
    text = value.strip()
    if text.isdigit():
        return int(text) or None
    match = _HUMAN.fullmatch(text)
    if match is None:
        return None
    if match.group(1):
        return int(float(match.group(1)) * _DECIMAL[match.group(2)])
    return int(match.group(3)) * _BINARY[match.group(4)]


def served_context(baseline: DeploymentState | None, container: str | None) -> int | None:
    """The baseline vLLM container's `--max-model-len` (command and args, last occurrence wins), if set."""
    if baseline is None:
        return None
    try:
        pod = baseline.manifest["spec"]["template"]["spec"]
        spec = pod["containers"][baseline_container_index(baseline.manifest, container)]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    occurrence = find([*spec.get("command", []), *spec.get("args", [])], MAX_MODEL_LEN)
    return token_count(occurrence.value) if occurrence else None
