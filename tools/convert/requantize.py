"""GGUF (f32/f16/bf16) -> GGUF of another type: `ember quantize IN OUT TYPE`.

All metadata is copied with its stored types (strings as raw bytes), except the keys that
describe the data: general.file_type and general.quantization_version are set for the new
type, and general.alignment is dropped (the output uses the default alignment). Tensor types
follow the same rules as conversion (qtypes.tensor_type); tensor data is read one tensor at a
time with positioned reads, so memory stays at a few copies of the largest tensor.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.gguf_reader import ReaderField, ReaderTensor

from .convert import ConvertResult
from .errors import ConvertError
from .qtypes import FLOAT_TYPES, ModelShape, check_available, output_type, tensor_type, type_name
from .writer import TensorPlan, check_target, write_gguf

Q = GGMLQuantizationType
_SKIPPED_KEYS = ("general.architecture", "general.file_type", "general.quantization_version",
                 "general.alignment")
_STORED = {Q.F32: "<f4", Q.F16: "<f2", Q.BF16: "<u2"}


def _field_value(field: ReaderField) -> tuple[Any, GGUFValueType, GGUFValueType | None]:
    """A metadata field as (value, type, array item type) for GGUFWriter.add_key_value."""
    vtype = field.types[0]
    if vtype == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]), vtype, None
    if vtype != GGUFValueType.ARRAY:
        return field.parts[field.data[0]].tolist()[0], vtype, None
    if len(field.types) != 2:
        raise ConvertError(f"metadata key {field.name}: nested arrays are not supported")
    sub = field.types[1]
    if sub == GGUFValueType.STRING:
        return [bytes(field.parts[i]) for i in field.data], vtype, sub
    return [field.parts[i].tolist()[0] for i in field.data], vtype, sub


def _loader(path: Path, t: ReaderTensor, shape: tuple[int, ...]) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        raw = np.fromfile(path, dtype=_STORED[t.tensor_type], count=int(t.n_elements),
                          offset=int(t.data_offset))
        if raw.size != t.n_elements:
            raise ConvertError(f"{path}: tensor '{t.name}' is cut short")
        if t.tensor_type == Q.BF16:
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(np.float32, copy=False).reshape(shape)

    return load


def _int_key(reader: GGUFReader, key: str, default: int) -> int:
    field = reader.fields.get(key)
    if field is None or field.types[0] == GGUFValueType.ARRAY:
        return default
    return int(field.parts[field.data[0]].tolist()[0])


def quantize_gguf(src: str | Path, out: str | Path, out_type: str, *, force: bool = False,
                  progress: bool | None = None) -> ConvertResult:
    """Writes OUT, the f32/f16/bf16 GGUF file SRC requantized to OUT_TYPE."""
    target = output_type(out_type)
    src, out = Path(src).expanduser(), Path(out).expanduser()
    if not src.is_file():
        raise ConvertError(f"{src}: no such file")
    check_target(out, force)
    if out.exists() and out.resolve() == src.resolve():
        raise ConvertError(f"{out} is the input file; write to another file")
    try:
        reader = GGUFReader(src)
    except (ValueError, OSError) as err:
        raise ConvertError(f"{src}: not a readable GGUF file ({err})") from None
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise ConvertError(f"{src}: no general.architecture key")
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode("utf-8")
    names = {t.name for t in reader.tensors}
    n_layer = _int_key(reader, f"{arch}.block_count", 0)
    if n_layer == 0:
        n_layer = len({m.group(1) for n in names if (m := re.match(r"blk\.(\d+)\.", n))})
    n_head = _int_key(reader, f"{arch}.attention.head_count", 1)
    n_head_kv = _int_key(reader, f"{arch}.attention.head_count_kv", n_head) or n_head
    shape_info = ModelShape(n_layer=max(n_layer, 1), n_gqa=max(n_head // n_head_kv, 1),
                            has_output="output.weight" in names)
    plans = []
    for t in reader.tensors:
        if t.tensor_type not in _STORED:
            raise ConvertError(f"{src}: tensor '{t.name}' is {t.tensor_type.name}; only f32, f16 "
                               f"and bf16 files can be quantized (requantizing quantized "
                               f"weights loses accuracy; convert from the original checkpoint)")
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGML order -> numpy order
        if math.prod(shape) != t.n_elements:
            raise ConvertError(f"{src}: tensor '{t.name}' shape {list(shape)} does not match its "
                               f"{t.n_elements} elements")
        qtype = tensor_type(target, t.name, shape, shape_info)
        plans.append(TensorPlan(t.name, shape, qtype, _loader(src, t, shape)))
    check_available({p.qtype for p in plans}, f"quantizing to {target.name}")
    fields = [f for key, f in reader.fields.items()
              if not key.startswith("GGUF.") and key not in _SKIPPED_KEYS]

    def set_metadata(w: GGUFWriter) -> None:
        for f in fields:
            value, vtype, sub = _field_value(f)
            w.add_key_value(f.name, value, vtype, sub)
        w.add_file_type(int(target.file_type))
        if target.base not in FLOAT_TYPES:
            w.add_quantization_version(GGML_QUANT_VERSION)

    write_gguf(out, arch, set_metadata, plans, force=force, progress=progress,
               label=f"{src.name} -> {target.name}")
    del reader
    return ConvertResult(out, arch, len(plans), out.stat().st_size,
                         dict(Counter(type_name(p.qtype) for p in plans)))
