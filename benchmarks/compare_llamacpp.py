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


class LlamaCpp:
    """The smallest llama.cpp driver that times decode: one context, one sequence."""

    def __init__(self, path: str, n_threads: int, n_ctx: int, n_batch: int) -> None:
        import llama_cpp as lc

        self.lc = lc
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        # llama.cpp's extra buffer types (AMX / repacked weights) crash in ggml_backend_amx_mul_mat
        # on a 512-token decode with the llama-cpp-python 0.3.36 build here; its plain CPU
        # kernels are what we compare against.
        if hasattr(mparams, "use_extra_bufts"):
            mparams.use_extra_bufts = False
        load = getattr(lc, "llama_model_load_from_file", None) or lc.llama_load_model_from_file
        self.model = load(path.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        new_ctx = getattr(lc, "llama_init_from_model", None) or lc.llama_new_context_with_model
        self.ctx = new_ctx(self.model, cparams)
        vocab = lc.llama_model_get_vocab(self.model) if hasattr(lc, "llama_model_get_vocab") else None
        self.n_vocab = lc.llama_vocab_n_tokens(vocab) if vocab is not None else lc.llama_n_vocab(self.model)
        self.batch = lc.llama_batch_init(n_batch, 0, 1)

    def clear(self) -> None:
        lc = self.lc
        if hasattr(lc, "llama_memory_clear"):
            lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        elif hasattr(lc, "llama_kv_self_clear"):
            lc.llama_kv_self_clear(self.ctx)
        else:
            lc.llama_kv_cache_clear(self.ctx)

    def decode(self, tokens: list[int], start: int) -> None:
        b = self.batch
        b.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = start + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = i == len(tokens) - 1
        if self.lc.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        self.lc.llama_get_logits_ith(self.ctx, -1)  # the logits are ready once this returns

    def time_prompt(self, tokens: list[int]) -> float:
        self.clear()
        start = time.perf_counter()
        self.decode(tokens, 0)
        return time.perf_counter() - start

    def time_generation(self, tokens: list[int]) -> float:
        self.clear()
        start = time.perf_counter()
        for pos, tok in enumerate(tokens):
            self.decode([tok], pos)
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
