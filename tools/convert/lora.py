"""PEFT LoRA adapter -> llama.cpp's LoRA GGUF (what convert_lora_to_gguf.py writes, and what
ember and llama.cpp's --lora read).

An adapter folder holds adapter_config.json and adapter_model.safetensors, whose tensors
"base_model.model.<module>.lora_A.weight" [rank, n_in] and ".lora_B.weight" [n_out, rank] change
module W into W + alpha / rank · B·A. The GGUF file names each pair after the base model's
tensor ("blk.0.attn_q.weight.lora_a" / ".lora_b", stored as PEFT's arrays, so ggml reads A as
{n_in, rank} and B as {rank, n_out}), with general.type "adapter", adapter.type "lora",
adapter.lora.alpha, and general.architecture the base model's. B's rows go through the base
family's own transform (llama's Q/K row permutation), as the base weight's rows do.

The base model's config.json (a folder or hub repo id: --base, else the adapter's
base_model_name_or_path) gives the architecture and the shapes every pair must have.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gguf import GGMLQuantizationType, GGUFType, GGUFWriter, Keys

from .base import DecoderFamily, HParams
from .checkpoint import Checkpoint
from .convert import ConvertResult, read_config
from .errors import ConvertError
from .registry import family_for
from .source import looks_like_repo_id
from .writer import TensorPlan, check_target, write_gguf

ADAPTER_CONFIG = "adapter_config.json"
LORA_TYPES = {"f32": GGMLQuantizationType.F32, "f16": GGMLQuantizationType.F16}
_PREFIX = "base_model.model."


@dataclass(frozen=True)
class _NoWeights:
    """The base checkpoint as a family sees it here: its folder, no tensors (only config.json
    is read)."""

    folder: Path
    entries: dict

    def __contains__(self, name: str) -> bool:
        return False


def read_adapter_config(folder: Path) -> dict:
    path = folder / ADAPTER_CONFIG
    if not path.is_file():
        raise ConvertError(f"{folder}: no {ADAPTER_CONFIG}; is it a PEFT adapter folder?")
    try:
        config = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConvertError(f"{path}: cannot read it as JSON ({err})") from None
    if not isinstance(config, dict):
        raise ConvertError(f"{path}: expected a JSON object")
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise ConvertError(f"{path}: peft_type is {config['peft_type']!r}; only LORA adapters convert")
    if config.get("use_dora"):
        raise ConvertError(f"{path}: use_dora is set; DoRA adapters are not supported")
    for key in ("rank_pattern", "alpha_pattern"):
        if config.get(key):
            raise ConvertError(f"{path}: {key} is set; adapters whose layers have their own "
                               f"rank or alpha are not supported")
    for key in ("r", "lora_alpha"):
        if not isinstance(config.get(key), (int, float)) or config[key] <= 0:
            raise ConvertError(f"{path}: {key} is {config.get(key)!r}, expected a positive number")
    return config


def _base_config(base: str, revision: str | None) -> tuple[dict, Path]:
    """config.json of the base model (a folder, or a hub repo id: that file alone is fetched)."""
    path = Path(base).expanduser()
    if path.is_dir():
        return read_config(path), path
    if not looks_like_repo_id(base):
        raise ConvertError(f"base model {base}: no such folder, and not a Hugging Face repo id; "
                           f"pass the base model's folder with --base")
    from huggingface_hub import hf_hub_download

    try:
        file = Path(hf_hub_download(base, "config.json", revision=revision))
    except Exception as err:  # noqa: BLE001 - any hub failure means: give the folder instead
        raise ConvertError(f"cannot fetch config.json of the base model {base} ({err}); pass "
                           f"its folder with --base") from None
    return read_config(file.parent), file.parent


def convert_lora(adapter: str | Path, out: str | Path, out_type: str = "f16", *,
                 base: str | None = None, force: bool = False, progress: bool | None = None,
                 name: str | None = None, revision: str | None = None) -> ConvertResult:
    """Converts the PEFT LoRA adapter folder ADAPTER to the LoRA GGUF file OUT (f32 or f16)."""
    if out_type.lower() not in LORA_TYPES:
        raise ConvertError(f"a LoRA adapter converts to {' or '.join(LORA_TYPES)}, not {out_type!r}")
    qtype = LORA_TYPES[out_type.lower()]
    folder = Path(adapter).expanduser()
    if not folder.is_dir():
        raise ConvertError(f"{folder}: no such folder (a PEFT adapter folder with {ADAPTER_CONFIG})")
    out = Path(out).expanduser()
    check_target(out, force)
    lcfg = read_adapter_config(folder)
    base = base or lcfg.get("base_model_name_or_path")
    if not base:
        raise ConvertError(f"{folder / ADAPTER_CONFIG} names no base_model_name_or_path; pass the "
                           f"base model's folder with --base")
    config, base_folder = _base_config(str(base), revision)
    where = str(base_folder / "config.json")
    hp = HParams.from_config(config, where)
    family: DecoderFamily = family_for(config, where)(hp, _NoWeights(base_folder, {}), where, config)
    specs = {s.hf_name: s for i in range(hp.n_layer) for s in family.layer_specs(i)}

    ckpt = Checkpoint(folder)
    pairs: dict[str, dict[str, str]] = {}
    for tname in ckpt.entries:
        module, kind = _split_name(tname, ckpt.folder)
        pairs.setdefault(module, {})[kind] = tname
    ranks: set[int] = set()
    plans: list[TensorPlan] = []
    order = {hf_name: i for i, hf_name in enumerate(specs)}  # the base file's tensor order
    for module in sorted(pairs, key=lambda m: order.get(m + ".weight", len(order))):
        spec = specs.get(module + ".weight")
        if spec is None or len(spec.shape) != 2:
            raise ConvertError(f"{ckpt.folder}: the adapter changes {module}, which is not a "
                               f"projection of a {family.gguf_arch} model with {hp.n_layer} layers")
        a_name, b_name = pairs[module].get("A"), pairs[module].get("B")
        if a_name is None or b_name is None:
            raise ConvertError(f"{ckpt.folder}: {module} has lora_{'A' if a_name is None else 'B'} "
                               f"missing")
        a, b = ckpt.entries[a_name], ckpt.entries[b_name]
        n_out, n_in = spec.shape
        if len(a.shape) != 2 or len(b.shape) != 2 or a.shape[1] != n_in or b.shape[0] != n_out \
                or a.shape[0] != b.shape[1]:
            raise ConvertError(f"{ckpt.folder}: {module} has lora_A {list(a.shape)} and lora_B "
                               f"{list(b.shape)}; its weight {list(spec.shape)} needs [rank, {n_in}] "
                               f"and [{n_out}, rank]")
        ranks.add(a.shape[0])
        plans.append(TensorPlan(spec.gguf_name + ".lora_a", a.shape, qtype,
                                lambda n=a_name: ckpt.read_f32(n)))
        plans.append(TensorPlan(spec.gguf_name + ".lora_b", b.shape, qtype,
                                lambda n=b_name, s=spec: family.transform(s, ckpt.read_f32(n))))
    if not plans:
        raise ConvertError(f"{ckpt.folder}: the adapter has no lora_A / lora_B tensors")
    alpha = float(lcfg["lora_alpha"])
    if lcfg.get("use_rslora"):
        # rsLoRA scales by alpha / sqrt(rank); the file's alpha is read as alpha / rank.
        if len(ranks) != 1:
            raise ConvertError(f"{folder / ADAPTER_CONFIG}: use_rslora with several ranks "
                               f"({sorted(ranks)}) has no single alpha")
        alpha *= math.sqrt(next(iter(ranks)))

    def set_metadata(w: GGUFWriter) -> None:
        w.add_name(name or folder.resolve().name)
        w.add_type(GGUFType.ADAPTER)
        w.add_string(Keys.Adapter.TYPE, "lora")
        w.add_float32(Keys.Adapter.LORA_ALPHA, alpha)

    write_gguf(out, family.gguf_arch, set_metadata, plans, force=force, progress=progress,
               label=f"{folder.name} -> LoRA {out_type.lower()}")
    return ConvertResult(out, family.gguf_arch, len(plans), out.stat().st_size,
                         dict(Counter(qtype.name.lower() for _ in plans)))


def _split_name(tensor: str, folder: Path) -> tuple[str, str]:
    """'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' ->
    ('model.layers.0.self_attn.q_proj', 'A'); a ConvertError for any other tensor."""
    for kind in ("A", "B"):
        suffix = f".lora_{kind}.weight"
        if tensor.endswith(suffix):
            module = tensor[: -len(suffix)]
            return (module[len(_PREFIX):] if module.startswith(_PREFIX) else module), kind
    hint = (" (embedding adapters, e.g. for added tokens, are not supported)"
            if "lora_embedding" in tensor or "embed_tokens" in tensor or "lm_head" in tensor else "")
    raise ConvertError(f"{folder}: tensor {tensor} is not a lora_A / lora_B weight{hint}")


__all__ = ["LORA_TYPES", "convert_lora", "read_adapter_config"]
