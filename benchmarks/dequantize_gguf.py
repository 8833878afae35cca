"""Writes a copy of a GGUF model with every quantized tensor dequantized to f16 (f32 tensors
stay f32): the full-precision target of the speculative benchmark, whose draft is the quantized
original (same vocabulary, same metadata).

    python benchmarks/dequantize_gguf.py SmolLM2-135M-Instruct.Q4_1.gguf smollm2-f16.gguf
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np


def dequantize_file(src: Path, dst: Path) -> None:
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        if field.name == "general.file_type":
            writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type)
    for t in reader.tensors:
        kind = gguf.GGMLQuantizationType
        if t.tensor_type in (kind.F32, kind.F16):
            data = np.array(t.data)
        else:
            data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float16)
        writer.add_tensor(t.name, data, raw_shape=data.shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    args = parser.parse_args()
    dequantize_file(args.src, args.dst)


if __name__ == "__main__":
    main()
