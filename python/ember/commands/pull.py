"""`ember pull [USER/REPO[:QUANT]]`: fetch a GGUF from the Hugging Face Hub (or, with no
argument, the default demo model) into the cache, and print its path."""

from __future__ import annotations

from typing import Annotated, Optional

import typer


def pull(
    ref: Annotated[Optional[str], typer.Argument(
        metavar="USER/REPO[:QUANT]",
        help="a Hugging Face Hub repo, optionally with a quantization (default Q4_K_M, else "
             "Q8_0, else the smallest with 4 bits or more), or USER/REPO/path/file.gguf; "
             "hf:// in front is optional (default: the demo model, SmolLM2-135M-Instruct)",
        show_default=False)] = None,
) -> None:
    """Download a GGUF model into the cache (the Hugging Face one for Hub repos) and print its
    path; all parts of a split GGUF (any of them opens the model). Offline (HF_HUB_OFFLINE=1 or
    no network), finds it in the cache."""
    from ember.hub.models import demo_model_path

    if ref is None:
        typer.echo(str(demo_model_path()))
        return
    from ember.hub.hf import fetch, parse_ref

    for path in fetch(parse_ref(ref)):
        typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.command()(pull)
