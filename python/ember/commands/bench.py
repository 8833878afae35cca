"""`ember bench MODEL`: prompt-processing and generation speed, printed like llama-bench."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from ember.commands.info import human_bytes, human_count
from ember.options import DEFAULTS as ENGINE_DEFAULTS


def matmul_weight_bytes(path: Path) -> int:
    """Bytes one generated token streams: every 2-D weight but the embedding table (read one
    row per token), plus the output matrix even when it is tied to the embedding table, plus
    the slices of the 3-D expert tensors its expert_used_count experts own (a mixture of
    experts reads no other expert's weights)."""
    from ember import GGUFFile

    f = GGUFFile(str(path))
    tensors = {t.name: t for t in f.tensors}
    total = sum(t.n_bytes for name, t in tensors.items()
                if len(t.shape) == 2 and name != "token_embd.weight")
    if "output.weight" not in tensors and "token_embd.weight" in tensors:
        total += tensors["token_embd.weight"].n_bytes
    arch = f.metadata.get("general.architecture", "")
    n_expert = int(f.metadata.get(f"{arch}.expert_count", 0) or 0)
    if n_expert > 0:
        n_used = int(f.metadata.get(f"{arch}.expert_used_count", n_expert))
        total += sum(t.n_bytes * n_used // n_expert for t in tensors.values() if len(t.shape) == 3)
    return total


def run_bench(model_path: Path, n_prompt: int, n_gen: int, n_threads: Optional[int],
              repetitions: int, device: Optional[str] = None) -> list[dict]:
    """One result row per test (pp<n>, tg<n>): tokens/s of each repetition after one warm-up,
    measured on the engine that ember.LLM, `ember run` and `ember serve` generate with.
    pp: one request of n_prompt random tokens, timed to its first token (one forward pass of
    n_prompt rows, then one greedy sample); tg: n_gen tokens generated one step at a time after
    a one-token prompt, timed from the first generated token to the last."""
    from ember._core import cpu_isa
    from ember.commands.info import describe
    from ember.engine import Engine
    from ember.sampling import SamplingParams

    facts = describe(model_path)
    engine = Engine(model_path, n_threads=n_threads, n_ctx=max(n_prompt, 1) + n_gen + 16,
                    parallel=1, max_batch_tokens=max(n_prompt, 16), prefix_caching=False,
                    device=device)
    rng = np.random.default_rng(0)

    def time_prompt(n: int) -> float:
        tokens = rng.integers(0, engine.n_vocab, n).tolist()
        result = engine.submit(tokens, SamplingParams(temperature=0, max_tokens=1,
                                                      ignore_eos=True)).result()
        return result.timings.prompt_ms / 1e3

    def time_generation(n: int) -> float:
        prompt = rng.integers(0, engine.n_vocab, 1).tolist()
        result = engine.submit(prompt, SamplingParams(temperature=0, max_tokens=n + 1,
                                                      ignore_eos=True)).result()
        return result.timings.generation_ms / 1e3

    weight_bytes = matmul_weight_bytes(model_path)
    rows = []
    with engine:
        for kind, n, timer in (("pp", n_prompt, time_prompt), ("tg", n_gen, time_generation)):
            if n <= 0:
                continue
            timer(min(n, 16))  # warm-up: page in the weights, spin up the threads
            speeds = [n / timer(n) for _ in range(repetitions)]
            rows.append({
                "model": facts["name"] or model_path.name,
                "file_type": facts["file_type"],
                "size_bytes": facts["file_bytes"],
                "n_params": facts["n_params"],
                "backend": f"CPU {cpu_isa()}" if engine.device == "cpu" else engine.device,
                "threads": engine.n_threads,
                "test": f"{kind}{n}",
                "tokens_per_second": statistics.fmean(speeds),
                "stddev": statistics.stdev(speeds) if len(speeds) > 1 else 0.0,
                "samples": speeds,
                # Decode streams the matmul weights once per token: the bandwidth it reaches.
                "weight_gb_per_s": statistics.fmean(speeds) * weight_bytes / 1e9 if kind == "tg" else None,
            })
    return rows


# The copy-heavy task of the speculative test: rewriting a passage with one change.
COPY_PASSAGE = (
    "The old lighthouse stood at the end of the harbour wall for more than a century. Every "
    "evening the keeper climbed the hundred and twelve steps, trimmed the wick, polished the "
    "great lens and watched the beam sweep across the water. Fishing boats used it to find "
    "their way home through fog and storms, and the town grew up around the light it gave. "
    "When the electric lamp was installed, the keeper stayed on to look after the machinery, "
    "and on clear nights he still counted the ships that passed the point.")
COPY_TASK = ("Rewrite this passage exactly as it is, but call the keeper Thomas:\n\n"
             + COPY_PASSAGE)


def run_spec_bench(model_path: Path, n_gen: int, n_threads: Optional[int], repetitions: int,
                   spec: str, draft_model: Optional[Path], draft_max: int,
                   task: str = COPY_TASK, prediction: Optional[str] = None) -> list[dict]:
    """Generation speed on a copy-heavy chat request (by default: rewrite a passage with one
    change), greedy, without speculation and with `spec` ('ngram', 'draft' or 'prediction':
    the request predicts `prediction`, or else the output the plain run gave). Same engine
    settings otherwise; the two engines take turns, a request each, so a machine whose speed
    drifts moves both alike, and the speed-up is the median of the pairs' ratios."""
    from contextlib import ExitStack

    from ember.engine import Engine
    from ember.sampling import SamplingParams

    modes = ("none", spec)
    with ExitStack() as stack:
        engines = [stack.enter_context(Engine(
            model_path, n_threads=n_threads, parallel=1, prefix_caching=False,
            spec="ngram" if mode == "ngram" else "none",
            draft_model=draft_model if mode == "draft" else None, draft_max=draft_max))
            for mode in modes]
        prompt = engines[0].chat_template.encode(engines[0].tokenizer,
                                                 [{"role": "user", "content": task}])
        for engine in engines:
            engine.submit(prompt, SamplingParams(temperature=0, max_tokens=8)).result()  # warm-up
        speeds: list[list[float]] = [[], []]
        n_out = [0, 0]
        expected = prediction
        for _ in range(repetitions):
            for k, (mode, engine) in enumerate(zip(modes, engines)):
                result = engine.submit(prompt, SamplingParams(
                    temperature=0, max_tokens=n_gen,
                    prediction=expected if mode == "prediction" else None)).result()
                n_out[k] = len(result.tokens)
                speeds[k].append(n_out[k] / (result.timings.generation_ms / 1e3 + 1e-9))
                if mode == "none" and prediction is None:
                    expected = result.text
        stats = [engine.stats() for engine in engines]
    rows = []
    for k, mode in enumerate(modes):
        drafted = sum(stats[k].drafted_tokens.values())
        accepted = sum(stats[k].accepted_tokens.values())
        rows.append({"model": model_path.name, "spec": mode, "test": f"copy{n_out[k]}",
                     "threads": engines[k].n_threads,
                     "tokens_per_second": statistics.fmean(speeds[k]),
                     "stddev": statistics.stdev(speeds[k]) if len(speeds[k]) > 1 else 0.0,
                     "drafted": drafted, "accepted": accepted,
                     "acceptance": accepted / drafted if drafted else None})
    rows[1]["speedup"] = statistics.median(b / a for a, b in zip(*speeds))
    return rows


def bench(
    model: Annotated[Optional[str], typer.Argument(
        help="a .gguf file or hf://USER/REPO[:QUANT] (default: the demo model)",
        show_default=False)] = None,
    n_prompt: Annotated[int, typer.Option(
        "-p", "--n-prompt", help="prompt tokens for the pp test (0 skips it)")] = 512,
    n_gen: Annotated[int, typer.Option(
        "-n", "--n-gen", help="generated tokens for the tg test (0 skips it)")] = 128,
    threads: Annotated[Optional[int], typer.Option(
        "-t", "--threads", help="threads (default: physical cores)", show_default=False)] = None,
    device: Annotated[Optional[str], typer.Option(
        "--device", help=("device to run on: cpu, cuda, cuda:N, vulkan or vulkan:N "
              "\\[default: $EMBER_DEVICE, else the first GPU, else the CPU]"),
        show_default=False)] = None,
    repetitions: Annotated[int, typer.Option(
        "-r", "--repetitions", min=1, help="timed runs per test")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="print the results as JSON")] = False,
    spec: Annotated[Optional[str], typer.Option(
        "--spec", help="speculative mode: generation on a copy-heavy request without and with "
                       "'ngram', 'draft' (needs --draft-model) or 'prediction'",
        show_default=False)] = None,
    draft_model: Annotated[Optional[str], typer.Option(
        "--draft-model", help="the draft model of --spec draft", show_default=False)] = None,
    draft_max: Annotated[int, typer.Option("--draft-max", help="drafts per step at most")
                         ] = ENGINE_DEFAULTS.draft_max,
) -> None:
    """Measure prompt processing (pp) and token generation (tg) speed, like llama-bench;
    with --spec, generation on a copy-heavy request with and without speculation."""
    from ember.hub.models import resolve_model

    if spec is not None:
        if spec not in ("ngram", "draft", "prediction"):
            raise typer.BadParameter(f"--spec must be ngram, draft or prediction, got {spec!r}")
        if (spec == "draft") != (draft_model is not None):
            raise typer.BadParameter("--spec draft goes with --draft-model (and only it)")
        spec_rows = run_spec_bench(resolve_model(model), n_gen, threads, repetitions, spec,
                                   resolve_model(draft_model) if draft_model else None, draft_max)
        if as_json:
            typer.echo(json.dumps(spec_rows, indent=2))
            return
        for r in spec_rows:
            acceptance = f", acceptance {r['acceptance']:.0%}" if r["acceptance"] is not None else ""
            speedup = f", {r['speedup']:.2f}x" if "speedup" in r else ""
            typer.echo(f"{r['model']} {r['test']} spec={r['spec']}: {r['tokens_per_second']:.1f} "
                       f"± {r['stddev']:.1f} t/s{acceptance}{speedup}")
        return
    rows = run_bench(resolve_model(model), n_prompt, n_gen, threads, repetitions, device)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    header = ("model", "size", "params", "backend", "threads", "test", "t/s", "weights GB/s")
    table = [(f"{r['model']} {r['file_type']}", human_bytes(r["size_bytes"]), human_count(r["n_params"]),
              r["backend"], str(r["threads"]), r["test"], f"{r['tokens_per_second']:.2f} ± {r['stddev']:.2f}",
              f"{r['weight_gb_per_s']:.1f}" if r["weight_gb_per_s"] else "")
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
