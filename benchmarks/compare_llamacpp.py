"""Time ember and llama.cpp on the same GGUF file, same shapes, same threads, in one run.

    python benchmarks/compare_llamacpp.py MODEL.gguf [-p 512] [-n 128] [-t 2] [-r 3]

llama.cpp is driven through llama-cpp-python's low-level API (`pip install llama-cpp-python`
builds it from source): pp = one llama_decode of n_prompt tokens from an empty cache, tg = n_gen
single-token llama_decode calls from an empty cache — the same work `ember bench` times. Each
test gets one warm-up run, then `-r` timed runs; the table shows mean t/s and ember/llama.cpp.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from llamacpp_driver import LlamaCppContext


class LlamaCpp(LlamaCppContext):
    """The smallest llama.cpp driver that times decode: one context, one sequence."""

    def __init__(self, path: str, n_threads: int, n_ctx: int, n_batch: int) -> None:
        super().__init__(path, n_threads, n_ctx, n_batch, n_batch)

    def decode_tokens(self, tokens: list[int], start: int) -> None:
        self.decode([(tok, start + i, 0, i == len(tokens) - 1) for i, tok in enumerate(tokens)])
        self.lc.llama_get_logits_ith(self.ctx, -1)  # the logits are ready once this returns

    def time_prompt(self, tokens: list[int]) -> float:
        self.clear()
        start = time.perf_counter()
        self.decode_tokens(tokens, 0)
        return time.perf_counter() - start

    def time_generation(self, tokens: list[int]) -> float:
        self.clear()
        start = time.perf_counter()
        for pos, tok in enumerate(tokens):
            self.decode_tokens([tok], pos)
        return time.perf_counter() - start


class Ember:
    def __init__(self, path: str, n_threads: int, n_ctx: int, n_batch: int) -> None:
        from ember import Model

        self.model = Model(path, n_threads=n_threads, n_ctx=n_ctx, n_batch=n_batch)
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


def measure(engine, kind: str, n: int, reps: int, rng: np.random.Generator) -> list[float]:
    timer = engine.time_prompt if kind == "pp" else engine.time_generation
    timer(rng.integers(0, engine.n_vocab, min(n, 16)).tolist())  # warm-up
    return [n / timer(rng.integers(0, engine.n_vocab, n).tolist()) for _ in range(reps)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    args = ap.parse_args()
    n_ctx = max(args.n_prompt, args.n_gen) + 16
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        sys.exit("llama-cpp-python is not installed: pip install llama-cpp-python")
    n_batch = max(args.n_prompt, 16)
    engines = {"ember": Ember(args.model, args.threads, n_ctx, n_batch),
               "llama.cpp": LlamaCpp(args.model, args.threads, n_ctx, n_batch)}
    print(f"model {args.model}, {args.threads} threads, {args.repetitions} runs each")
    print(f"| test  | {'ember t/s':>16} | {'llama.cpp t/s':>16} | ember/llama.cpp |")
    print("| ----- | ---------------- | ---------------- | --------------- |")
    for kind, n in (("pp", args.n_prompt), ("tg", args.n_gen)):
        if n <= 0:
            continue  # -p 0 or -n 0 skips that test
        results = {}
        for name, engine in engines.items():
            speeds = measure(engine, kind, n, args.repetitions, np.random.default_rng(0))
            results[name] = (statistics.fmean(speeds), statistics.stdev(speeds) if len(speeds) > 1 else 0.0)
        (e, es), (l, ls) = results["ember"], results["llama.cpp"]
        print(f"| {kind}{n:<3} | {e:9.2f} ± {es:5.2f} | {l:9.2f} ± {ls:5.2f} | {e / l:14.2f}x |")


if __name__ == "__main__":
    main()
