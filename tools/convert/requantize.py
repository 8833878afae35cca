"""GGUF (f32/f16/bf16) -> GGUF of another type: `ember quantize IN OUT TYPE`.

All metadata is copied with its stored types (strings as raw bytes), except the keys that
describe the data: general.file_type and general.quantization_version are set for the new
type, and general.alignment is dropped (the output uses the default alignment). Tensor types
follow the same rules as conversion (qtypes.tensor_type); tensor data is read one tensor at a
time with positioned reads, so memory stays at a few copies of the largest tensor.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFWriter

from .convert import ConvertResult
from .errors import ConvertError
from .gguf_meta import MetadataEntry, read_metadata
from .qtypes import FLOAT_TYPES, ModelShape, check_available, output_type, tensor_type, type_name
from .writer import TensorPlan, check_target, write_gguf

Q = GGMLQuantizationType
_SKIPPED_KEYS = ("general.architecture", "general.file_type", "general.quantization_version",
                 "general.alignment", "split.no", "split.count", "split.tensors.count")
# ember.GGUFFile type name -> stored numpy dtype
_FLOATS = {"f32": "<f4", "f16": "<f2", "bf16": "<u2"}


def _loader(path: Path, offset: int, dtype: str, shape: tuple[int, ...], name: str
            ) -> Callable[[], np.ndarray]:
    n = int(np.prod(shape, dtype=np.int64))

    def load() -> np.ndarray:
        raw = np.fromfile(path, dtype=dtype, count=n, offset=offset)
        if raw.size != n:
            raise ConvertError(f"{path}: tensor '{name}' is cut short")
        if dtype == "<u2":  # bf16: its 16 bits are the high half of an f32
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(np.float32, copy=False).reshape(shape)

    return load


def _int_value(metadata: dict[str, MetadataEntry], key: str, default: int) -> int:
    entry = metadata.get(key)
    return int(entry.value) if entry is not None and isinstance(entry.value, int) else default


def quantize_gguf(src: str | Path, out: str | Path, out_type: str, *, force: bool = False,
                  progress: bool | None = None) -> ConvertResult:
    """Writes OUT, the f32/f16/bf16 GGUF file SRC requantized to OUT_TYPE."""
    from ember import GGUFError, GGUFFile

    target = output_type(out_type)
    src, out = Path(src).expanduser(), Path(out).expanduser()
    if not src.is_file():
        raise ConvertError(f"{src}: no such file")
    check_target(out, force)
    if out.exists() and out.resolve() == src.resolve():
        raise ConvertError(f"{out} is the input file; write to another file")
    try:
        f = GGUFFile(str(src))  # validates the whole header and tensor directory
    except GGUFError as err:
        raise ConvertError(f"{src}: not a readable GGUF file ({err})") from None
    metadata = {e.key: e for e in read_metadata(Path(f.path))}  # the first shard of a split model
    arch_entry = metadata.get("general.architecture")
    if arch_entry is None or not isinstance(arch_entry.value, bytes):
        raise ConvertError(f"{src}: no general.architecture key")
    arch = arch_entry.value.decode("utf-8")
    names = {t.name for t in f.tensors}
    n_layer = _int_value(metadata, f"{arch}.block_count", 0) or len(
        {m.group(1) for n in names if (m := re.match(r"blk\.(\d+)\.", n))})
    n_head = _int_value(metadata, f"{arch}.attention.head_count", 1)
    n_head_kv = _int_value(metadata, f"{arch}.attention.head_count_kv", n_head) or n_head
    shape_info = ModelShape(n_layer=max(n_layer, 1), n_gqa=max(n_head // max(n_head_kv, 1), 1),
                            has_output="output.weight" in names,
                            n_expert=_int_value(metadata, f"{arch}.expert_count", 0))
    plans = []
    for t in f.tensors:
        if t.type not in _FLOATS:
            raise ConvertError(f"{src}: tensor '{t.name}' is {t.type}; only f32, f16 and bf16 "
                               f"files can be quantized (requantizing quantized weights loses "
                               f"accuracy; convert from the original checkpoint)")
        dtype = _FLOATS[t.type]
        shape = tuple(int(d) for d in t.shape)
        qtype = tensor_type(target, t.name, shape, shape_info)
        plans.append(TensorPlan(t.name, shape, qtype,
                                _loader(Path(f.shard_paths[t.shard]), t.file_offset, dtype, shape,
                                        t.name)))
    check_available({p.qtype for p in plans}, f"quantizing to {target.name}")
    entries = [e for e in metadata.values() if e.key not in _SKIPPED_KEYS]

    def set_metadata(w: GGUFWriter) -> None:
        for e in entries:
            w.add_key_value(e.key, e.value, e.vtype, e.sub_type)
        w.add_file_type(int(target.file_type))
        if target.base not in FLOAT_TYPES:
            w.add_quantization_version(GGML_QUANT_VERSION)

    del f  # the mapping is not needed while writing; tensors are read with positioned reads
    write_gguf(out, arch, set_metadata, plans, force=force, progress=progress,
               label=f"{src.name} -> {target.name}")
    return ConvertResult(out, arch, len(plans), out.stat().st_size,
                         dict(Counter(type_name(p.qtype) for p in plans)))
