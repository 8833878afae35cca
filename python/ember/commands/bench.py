"""`ember bench MODEL`: prompt-processing and generation speed, printed like llama-bench."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from ember.commands.info import human_bytes, human_count


def time_prompt(model, n_prompt: int, rng: np.random.Generator) -> float:
    """Seconds to evaluate n_prompt random tokens from an empty cache (last-row logits only)."""
    tokens = rng.integers(0, model.n_vocab, n_prompt).tolist()
    start = time.perf_counter()
    model.eval_last(tokens, reset=True)
    return time.perf_counter() - start


def time_generation(model, n_gen: int, rng: np.random.Generator) -> float:
    """Seconds to evaluate n_gen tokens one at a time from an empty cache, as decoding does."""
    tokens = rng.integers(0, model.n_vocab, n_gen).tolist()
    model.reset()
    start = time.perf_counter()
    for token in tokens:
        model.eval_last([token], reset=False)
    return time.perf_counter() - start


def run_bench(model_path: Path, n_prompt: int, n_gen: int, n_threads: Optional[int],
              repetitions: int) -> list[dict]:
    """One result row per test (pp<n>, tg<n>): tokens/s of each repetition after one warm-up."""
    from ember._core import Model, cpu_isa
    from ember.commands.info import describe

    facts = describe(model_path)
    model = Model(str(model_path), n_threads=n_threads, n_ctx=max(n_prompt, n_gen) + 16,
                  n_batch=max(n_prompt, 1))
    rng = np.random.default_rng(0)
    rows = []
    tests = [("pp", n_prompt, time_prompt), ("tg", n_gen, time_generation)]
    for kind, n, timer in tests:
        if n <= 0:
            continue
        timer(model, min(n, 16), rng)  # warm-up: page in the weights, spin up the threads
        speeds = [n / timer(model, n, rng) for _ in range(repetitions)]
        rows.append({
            "model": facts["name"] or model_path.name,
            "file_type": facts["file_type"],
            "size_bytes": facts["file_bytes"],
            "n_params": facts["n_params"],
            "backend": f"CPU {cpu_isa()}",
            "threads": model.n_threads,
            "test": f"{kind}{n}",
            "tokens_per_second": statistics.fmean(speeds),
            "stddev": statistics.stdev(speeds) if len(speeds) > 1 else 0.0,
            "samples": speeds,
        })
    return rows


def bench(
    model: Optional[Path] = typer.Argument(None, help="a .gguf file (default: the demo model)"),
    n_prompt: int = typer.Option(512, "-p", "--n-prompt", help="prompt tokens for the pp test (0 skips it)"),
    n_gen: int = typer.Option(128, "-n", "--n-gen", help="generated tokens for the tg test (0 skips it)"),
    threads: Optional[int] = typer.Option(None, "-t", "--threads", help="threads (default: physical cores)"),
    repetitions: int = typer.Option(3, "-r", "--repetitions", min=1, help="timed runs per test"),
    as_json: bool = typer.Option(False, "--json", help="print the results as JSON"),
) -> None:
    """Measure prompt processing (pp) and token generation (tg) speed, like llama-bench."""
    from ember.hub import resolve_model

    rows = run_bench(resolve_model(model), n_prompt, n_gen, threads, repetitions)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    header = ("model", "size", "params", "backend", "threads", "test", "t/s")
    table = [(f"{r['model']} {r['file_type']}", human_bytes(r["size_bytes"]), human_count(r["n_params"]),
              r["backend"], str(r["threads"]), r["test"], f"{r['tokens_per_second']:.2f} ± {r['stddev']:.2f}")
             for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) if i < 1 else c.rjust(w)  # noqa: E731
                                           for i, (c, w) in enumerate(zip(cells, widths))) + " |"
    typer.echo(line(header))
    typer.echo("| " + " | ".join("-" * w for w in widths) + " |")
    for row in table:
        typer.echo(line(row))


def register(app: typer.Typer) -> None:
    app.command()(bench)
