"""Reads small tensors (the K/V scales) straight from safetensors files: the header is JSON, the data little-endian.
No torch and no numpy, so the static verifier runs anywhere; bf16 (what llm-compressor saves scales in) is decoded by
widening to float32, which is exact."""

import json
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_HEADER_LEN = struct.Struct("<Q")


def _bf16(raw: bytes) -> list[float]:
    halves = struct.unpack(f"<{len(raw) // 2}H", raw)
    return list(struct.unpack(f"<{len(halves)}f", struct.pack(f"<{len(halves)}I", *(h << 16 for h in halves))))


def _fmt(code: str, size: int) -> Callable[[bytes], list[float]]:
    return lambda raw: [float(x) for x in struct.unpack(f"<{len(raw) // size}{code}", raw)]


DECODERS: dict[str, tuple[int, Callable[[bytes], list[float]]]] = {
    "BF16": (2, _bf16),
    "F16": (2, _fmt("e", 2)),
    "F32": (4, _fmt("f", 4)),
    "F64": (8, _fmt("d", 8)),
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    start: int  # absolute byte offset of the data in `file`
    end: int


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    values: tuple[float, ...]  # flattened, as float


def read_header(path: Path) -> dict[str, TensorInfo]:
    with path.open("rb") as f:
        (length,) = _HEADER_LEN.unpack(f.read(8))
        header = json.loads(f.read(length))
    base = 8 + length
    infos = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        infos[name] = TensorInfo(name, meta["dtype"], tuple(meta["shape"]), path, base + begin, base + end)
    return infos


def checkpoint_files(directory: Path) -> list[Path]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory}: no *.safetensors files (is this a Hugging Face checkpoint folder?)")
    return files


def index_checkpoint(directory: Path) -> dict[str, TensorInfo]:
    """Every tensor's header entry across all shards (later shards win on duplicate names, as when loading)."""
    infos: dict[str, TensorInfo] = {}
    for path in checkpoint_files(directory):
        infos.update(read_header(path))
    return infos


def load_tensors(infos: Iterable[TensorInfo]) -> dict[str, Tensor]:
    out = {}
    for info in infos:
        with info.file.open("rb") as f:
            f.seek(info.start)
            raw = f.read(info.end - info.start)
        if info.dtype not in DECODERS:
            raise ValueError(f"{info.name}: dtype {info.dtype} is not a float type a K/V scale can have")
        out[info.name] = Tensor(info.name, info.dtype, info.shape, tuple(DECODERS[info.dtype][1](raw)))
    return out


def _to_bf16_bits(x: float) -> int:
    """float32 -> bf16 rounded to nearest even (as torch does); NaN stays NaN."""
    bits: int = struct.unpack("<I", struct.pack("<f", x))[0]
    if x != x:  # NaN: keep a quiet NaN rather than rounding into infinity
        return 0x7FC0
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


ENCODERS: dict[str, Callable[[Iterable[float]], bytes]] = {
    "BF16": lambda xs: b"".join(struct.pack("<H", _to_bf16_bits(x)) for x in xs),
    "F16": lambda xs: b"".join(struct.pack("<e", x) for x in xs),
    "F32": lambda xs: b"".join(struct.pack("<f", x) for x in xs),
    "F64": lambda xs: b"".join(struct.pack("<d", x) for x in xs),
}


def encode(dtype: str, values: Iterable[float]) -> bytes:
    """Little-endian bytes of `values` (bf16 rounded to nearest even, like torch)."""
    return ENCODERS[dtype](values)


def write_safetensors(path: Path, tensors: Mapping[str, tuple[str, tuple[int, ...], bytes]]) -> None:
    """A safetensors file from raw (dtype, shape, data) entries: used to repair or, in tests, corrupt checkpoints."""
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format aligns the data to 8 bytes
    with path.open("wb") as f:
        f.write(_HEADER_LEN.pack(len(raw)))
        f.write(raw)
        for _dtype, _shape, data in tensors.values():
            f.write(data)


def read_raw(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Every tensor of one file as raw (dtype, shape, data), in file order."""
    out = {}
    with path.open("rb") as f:
        for name, info in read_header(path).items():
            f.seek(info.start)
            out[name] = (info.dtype, info.shape, f.read(info.end - info.start))
    return out
