"""A copy of a GGUF model file with another tokenizer.chat_template (the server tests' hostile
model files) or other metadata (FIM token ids), written with gguf-py: the weights and
vocabulary stay, only those keys change."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

TEMPLATE_KEY = "tokenizer.chat_template"


def _value(field: gguf.ReaderField) -> object:
    kind = field.types[0]
    if kind == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode()
    if kind == gguf.GGUFValueType.ARRAY:
        if field.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode() for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    return field.parts[field.data[0]].tolist()[0]


def with_chat_template(source: Path, target: Path, template: str) -> Path:
    return with_metadata(source, target, strings={TEMPLATE_KEY: template})


def with_metadata(source: Path, target: Path, strings: dict[str, str] | None = None,
                  uint32s: dict[str, int] | None = None) -> Path:
    """A copy of `source` with these metadata keys set (added or replaced)."""
    strings, uint32s = strings or {}, uint32s or {}
    reader = gguf.GGUFReader(source)
    arch = _value(reader.fields["general.architecture"])
    writer = gguf.GGUFWriter(target, str(arch))
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in strings \
                or name in uint32s:
            continue
        kind = field.types[0]
        sub = field.types[1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, _value(field), kind, sub_type=sub)
    for name, text in strings.items():
        writer.add_string(name, text)
    for name, number in uint32s.items():
        writer.add_uint32(name, number)
    for tensor in reader.tensors:
        data = np.asarray(tensor.data)
        writer.add_tensor(tensor.name, data, raw_shape=data.shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target
