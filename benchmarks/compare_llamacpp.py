"""Time ember and llama.cpp's own `llama-bench` on the same GGUF file, same threads, in one run.

    python benchmarks/compare_llamacpp.py MODEL.gguf [-p 512] [-n 128] [-t 2] [-r 3]
                                          [--llama-bench PATH] [--markdown]

The peer is llama.cpp as its users build it: `../shared/bench/build_llamacpp.sh` (defaults on,
weight repacking included) puts `llama-bench` in `$EMBER_PEER_DIR/llama.cpp/build/bin` (default
`~/.cache/ember-peer`); `--llama-bench` points at any other build. llama-bench runs with its
defaults plus `-t`, `-p`/`-n` and `-r`. Both engines time the same work: pp = one forward pass of
n_prompt tokens from an empty cache, tg = n_gen single-token passes from an empty cache (what
llama-bench's pp/tg tests do). Each test runs ember, then llama-bench, back to back, so a machine
whose speed drifts affects both alike; each engine does one warm-up and `-r` timed runs, and the
table shows mean t/s and the ratio. ember's side is `ember._core.Model` (the C++ forward pass,
one sequence); tg also prints the weight bandwidth it reaches: the bytes of every matmul weight
(all read once per generated token) times tokens/s.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from llamacpp_peer import llama_bench, peer_binary

from ember.commands.bench import matmul_weight_bytes


@dataclass
class Result:
    mean: float  # tokens/s
    stdev: float


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class Ember:
    def __init__(self, path: str, n_threads: int, n_ctx: int, n_batch: int) -> None:
        from ember import _core

        start = time.perf_counter()
        self.model = _core.Model(path, n_threads=n_threads, n_ctx=n_ctx, n_batch=n_batch)
        self.load_s = time.perf_counter() - start
        self.n_vocab = self.model.n_vocab

    def time_prompt(self, tokens: list[int]) -> float:
        start = time.perf_counter()
        self.model.eval_last(tokens, reset=True)
        return time.perf_counter() - start

    def time_generation(self, tokens: list[int]) -> float:
        self.model.reset()
        start = time.perf_counter()
        for tok in tokens:
            self.model.eval_last([tok], reset=False)
        return time.perf_counter() - start

    def measure(self, kind: str, n: int, reps: int) -> Result:
        rng = random.Random(0)
        timer = self.time_prompt if kind == "pp" else self.time_generation
        timer([rng.randrange(self.n_vocab) for _ in range(min(n, 16))])  # warm-up
        speeds = [n / timer([rng.randrange(self.n_vocab) for _ in range(n)]) for _ in range(reps)]
        return Result(statistics.fmean(speeds), statistics.stdev(speeds) if reps > 1 else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--llama-bench", default=None, help="llama-bench binary (default: the peer build)")
    ap.add_argument("--markdown", action="store_true", help="also print one README-style table row")
    args = ap.parse_args()
    exe = peer_binary("llama-bench", args.llama_bench)
    if not exe:
        sys.exit("no llama-bench: build the peer with ../shared/bench/build_llamacpp.sh "
                 "or pass --llama-bench")
    from ember import _core

    n_ctx = max(args.n_prompt, args.n_gen) + 16
    ember = Ember(args.model, args.threads, n_ctx, max(args.n_prompt, 16))
    weight_bytes = matmul_weight_bytes(Path(args.model))
    print(f"model {args.model} ({os.path.getsize(args.model) / 1e6:.1f} MB, "
          f"{weight_bytes / 1e6:.1f} MB of matmul weights)")
    print(f"cpu {cpu_name()}; ember isa {_core.cpu_isa()}; {args.threads} threads; "
          f"{args.repetitions} runs each; ember load {ember.load_s:.2f} s")
    print(f"peer {exe}")
    print(f"| test  | {'ember t/s':>16} | {'llama.cpp t/s':>16} | ember/llama.cpp | ember GB/s |")
    print("| ----- | ---------------- | ---------------- | --------------- | ---------- |")
    results: dict[str, tuple[Result, Result]] = {}
    peer_info: dict = {}
    for kind, n in (("pp", args.n_prompt), ("tg", args.n_gen)):
        if n <= 0:
            continue  # -p 0 or -n 0 skips that test
        e = ember.measure(kind, n, args.repetitions)
        peer_info = llama_bench(exe, args.model, kind, n, args.threads, args.repetitions)
        peer = Result(float(peer_info["avg_ts"]), float(peer_info["stddev_ts"]))
        results[kind] = (e, peer)
        gbs = f"{e.mean * weight_bytes / 1e9:10.1f}" if kind == "tg" else " " * 10
        print(f"| {kind}{n:<3} | {e.mean:9.2f} ± {e.stdev:5.2f} | {peer.mean:9.2f} ± {peer.stdev:5.2f} "
              f"| {e.mean / peer.mean:14.2f}x | {gbs} |")
    if peer_info:
        print(f"peer build {peer_info.get('build_commit', '?')} ({peer_info.get('build_number', '?')}), "
              f"backends {peer_info.get('backends', '?')}, cpu_info {peer_info.get('cpu_info', '?')}")
    if args.markdown and "pp" in results and "tg" in results:
        (pe, pp), (te, tp) = results["pp"], results["tg"]
        print(f"| {Path(args.model).name} | {args.threads} "
              f"| {pe.mean:.0f} / {pp.mean:.0f} t/s ({pe.mean / pp.mean:.2f}×) "
              f"| {te.mean:.1f} / {tp.mean:.1f} t/s ({te.mean / tp.mean:.2f}×) "
              f"| {te.mean * weight_bytes / 1e9:.1f} |")


if __name__ == "__main__":
    main()
