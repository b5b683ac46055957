"""The sha256 of a checkpoint's weights: every *.safetensors file and config.json, by name and content.

One function for both sides: the calibrator records it in the report (the BF16 model it read and the checkpoint it
wrote) and `kvcal verify` recomputes it, so a checkpoint changed in place at the same path is caught."""

import hashlib
from pathlib import Path

_CHUNK = 1 << 20


def sha256_files(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.name.encode())
        with path.open("rb") as stream:
            for chunk in iter(lambda: stream.read(_CHUNK), b""):
                digest.update(chunk)
    return digest.hexdigest()


def weights_digest(folder: Path) -> str:
    """sha256 over the folder's *.safetensors files and config.json (tokenizer and report files are not weights)."""
    return sha256_files([f for f in folder.iterdir() if f.suffix == ".safetensors" or f.name == "config.json"])
