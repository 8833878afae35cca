"""First-token time of a long prompt after a server restart, with the prefix cache on disk.

    python benchmarks/restart_ttft.py [--model M.gguf] [--tokens 2000] [--threads 2]

Starts `ember serve MODEL --cache-dir DIR` (a fresh DIR), sends one --tokens-token prompt
(streamed /completion, n_predict 1, greedy) and measures the time to its first token: the cold
figure, a full prefill. Stops the server, starts a new one on the same DIR and sends the same
prompt: the restart figure, the prompt's blocks read back from the files. Also checks that the
restarted server answers with the same token and reports the blocks as cached. Each server is
started anew for each of --runs rounds; the figures are the medians.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

DEMO = "/work/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def start(model: str, port: int, cache: Path, threads: int, n_ctx: int) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-m", "ember.cli", "serve", model, "--port", str(port), "--device", "cpu",
         "--threads", str(threads), "--parallel", "1", "--ctx-size", str(n_ctx),
         "--cache-dir", str(cache)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("the server did not become healthy")


def first_token(port: int, prompt: list[int]) -> tuple[float, int, int]:
    """(seconds to the first streamed token, the token, tokens_cached)."""
    body = {"prompt": prompt, "n_predict": 1, "temperature": 0, "stream": True,
            "return_tokens": True}
    start = time.perf_counter()
    with httpx.stream("POST", f"http://127.0.0.1:{port}/completion", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event.get("tokens"):
                took = time.perf_counter() - start
                token = event["tokens"][0]
            if event.get("stop"):
                return took, token, event.get("tokens_cached", -1)
    raise RuntimeError("the stream ended without a token")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEMO)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--port", type=int, default=8391)
    args = ap.parse_args()
    prompt = [(i * 7919) % 40000 + 100 for i in range(args.tokens)]
    n_ctx = max(2048, args.tokens + 64)
    cold, warm = [], []
    for _ in range(args.runs):
        cache = Path(tempfile.mkdtemp(prefix="ember_restart_ttft_"))
        try:
            server = start(args.model, args.port, cache, args.threads, n_ctx)
            t_cold, tok_cold, cached_cold = first_token(args.port, prompt)
            server.terminate()
            server.wait(60)
            server = start(args.model, args.port, cache, args.threads, n_ctx)
            t_warm, tok_warm, cached_warm = first_token(args.port, prompt)
            server.terminate()
            server.wait(60)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        assert tok_warm == tok_cold, (tok_cold, tok_warm)
        assert cached_cold == 0 and cached_warm > 0, (cached_cold, cached_warm)
        cold.append(t_cold)
        warm.append(t_warm)
        print(f"cold {t_cold:.3f} s, after restart {t_warm:.3f} s ({cached_warm} of "
              f"{args.tokens} tokens from disk)", flush=True)
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"median over {args.runs}: cold {c:.3f} s, after restart {w:.3f} s: {c / w:.1f}x")


if __name__ == "__main__":
    main()
