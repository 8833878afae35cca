"""Streaming GGUF output: every tensor's final name, shape and type is known up front, so the
header and tensor directory are written first and tensor data follows one tensor at a time
(gguf.GGUFWriter's add_tensor_info / write_tensor_data path); only one tensor is in memory.

The file is written as OUT.partial and renamed to OUT once complete; any failure (a bad tensor,
a full disk, Ctrl-C) removes the partial file, so OUT is either whole or untouched.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from .errors import ConvertError
from .progress import ProgressBar
from .qtypes import encode, n_bytes, type_name


@dataclass(frozen=True)
class TensorPlan:
    """One output tensor: its GGUF name, shape (numpy order, rows last), type and a loader."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    load: Callable[[], np.ndarray]   # -> float32 values of `shape`, read only when written

    @property
    def n_bytes(self) -> int:
        return n_bytes(self.qtype, self.shape)


def check_target(out: Path, force: bool) -> None:
    """Refuse to overwrite OUT without --force, and fail early on a missing folder."""
    if out.exists() and not force:
        raise ConvertError(f"{out} already exists; pass --force to overwrite it")
    if out.is_dir():
        raise ConvertError(f"{out} is a directory; give a .gguf file name")
    if not out.parent.is_dir():
        raise ConvertError(f"folder {out.parent} does not exist")


def partial_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def write_gguf(out: Path, arch: str, set_metadata: Callable[[GGUFWriter], None],
               tensors: list[TensorPlan], *, force: bool = False,
               progress: bool | None = None, label: str = "writing") -> None:
    """Writes a GGUF file at `out` with the metadata `set_metadata` adds and `tensors` in order."""
    check_target(out, force)
    total = sum(t.n_bytes for t in tensors)
    free = shutil.disk_usage(out.parent).free
    if free < total:
        raise ConvertError(f"not enough disk space for {out}: it needs about "
                           f"{total / 1e9:.2f} GB, {out.parent} has {free / 1e9:.2f} GB free")
    partial = partial_path(out)
    writer = GGUFWriter(str(partial), arch)
    bar = ProgressBar(total, label, enabled=progress)
    try:
        set_metadata(writer)
        for t in tensors:
            writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.n_bytes,
                                   raw_dtype=t.qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in tensors:
            values = t.load()
            if tuple(values.shape) != t.shape:
                raise ConvertError(f"tensor '{t.name}': got shape {list(values.shape)}, "
                                   f"expected {list(t.shape)}")
            data = encode(values, t.qtype)
            del values
            if data.nbytes != t.n_bytes:  # a quantizer/plan disagreement: a bug, not bad input
                raise RuntimeError(f"tensor '{t.name}' as {type_name(t.qtype)}: "
                                   f"{data.nbytes} bytes, planned {t.n_bytes}")
            writer.write_tensor_data(data)
            bar.update(t.n_bytes, f"{t.name} {type_name(t.qtype)}")
        writer.close()
        os.replace(partial, out)
    except OSError as err:
        writer.close()
        partial.unlink(missing_ok=True)
        if err.errno == errno.ENOSPC:
            raise ConvertError(f"no space left on the device while writing {out} "
                               f"(it needs about {total / 1e9:.2f} GB); removed the partial "
                               f"file") from None
        raise
    except BaseException:
        writer.close()
        partial.unlink(missing_ok=True)
        raise
    finally:
        bar.close()
