"""`ember info FILE.gguf`: what a GGUF file holds, as a table or JSON; `ember info --devices`:
the devices this build can run models on (and why a backend offers none)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

# llama.cpp's `general.file_type` values (enum llama_ftype), which name a file's quantization mix.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M",
    30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}


def human_count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))


def human_bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def describe(path: Path) -> dict[str, Any]:
    """Everything `ember info` shows, as plain JSON-able values."""
    from ember import GGUFFile

    f = GGUFFile(str(path))
    md = f.metadata
    arch = md.get("general.architecture", "unknown")
    tensors = f.tensors
    by_type: dict[str, dict[str, int]] = {}
    for t in tensors:
        row = by_type.setdefault(t.type, {"count": 0, "n_bytes": 0, "n_elements": 0})
        row["count"] += 1
        row["n_bytes"] += t.n_bytes
        row["n_elements"] += t.n_elements
    file_type = md.get("general.file_type")
    if isinstance(file_type, int):
        file_type_name = FILE_TYPES.get(file_type, f"unknown ({file_type})")
    else:  # older files: name it after the most common type among the 2-D weights
        common = Counter(t.type for t in tensors if len(t.shape) == 2).most_common(1)
        file_type_name = common[0][0].upper() + " (guessed)" if common else "unknown"
    tokens = md.get("tokenizer.ggml.tokens")
    return {
        "path": str(path),
        "shards": f.shard_paths,  # every file of a split model, the first holding the metadata
        "gguf_version": f.version,
        "file_bytes": f.file_bytes,
        "name": md.get("general.name"),
        "architecture": arch,
        "n_params": sum(t.n_elements for t in tensors),
        "file_type": file_type_name,
        "context_length": md.get(f"{arch}.context_length"),
        "embedding_length": md.get(f"{arch}.embedding_length"),
        "n_layers": md.get(f"{arch}.block_count"),
        "vocab_size": len(tokens) if isinstance(tokens, list) else None,
        "tokenizer_model": md.get("tokenizer.ggml.model"),
        "tokenizer_pre": md.get("tokenizer.ggml.pre"),
        "has_chat_template": "tokenizer.chat_template" in md,
        "n_tensors": len(tensors),
        "n_metadata": len(md),
        "tensor_types": by_type,
    }


def device_report() -> dict[str, Any]:
    """The devices of the backends built in, and one note per backend that offers none."""
    from ember._core import devices

    found, notes = devices()
    return {"devices": found, "notes": notes}


def print_devices(report: dict[str, Any]) -> None:
    for d in report["devices"]:
        memory = (f"  {human_bytes(d['memory_bytes'])} ({human_bytes(d['memory_free_bytes'])} free)"
                  if d["backend"] != "cpu" else "")
        state = "" if d["usable"] else f"  unusable: {d['unusable']}"
        typer.echo(f"{d['device']:<10} {d['name']} [{d['type']}]{memory}{state}")
    for note in report["notes"]:
        typer.echo(f"note: {note}")


def info(
    file: Annotated[Optional[str], typer.Argument(
        help="a .gguf file or hf://USER/REPO[:QUANT]", show_default=False)] = None,
    devices: Annotated[bool, typer.Option(
        "--devices", help="list the devices models can run on instead")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the same facts as JSON")] = False,
) -> None:
    """Show what a GGUF file holds: architecture, size, quantization, tokenizer, tensor types;
    or, with --devices, the devices ember can run on (CPU, CUDA and Vulkan GPUs) and their memory."""
    if devices:
        report = device_report()
        if as_json:
            typer.echo(json.dumps(report, indent=2))
        else:
            print_devices(report)
        return
    if file is None:
        raise typer.BadParameter("give a .gguf file, or --devices", param_hint="FILE")
    from ember.hub.models import resolve_model

    d = describe(resolve_model(file))
    if as_json:
        typer.echo(json.dumps(d, indent=2))
        return
    rows = [
        ("file", d["path"]),
        *([("split into", f"{len(d['shards'])} files: " + ", ".join(Path(p).name for p in d["shards"]))]
          if len(d["shards"]) > 1 else []),
        ("name", d["name"] or "-"),
        ("architecture", d["architecture"]),
        ("parameters", human_count(d["n_params"])),
        ("file size", human_bytes(d["file_bytes"])),
        ("file type", d["file_type"]),
        ("context length", d["context_length"] or "-"),
        ("embedding length", d["embedding_length"] or "-"),
        ("layers", d["n_layers"] or "-"),
        ("vocabulary", d["vocab_size"] or "-"),
        ("tokenizer", " / ".join(str(x) for x in (d["tokenizer_model"], d["tokenizer_pre"]) if x) or "-"),
        ("chat template", "yes" if d["has_chat_template"] else "no"),
        ("GGUF version", d["gguf_version"]),
        ("tensors", d["n_tensors"]),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        typer.echo(f"{key:<{width}}  {value}")
    typer.echo("")
    typer.echo(f"{'type':<8} {'tensors':>8} {'params':>10} {'size':>12}")
    for type_name, row in sorted(d["tensor_types"].items(), key=lambda kv: -kv[1]["n_bytes"]):
        typer.echo(f"{type_name:<8} {row['count']:>8} {human_count(row['n_elements']):>10} "
                   f"{human_bytes(row['n_bytes']):>12}")


def register(app: typer.Typer) -> None:
    app.command()(info)
