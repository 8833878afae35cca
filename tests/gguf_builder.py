"""A byte-exact GGUF writer for tests: every field can be set to a wrong value on purpose.

gguf-py's writer refuses malformed input, which is what the reader tests need to produce, so
this builds files by struct packing, and reports where each field landed for targeted mutation.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# GGUF value type ids
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_FORMATS = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
                  BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


@dataclass
class Tensor:
    name: str
    shape: list[int]          # ggml order: fastest dimension first
    type_id: int
    data: bytes
    offset: int | None = None  # None: next aligned offset


@dataclass
class Built:
    data: bytes
    offsets: dict[str, int] = field(default_factory=dict)  # field name -> byte offset


def _string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _value(type_id: int, value) -> bytes:
    if type_id == STRING:
        return _string(value)
    if type_id == ARRAY:
        elem_type, items = value
        out = struct.pack("<IQ", elem_type, len(items))
        return out + b"".join(_value(elem_type, v) for v in items)
    return struct.pack(SCALAR_FORMATS[type_id], value)


def build(kv: list[tuple[str, int, object]], tensors: list[Tensor], version: int = 3,
          alignment: int = 32, magic: bytes = b"GGUF") -> Built:
    """A GGUF file as bytes; offsets records 'kv:<key>' value and 'tensor:<name>:<field>' spots."""
    built = Built(b"")
    out = bytearray(magic + struct.pack("<IQQ", version, len(tensors), len(kv)))
    built.offsets["n_tensors"] = 8
    built.offsets["n_kv"] = 16
    for key, type_id, value in kv:
        built.offsets[f"kv:{key}"] = len(out)
        out += _string(key) + struct.pack("<I", type_id)
        built.offsets[f"kv:{key}:value"] = len(out)
        out += _value(type_id, value)
    offset = 0
    for t in tensors:
        if t.offset is None:
            t.offset = offset
        offset = (t.offset + len(t.data) + alignment - 1) // alignment * alignment
        built.offsets[f"tensor:{t.name}"] = len(out)
        out += _string(t.name)
        built.offsets[f"tensor:{t.name}:n_dims"] = len(out)
        out += struct.pack("<I", len(t.shape))
        built.offsets[f"tensor:{t.name}:shape"] = len(out)
        out += b"".join(struct.pack("<Q", d) for d in t.shape)
        built.offsets[f"tensor:{t.name}:type"] = len(out)
        out += struct.pack("<I", t.type_id)
        built.offsets[f"tensor:{t.name}:offset"] = len(out)
        out += struct.pack("<Q", t.offset)
    out += b"\0" * (-len(out) % alignment)
    data_start = len(out)
    built.offsets["data"] = data_start
    for t in tensors:
        end = data_start + t.offset
        if len(out) < end:
            out += b"\0" * (end - len(out))
        out[end:end + len(t.data)] = t.data
    built.data = bytes(out)
    return built


def small_model(**overrides) -> Built:
    """A valid little file: a few metadata kinds and two f32 tensors."""
    a = np.arange(64, dtype=np.float32)
    b = np.linspace(-1, 1, 32, dtype=np.float32)
    kv = [
        ("general.architecture", STRING, "llama"),
        ("general.alignment", U32, 32),
        ("test.u8", U8, 7),
        ("test.i64", I64, -5),
        ("test.f64", F64, 0.25),
        ("test.bool", BOOL, True),
        ("test.strings", ARRAY, (STRING, ["a", "bc", "héllo"])),
        ("test.floats", ARRAY, (F32, [0.5, -1.5])),
        ("test.nested", ARRAY, (ARRAY, [(I32, [1, 2]), (I32, [3])])),
    ]
    tensors = [Tensor("a.weight", [16, 4], 0, a.tobytes()), Tensor("b.weight", [32], 0, b.tobytes())]
    return build(overrides.pop("kv", kv), overrides.pop("tensors", tensors), **overrides)


def replace_string(data: bytes, key: str, value: str) -> bytes:
    """`data` (a GGUF with no tensors, such as a vocabulary-only file) with the string under
    `key` set to `value`. Without tensors nothing after the metadata moves, so splicing is safe."""
    magic, _version, n_tensors = struct.unpack_from("<4sIQ", data, 0)
    assert magic == b"GGUF" and n_tensors == 0, "only tensor-free GGUFs can be spliced"
    needle = _string(key) + struct.pack("<I", STRING)
    at = data.find(needle)
    assert at >= 0 and data.find(needle, at + 1) < 0, f"{key} must appear exactly once as a string"
    start = at + len(needle)
    (n,) = struct.unpack_from("<Q", data, start)
    return data[:start] + _string(value) + data[start + 8 + n :]


def split_gguf(src: Path, prefix: Path, max_tensors: int) -> list[Path]:
    """`src` cut into shards the way llama.cpp's `llama-gguf-split --split-max-tensors` does:
    PREFIX-0000i-of-0000n.gguf, each with at most `max_tensors` tensors in file order; the first
    keeps all metadata, and every shard gets split.no (u16, from 0), split.tensors.count (i32,
    the model's total) and split.count (u16). The shards are byte for byte the tool's."""
    import gguf  # gguf-py, a test dependency: reads the source file

    reader = gguf.GGUFReader(str(src))
    kv = []
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = f.contents()
        if f.types[0] == ARRAY:
            assert f.types[1] != ARRAY, "nested arrays are not copied"
            value = (int(f.types[1]), value)
        kv.append((key, int(f.types[0]), value))
    alignment = int(reader.alignment)
    tensors = [Tensor(t.name, [int(d) for d in t.shape], int(t.tensor_type), t.data.tobytes())
               for t in reader.tensors]
    groups = [tensors[i:i + max_tensors] for i in range(0, len(tensors), max_tensors)]
    return write_split(prefix, kv, groups, alignment=alignment)


def write_split(prefix: Path, kv: list[tuple[str, int, object]], groups: list[list[Tensor]], *,
                alignment: int = 32, count: int | None = None, n_tensors: int | None = None) -> list[Path]:
    """Shards PREFIX-0000i-of-0000n.gguf, one per group of tensors, `kv` in the first; split.count
    and split.tensors.count as given (default: the true ones), to build broken sets too."""
    count = len(groups) if count is None else count
    n_tensors = sum(len(g) for g in groups) if n_tensors is None else n_tensors
    paths = []
    for no, group in enumerate(groups):
        split_kv = [("split.no", U16, no), ("split.tensors.count", I32, n_tensors),
                    ("split.count", U16, count)]  # the tool's order: it sets the count last
        path = prefix.parent / f"{prefix.name}-{no + 1:05d}-of-{len(groups):05d}.gguf"
        path.write_bytes(build((kv if no == 0 else []) + split_kv, group, alignment=alignment).data)
        paths.append(path)
    return paths
