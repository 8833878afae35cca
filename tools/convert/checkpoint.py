"""Tensors of a Hugging Face safetensors checkpoint (one file or shards with an index), read one
at a time.

Each tensor is read with a plain positioned read into a fresh array that is dropped after use,
instead of through a memory map: pages of a mapped file count towards the process's resident
memory once touched, so mapping a 2 GB checkpoint and walking it would report 2 GB RSS. Reads
keep the peak at a few copies of the largest tensor. bf16 (which numpy lacks) is widened to f32
by shifting its 16 bits into the high half of a uint32.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ConvertError

INDEX_FILE = "model.safetensors.index.json"

# safetensors dtype -> (numpy dtype of the stored values, bytes per value)
_DTYPES: dict[str, tuple[str, int]] = {
    "F32": ("<f4", 4),
    "F16": ("<f2", 2),
    "BF16": ("<u2", 2),
    "F64": ("<f8", 8),
    # Integer buffers (BERT's embeddings.position_ids) are listed so the header reads; no
    # family converts them.
    "I64": ("<i8", 8),
    "I32": ("<i4", 4),
}


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes are: file, absolute offset, dtype and shape as stored."""

    name: str
    dtype: str               # safetensors dtype: F32, F16, BF16, F64
    shape: tuple[int, ...]   # as stored (PyTorch order, outermost first)
    file: Path
    offset: int              # absolute byte offset of the first value in `file`
    n_bytes: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


def _read_header(path: Path) -> dict[str, TensorEntry]:
    """The tensor directory of one .safetensors file, validated against the file's size."""
    file_bytes = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ConvertError(f"{path}: not a safetensors file ({file_bytes} bytes, expected an "
                               f"8-byte header length first)")
        (header_bytes,) = struct.unpack("<Q", prefix)
        if header_bytes > file_bytes - 8 or header_bytes > 100 * 1024 * 1024:
            raise ConvertError(f"{path}: safetensors header of {header_bytes} bytes does not fit "
                               f"in the file ({file_bytes} bytes); is it truncated?")
        try:
            header = json.loads(f.read(header_bytes))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ConvertError(f"{path}: safetensors header is not valid JSON: {err}") from None
    data_start = 8 + header_bytes
    entries: dict[str, TensorEntry] = {}
    for name, desc in header.items():
        if name == "__metadata__":
            continue
        dtype = desc.get("dtype")
        if dtype not in _DTYPES:
            raise ConvertError(f"{path}: tensor '{name}' has dtype {dtype}; the converter reads "
                               f"{', '.join(_DTYPES)} checkpoints")
        shape = tuple(int(d) for d in desc["shape"])
        begin, end = (int(x) for x in desc["data_offsets"])
        expected = math.prod(shape) * _DTYPES[dtype][1]
        if end - begin != expected:
            raise ConvertError(f"{path}: tensor '{name}' {dtype}{list(shape)} needs {expected} "
                               f"bytes, its offsets give {end - begin}")
        if data_start + end > file_bytes:
            raise ConvertError(f"{path}: tensor '{name}' ends at byte {data_start + end}, the file "
                               f"has {file_bytes}; is it truncated?")
        entries[name] = TensorEntry(name, dtype, shape, path, data_start + begin, end - begin)
    return entries


class Checkpoint:
    """All safetensors tensors in a model folder, by name."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.entries: dict[str, TensorEntry] = {}
        index = folder / INDEX_FILE
        if index.is_file():
            try:
                weight_map: dict[str, str] = json.loads(index.read_text("utf-8"))["weight_map"]
            except (KeyError, json.JSONDecodeError) as err:
                raise ConvertError(f"{index}: not a safetensors index ({err})") from None
            files = sorted(set(weight_map.values()))
            for name in files:
                if not (folder / name).is_file():
                    raise ConvertError(f"{index} lists shard {name}, which is missing from "
                                       f"{folder}")
        else:
            # Hugging Face names its weights model.safetensors / model-0000N-of-0000M; other
            # files (Mistral's consolidated.safetensors, adapters) are not this model's layout.
            weight_map = {}
            files = (sorted(p.name for p in folder.glob("model*.safetensors"))
                     or sorted(p.name for p in folder.glob("*.safetensors")))
        if not files:
            others = sorted(p.name for p in folder.iterdir()
                            if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
            hint = f" (found {', '.join(others)}; only safetensors is read)" if others else ""
            raise ConvertError(f"{folder}: no *.safetensors weights{hint}")
        for name in files:
            for tensor_name, entry in _read_header(folder / name).items():
                if weight_map and weight_map.get(tensor_name) != name:
                    continue  # the index says another shard holds it
                if tensor_name in self.entries:
                    raise ConvertError(f"tensor '{tensor_name}' is in both "
                                       f"{self.entries[tensor_name].file.name} and {name}")
                self.entries[tensor_name] = entry
        missing = sorted(set(weight_map) - set(self.entries))
        if missing:
            raise ConvertError(f"{index} maps {missing[0]} to {weight_map[missing[0]]}, but that "
                               f"shard has no such tensor ({len(missing)} missing)")

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def source_dtypes(self) -> set[str]:
        return {e.dtype for e in self.entries.values()}

    def read_f32(self, name: str) -> np.ndarray:
        """The tensor as a fresh float32 array of its stored shape."""
        e = self.entries[name]
        dtype, _ = _DTYPES[e.dtype]
        try:
            raw = np.fromfile(e.file, dtype=dtype, count=e.n_elements, offset=e.offset)
        except OSError as err:
            raise ConvertError(f"{e.file}: reading tensor '{name}': {err}") from None
        if raw.size != e.n_elements:
            raise ConvertError(f"{e.file}: tensor '{name}' is cut short ({raw.size} of "
                               f"{e.n_elements} values)")
        if e.dtype == "BF16":
            values = (raw.astype(np.uint32) << 16).view(np.float32)
        elif e.dtype == "F32":
            values = raw
        else:
            values = raw.astype(np.float32)
        return values.reshape(e.shape)
