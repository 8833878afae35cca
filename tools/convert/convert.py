"""Hugging Face checkpoint -> GGUF file: resolve the source, pick the architecture family, check
every tensor against config.json, plan each tensor's type, then stream them into the file."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFWriter

from .base import DecoderFamily, HParams, TensorSpec
from .checkpoint import Checkpoint
from .errors import ConvertError
from .qtypes import (
    FLOAT_TYPES,
    ModelShape,
    OutputType,
    check_available,
    output_type,
    tensor_type,
    type_name,
)
from .registry import family_for
from .source import resolve_source
from .vocab import load_vocab
from .writer import TensorPlan, check_target, write_gguf


@dataclass
class ConvertResult:
    """What was written: for the CLI's summary and for tests."""

    path: Path
    architecture: str
    n_tensors: int
    n_bytes: int
    tensor_types: dict[str, int] = field(default_factory=dict)  # type name -> tensor count
    mmproj: Path | None = None  # the vision projector written beside it (a vision model's)


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ConvertError(f"{folder}: no config.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConvertError(f"{path}: cannot read it as JSON ({err})") from None
    if not isinstance(config, dict):
        raise ConvertError(f"{path}: expected a JSON object")
    return config


def _plan(family: DecoderFamily, out: OutputType) -> list[TensorPlan]:
    hp = family.hp
    specs = family.tensor_specs()
    shape = ModelShape(n_layer=hp.n_layer, n_gqa=hp.n_head // hp.n_head_kv,
                       has_output=any(s.gguf_name == "output.weight" for s in specs),
                       n_expert=getattr(family, "n_expert", 0))

    def loader(spec: TensorSpec):
        return lambda: family.load(spec)

    plans = [TensorPlan(s.gguf_name, s.shape,
                        family.planned_type(s.gguf_name, tensor_type(out, s.gguf_name, s.shape, shape)),
                        loader(s)) for s in specs]
    extras = [TensorPlan(e.gguf_name, e.shape, GGMLQuantizationType.F32, e.load)
              for e in family.extra_tensors()]
    return plans[:1] + extras + plans[1:]


def convert(src: str | Path, out: str | Path, out_type: str = "f16", *, force: bool = False,
            progress: bool | None = None, name: str | None = None,
            revision: str | None = None, mmproj_out: str | Path | None = None) -> ConvertResult:
    """Converts checkpoint SRC (folder or hub repo id) to the GGUF file OUT of type OUT_TYPE.
    A vision model's tower and projector (a family with `mmproj`) go to a second file in
    llama.cpp's clip layout: MMPROJ_OUT, by default mmproj-OUT's name beside OUT (the family's
    mmproj(folder, config, out, out_type, ...) picks its matrices' type: a float OUT_TYPE's
    own, f16 for a quantized one, as llama.cpp's --mmproj writes them)."""
    target = output_type(out_type)
    out = Path(out).expanduser()
    check_target(out, force)
    folder = resolve_source(str(src), revision)
    full_config = read_config(folder)
    where = str(folder / "config.json")
    family_class = family_for(full_config, where)
    config = family_class.text_config(full_config)
    mmproj = getattr(family_class, "mmproj", None)
    mmproj_path = None
    if mmproj is not None:
        mmproj_path = (Path(mmproj_out).expanduser() if mmproj_out is not None
                       else out.with_name(f"mmproj-{out.name}"))
        check_target(mmproj_path, force)
    elif mmproj_out is not None:
        raise ConvertError(f"{where}: {family_class.__name__} has no vision tower to write to "
                           f"{mmproj_out}")
    hp = HParams.from_config(config, where)
    family: DecoderFamily = family_class(hp, Checkpoint(folder), where, config)
    plans = _plan(family, target)
    check_available({p.qtype for p in plans}, f"--type {target.name}")
    vocab = load_vocab(folder, hp.n_vocab, hp.model_type)
    model_name = name or (str(src) if not Path(str(src)).expanduser().is_dir()
                          else folder.resolve().name)

    def set_metadata(w: GGUFWriter) -> None:
        w.add_name(model_name)
        family.add_metadata(w)
        w.add_file_type(int(target.file_type))
        if target.base not in FLOAT_TYPES:
            w.add_quantization_version(GGML_QUANT_VERSION)
        vocab.add_to(w)

    write_gguf(out, family.gguf_arch, set_metadata, plans, force=force, progress=progress,
               label=f"{folder.name} -> {target.name}")
    if mmproj is not None:
        mmproj(folder, full_config, mmproj_path, target, force=force, progress=progress,
               name=model_name)
    return ConvertResult(out, family.gguf_arch, len(plans), out.stat().st_size,
                         dict(Counter(type_name(p.qtype) for p in plans)), mmproj_path)
