"""The `ember` command line. Each command lives in ember/commands/<name>.py with a register(app)."""

from __future__ import annotations

import sys

import typer

from ember.commands import bench, chat, convert, info, perplexity, pull, quantize, run, serve

app = typer.Typer(
    name="ember",
    help="ember: run GGUF language models locally — inspect, generate, chat, serve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

for command in (info, pull, bench, perplexity, convert, quantize, run, chat, serve):
    command.register(app)


def main() -> None:
    """Console-script entry point: expected failures print one line, never a traceback."""
    from ember import EmberError
    from ember.hub.errors import ModelNotFound

    try:
        app()
    except (EmberError, ModelNotFound, ValueError, OSError) as err:
        typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
