"""The peer, llama.cpp, through its own benchmark programs (llama-bench, llama-batched-bench) as
its users run them: the build of ../shared/bench/build_llamacpp.sh (defaults on, weight
repacking included), found in $EMBER_PEER_DIR/llama.cpp/build/bin (default ~/.cache/ember-peer),
or any build's binary given by path. Used by compare_llamacpp.py and engine_bench.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path


def peer_binary(name: str, override: str | None = None) -> str | None:
    """`override`, else the peer build's `name`, else `name` on PATH; None if none exists."""
    if override:
        return override
    peer = Path(os.environ.get("EMBER_PEER_DIR", Path.home() / ".cache" / "ember-peer"))
    candidate = peer / "llama.cpp" / "build" / "bin" / name
    return str(candidate) if candidate.is_file() else shutil.which(name)


def run_jsonl(args: list[str]) -> list[dict]:
    """Runs a llama.cpp benchmark that prints JSON (one document, or one object a line)."""
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(args[0]).name} failed ({proc.returncode}): {' '.join(args)}\n"
                           f"{proc.stderr[-2000:]}")
    text = proc.stdout.strip()
    if text.startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def llama_bench(exe: str, model: str, kind: str, n: int, n_threads: int, reps: int) -> dict:
    """llama-bench's row for pp<n> (kind "pp") or tg<n> ("tg"): avg_ts, stddev_ts, build info."""
    args = [exe, "-m", model, "-t", str(n_threads), "-r", str(reps), "-o", "json"]
    args += ["-p", str(n), "-n", "0"] if kind == "pp" else ["-p", "0", "-n", str(n)]
    return run_jsonl(args)[-1]


def batched_bench(exe: str, model: str, n_threads: int, n_parallel: int, n_prompt: int, n_gen: int) -> dict:
    """llama-batched-bench's row for n_parallel sequences of n_prompt + n_gen tokens: t (seconds
    from the first prompt token to the last generated one), t_tg, speed_tg, ..."""
    n_ctx = n_parallel * (n_prompt + n_gen + 16)
    args = [exe, "-m", model, "-t", str(n_threads), "-c", str(n_ctx), "-b", "1024", "-ub", "512",
            "-npp", str(n_prompt), "-ntg", str(n_gen), "-npl", str(n_parallel), "--output-format", "jsonl"]
    return run_jsonl(args)[-1]
