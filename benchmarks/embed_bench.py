"""Embedding throughput of ember beside llama.cpp's `llama-embedding` on the same GGUF file, same
threads, in one run.

    python benchmarks/embed_bench.py MODEL.gguf [-n 256] [-t 2] [-r 3] [--llama-embedding PATH]

Both embed the same N sentences (mean pooling as the file says, normalised) in one call: ember
through ember.LLM.embed (sequences packed into passes of up to 2048 rows), llama-embedding with
batches of up to 2048 tokens (-b = -ub = -c = 2048; one ubatch attends across all its tokens
under a mask, so a larger one costs it quadratically more). llama.cpp's time runs from its log
line before the first batch to its performance summary (its own "prompt eval time" stays 0 for
encoders), so model loading is out of both figures. The engines
alternate, each with one warm-up, and the table shows the mean sentences/s of -r runs.
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from llamacpp_peer import peer_binary

from ember.llm import LLM

WORDS = ("model engine cache token batch river mountain coffee music garden science history "
         "market window travel doctor teacher city ocean light").split()


def sentences(n: int) -> list[str]:
    """n different sentences of 6 to 20 words (deterministic)."""
    out = []
    for i in range(n):
        k = 6 + i % 15
        out.append(" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(k)).capitalize() + ".")
    return out


def llama_embedding_seconds(exe: str, model: str, texts: list[str], n_threads: int) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(texts))
    proc = subprocess.run([exe, "-m", model, "-f", f.name, "-t", str(n_threads), "-b", "2048",
                           "-ub", "2048", "-c", "2048", "--embd-output-format", "array", "--perf",
                           "-lv", "4"],
                          capture_output=True, text=True)
    Path(f.name).unlink()
    if proc.returncode != 0:
        raise RuntimeError(f"llama-embedding failed: {proc.stderr[-2000:]}")
    # Log lines start with the elapsed time, "0.03.822.569" (minutes, seconds, milliseconds).
    stamp = r"(\d+)\.(\d+)\.(\d+)\.\d+ I "
    first = re.search(stamp + "batch_decode", proc.stderr)
    done = re.search(stamp + "llama_perf_context_print", proc.stderr)
    if not first or not done:
        raise RuntimeError(f"no batch timings in llama-embedding's output: {proc.stderr[-2000:]}")

    def ms(m: re.Match) -> int:
        return (int(m.group(1)) * 60 + int(m.group(2))) * 1000 + int(m.group(3))

    return (ms(done) - ms(first)) / 1000.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-n", type=int, default=256, help="sentences")
    ap.add_argument("-t", type=int, default=2, help="threads")
    ap.add_argument("-r", type=int, default=3, help="timed runs")
    ap.add_argument("--llama-embedding", default=None)
    args = ap.parse_args()
    texts = sentences(args.n)
    llm = LLM(args.model, n_threads=args.t)
    n_tokens = sum(len(t) for t in llm.embedder.tokenize(texts))
    exe = peer_binary("llama-embedding", args.llama_embedding)
    ember_s, peer_s = [], []
    for run in range(args.r + 1):
        start = time.perf_counter()
        llm.embed(texts)
        elapsed = time.perf_counter() - start
        peer = llama_embedding_seconds(exe, args.model, texts, args.t) if exe else None
        if run > 0:  # the first round warms both up
            ember_s.append(elapsed)
            if peer is not None:
                peer_s.append(peer)
    print(f"{Path(args.model).name}: {args.n} sentences, {n_tokens} tokens, {args.t} threads, "
          f"{platform.processor() or platform.machine()}")
    ember = args.n / statistics.mean(ember_s)
    print(f"ember      {ember:8.1f} sentences/s  ({n_tokens / statistics.mean(ember_s):8.0f} tokens/s)")
    if peer_s:
        peer = args.n / statistics.mean(peer_s)
        print(f"llama.cpp  {peer:8.1f} sentences/s  ({n_tokens / statistics.mean(peer_s):8.0f} tokens/s)")
        print(f"ratio ember / llama.cpp: {ember / peer:.2f}")


if __name__ == "__main__":
    main()
