"""`ember convert SRC -o OUT.gguf --type TYPE`: a Hugging Face checkpoint to a GGUF file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

if TYPE_CHECKING:
    from ember.convert import ConvertResult

TYPES = ("f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_m, q4_k_m, q5_k_m, q6_k, tq1_0, tq2_0, "
         "mxfp4_moe")


def summary(result: ConvertResult) -> str:
    """One line on what was written: path, architecture, tensor types, size."""
    types = ", ".join(f"{n} {t}" for t, n in sorted(result.tensor_types.items(),
                                                     key=lambda kv: -kv[1]))
    return (f"wrote {result.path} ({result.architecture}, {result.n_tensors} tensors: {types}; "
            f"{result.n_bytes / 1e6:.1f} MB)")


def convert(
    output: Annotated[Path, typer.Option("--output", "-o", help="the .gguf file to write")],
    src: Annotated[Optional[str], typer.Argument(  # noqa: UP045
        help="a Hugging Face model folder, or a hub repo id (owner/name); with --lora, the "
             "adapter's base model (default: its base_model_name_or_path)")] = None,
    out_type: Annotated[str, typer.Option("--type", "-t", help=f"output type: {TYPES}")] = "f16",
    force: Annotated[bool, typer.Option("--force", "-f",
                                        help="overwrite OUTPUT if it exists")] = False,
    name: Annotated[Optional[str], typer.Option(  # noqa: UP045 - typer evaluates it on 3.9
        "--name", help="general.name (default: the source's name)")] = None,
    revision: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--revision", help="hub revision: branch, tag or commit")] = None,
    lora: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "--lora", help="convert this PEFT LoRA adapter folder (adapter_config.json, "
                       "adapter_model.safetensors) to a LoRA GGUF instead; --type f32 or f16")] = None,
    mmproj_out: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "--mmproj-out", help="a vision model's projector file (llama.cpp's clip layout, for "
                             "--mmproj; default: mmproj-OUTPUT beside OUTPUT)")] = None,
) -> None:
    """Convert a Hugging Face checkpoint (Llama, Mistral, Qwen2, Qwen3, the Qwen MoEs, Phi-3 with
    LongRoPE, Gemma 2/3 (Gemma 3 with vision: and its mmproj), Qwen2.5-VL (and its mmproj),
    SmolLM3, gpt-oss (experts in MXFP4), BERT) to a GGUF file, or a PEFT LoRA adapter of one
    (--lora) to the LoRA GGUF that ember and llama.cpp load."""
    from ember.convert import convert as run_convert
    from ember.convert import convert_lora

    if lora is not None:
        result = convert_lora(lora, output, out_type, base=src, force=force, name=name,
                              revision=revision)
    elif src is None:
        raise typer.BadParameter("give the checkpoint to convert (SRC), or --lora ADAPTER_DIR",
                                 param_hint="SRC")
    else:
        result = run_convert(src, output, out_type, force=force, name=name, revision=revision,
                             mmproj_out=mmproj_out)
    typer.echo(summary(result), err=True)
    if getattr(result, "mmproj", None) is not None:
        typer.echo(f"wrote {result.mmproj} (the vision projector: pass it as --mmproj)", err=True)


def register(app: typer.Typer) -> None:
    app.command()(convert)
