"""`ember quantize IN.gguf OUT.gguf TYPE`: requantize an f32/f16/bf16 GGUF file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ember.commands.convert import TYPES, summary


def quantize(
    src: Annotated[Path, typer.Argument(help="an f32, f16 or bf16 .gguf file")],
    output: Annotated[Path, typer.Argument(help="the .gguf file to write")],
    out_type: Annotated[str, typer.Argument(help=f"output type: {TYPES}")],
    force: Annotated[bool, typer.Option("--force", "-f",
                                        help="overwrite OUTPUT if it exists")] = False,
) -> None:
    """Quantize an f32/f16/bf16 GGUF file to another type, keeping all its metadata."""
    from ember.convert import quantize_gguf

    result = quantize_gguf(src, output, out_type, force=force)
    typer.echo(summary(result), err=True)


def register(app: typer.Typer) -> None:
    app.command()(quantize)
