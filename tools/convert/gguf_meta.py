"""Typed GGUF metadata, read fast enough for 150k-token vocabularies.

`ember quantize` copies every key with its stored value type (llama.cpp checks the types of the
keys it reads), which ember.GGUFFile's Python view does not keep. gguf-py's GGUFReader does,
but builds numpy views per array item and takes tens of seconds on a large vocabulary; this
reads the key/value section with struct from a memory map instead (only the header's pages are
touched). The file is validated by ember.GGUFFile first, so malformed files are reported there.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType

from .errors import ConvertError

V = GGUFValueType
# scalar type -> (struct format, numpy dtype for arrays of it)
_SCALARS: dict[GGUFValueType, tuple[str, str]] = {
    V.UINT8: ("<B", "<u1"), V.INT8: ("<b", "<i1"), V.UINT16: ("<H", "<u2"),
    V.INT16: ("<h", "<i2"), V.UINT32: ("<I", "<u4"), V.INT32: ("<i", "<i4"),
    V.FLOAT32: ("<f", "<f4"), V.UINT64: ("<Q", "<u8"), V.INT64: ("<q", "<i8"),
    V.FLOAT64: ("<d", "<f8"), V.BOOL: ("<?", "<u1"),
}


@dataclass(frozen=True)
class MetadataEntry:
    """One key/value pair as GGUFWriter.add_key_value takes it; strings stay bytes."""

    key: str
    vtype: GGUFValueType
    value: Any
    sub_type: GGUFValueType | None = None


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> bytes:
        n = self.scalar("<Q")
        if self.pos + n > len(self.buf):
            raise ConvertError(f"{self.path}: metadata string runs past the end of the file")
        s = self.buf[self.pos:self.pos + n]
        self.pos += n
        return s

    def value(self, vtype: GGUFValueType, key: str) -> tuple[Any, GGUFValueType | None]:
        if vtype == V.STRING:
            return self.string(), None
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype][0]), None
        if vtype != V.ARRAY:
            raise ConvertError(f"{self.path}: metadata key {key}: unknown value type {vtype}")
        sub = V(self.scalar("<I"))
        n = self.scalar("<Q")
        if sub == V.STRING:
            return [self.string() for _ in range(n)], sub
        if sub not in _SCALARS:
            raise ConvertError(f"{self.path}: metadata key {key}: arrays of {sub.name} are not "
                               f"supported")
        dtype = np.dtype(_SCALARS[sub][1])
        end = self.pos + n * dtype.itemsize
        if end > len(self.buf):
            raise ConvertError(f"{self.path}: metadata array {key} runs past the end of the file")
        items = np.frombuffer(self.buf, dtype=dtype, count=n, offset=self.pos).tolist()
        self.pos = end
        if sub == V.BOOL:
            items = [bool(x) for x in items]
        return items, sub


def read_metadata(path: Path) -> list[MetadataEntry]:
    """Every metadata key/value of GGUF file `path` (v2 or v3), in file order."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        c = _Cursor(buf, path)
        try:
            if buf[:4] != b"GGUF":
                raise ConvertError(f"{path}: not a GGUF file")
            c.pos = 4
            version = c.scalar("<I")
            if version not in (2, 3):
                raise ConvertError(f"{path}: GGUF version {version} (2 or 3 supported)")
            c.scalar("<Q")  # tensor count
            n_kv = c.scalar("<Q")
            entries = []
            for _ in range(n_kv):
                key = c.string().decode("utf-8")
                vtype = V(c.scalar("<I"))
                value, sub = c.value(vtype, key)
                entries.append(MetadataEntry(key, vtype, value, sub))
        except (struct.error, ValueError) as err:
            if isinstance(err, ConvertError):
                raise
            raise ConvertError(f"{path}: malformed metadata ({err})") from None
    return entries
