"""`ember pull`: fetch the default demo model into the cache."""

from __future__ import annotations

import typer


def pull() -> None:
    """Download the default demo model (SmolLM2-135M-Instruct, Q4_1) into ember's cache."""
    from ember.hub import demo_model_path

    path = demo_model_path()
    typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.command()(pull)
