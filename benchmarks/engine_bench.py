"""Continuous batching throughput and prefix-cache time to first token, ember's engine beside
llama.cpp's batched decoding (when llama-cpp-python is importable), in one run.

    python benchmarks/engine_bench.py [MODEL.gguf ...] [-t 2] [-c 1,4,8,16] [-p 32] [-n 32]

Throughput: N requests with distinct random prompts of -p tokens each generate -n tokens
greedily (no end token), all submitted at once; aggregate tokens/s = N * n / wall time from
submit to the last token (prefill included), and the decode-only rate after every request has
its first token. llama.cpp: its own llama-batched-bench (the peer build of
../shared/bench/build_llamacpp.sh, or --llama-batched-bench PATH) with -npl N -npp p -ntg n:
the N prompts in one batch, then one batch of N tokens per step; N * n / its total time t is
the same figure.

Time to first token: a 1,000-token prompt whose first 900 tokens are in the prefix cache (a
1,000-token prompt sharing them ran before) against a cold 1,000-token prompt.

The numbers are wall-clock on whatever machine runs this: on a shared, loaded machine they move
by tens of percent between runs; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
from llamacpp_peer import batched_bench, peer_binary

from ember import _core

GREEDY = _core.SamplingParams(temperature=0.0)

TINYLLAMA = Path("/work/bench/tinyllama-1.1b-q4_0.gguf")


def random_prompt(rng: np.random.Generator, n_vocab: int, n: int) -> list[int]:
    return [1, *rng.integers(100, min(n_vocab, 30000), size=n - 1).tolist()]


# --- ember ---------------------------------------------------------------------------------

def ember_throughput(engine: _core.Engine, prompts: list[list[int]], n_gen: int) -> tuple[float, float]:
    """(aggregate tokens/s over the whole run, decode-only tokens/s)."""
    first: list[float] = [0.0] * len(prompts)
    last: list[float] = [0.0] * len(prompts)
    counts = [0] * len(prompts)

    def reader(i: int, handle: _core.EngineRequest) -> None:
        while not handle.done:
            for e in handle.next_events(None):
                now = time.perf_counter()
                if e.token is not None:
                    counts[i] += 1
                    if counts[i] == 1:
                        first[i] = now
                    last[i] = now

    start = time.perf_counter()
    handles = [engine.submit(p, GREEDY, max_tokens=n_gen) for p in prompts]
    threads = [threading.Thread(target=reader, args=(i, h)) for i, h in enumerate(handles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = max(last)
    total = sum(counts)
    assert total == len(prompts) * n_gen, (total, len(prompts), n_gen)
    all_started = max(first)
    decode_tokens = total - len(prompts)  # every token after each request's first
    decode_rate = decode_tokens / (end - all_started) if end > all_started else float("nan")
    return total / (end - start), decode_rate


def ember_ttft(engine: _core.Engine, prompt: list[int]) -> float:
    start = time.perf_counter()
    handle = engine.submit(prompt, GREEDY, max_tokens=1)
    while not handle.done:
        for e in handle.next_events(None):
            if e.token is not None:
                ttft = time.perf_counter() - start
    return ttft


# --- the run -------------------------------------------------------------------------------

def bench_model(path: Path, args: argparse.Namespace) -> None:
    print(f"\n## {path.name}  (threads {args.threads}, prompt {args.prompt} tokens, generate {args.gen})")
    concurrency = [int(c) for c in args.concurrency.split(",")]
    engine = _core.Engine(str(path), n_threads=args.threads, parallel=max(concurrency),
                          kv_size=max(8192, max(concurrency) * (args.prompt + args.gen + 16)),
                          max_batch_tokens=512)
    rng = np.random.default_rng(0)
    ember_throughput(engine, [random_prompt(rng, engine.n_vocab, args.prompt)], 4)  # warm-up
    llama = peer_binary("llama-batched-bench", args.llama_batched_bench) if args.llama_cpp else None
    if args.llama_cpp and not llama:
        print("(no llama-batched-bench: build the peer with ../shared/bench/build_llamacpp.sh; ember only)")
    header = "| concurrent | ember agg tok/s | ember decode tok/s | ember speed-up |"
    if llama:
        header += " llama.cpp agg tok/s | ember / llama.cpp |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    base = None
    for n in concurrency:
        prompts = [random_prompt(rng, engine.n_vocab, args.prompt) for _ in range(n)]
        runs = [ember_throughput(engine, prompts if r == 0 else
                                 [random_prompt(rng, engine.n_vocab, args.prompt) for _ in range(n)],
                                 args.gen)
                for r in range(args.reps)]
        agg = statistics.median(r[0] for r in runs)
        dec = statistics.median(r[1] for r in runs)
        base = base or agg
        line = f"| {n} | {agg:.1f} | {dec:.1f} | {agg / base:.2f}x |"
        if llama:
            rows = [batched_bench(llama, str(path), args.threads, n, args.prompt, args.gen)
                    for _ in range(args.reps)]
            theirs = statistics.median(n * args.gen / row["t"] for row in rows)
            line += f" {theirs:.1f} | {agg / theirs:.2f} |"
        print(line, flush=True)

    if args.ttft:
        cold, warm = [], []
        for _ in range(args.reps):
            cold.append(ember_ttft(engine, random_prompt(rng, engine.n_vocab, 1000)))
            shared = random_prompt(rng, engine.n_vocab, 1000)
            ember_ttft(engine, shared)  # puts its blocks in the prefix cache
            other = shared[:900] + random_prompt(rng, engine.n_vocab, 101)[1:]
            warm.append(ember_ttft(engine, other))
        c, w = statistics.median(cold), statistics.median(warm)
        print(f"\nTTFT, 1000-token prompt: cold {c * 1e3:.0f} ms, 900 tokens cached {w * 1e3:.0f} ms "
              f"-> {c / w:.1f}x sooner (median of {args.reps})")
    time.sleep(0.1)  # the last step's stats are published just after its events
    stats = engine.stats()
    print(f"(engine: {stats['steps']} steps, {stats['preemptions']} preemptions, "
          f"{stats['prefix_hit_tokens']} prefix-hit tokens)")
    engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", type=Path)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--concurrency", default="1,4,8,16")
    ap.add_argument("-p", "--prompt", type=int, default=32, help="prompt tokens per request")
    ap.add_argument("-n", "--gen", type=int, default=32, help="tokens generated per request")
    ap.add_argument("-r", "--reps", type=int, default=1)
    ap.add_argument("--no-ttft", dest="ttft", action="store_false")
    ap.add_argument("--no-llama-cpp", dest="llama_cpp", action="store_false")
    ap.add_argument("--llama-batched-bench", default=None,
                    help="llama-batched-bench binary (default: the peer build)")
    args = ap.parse_args()
    models = args.models
    if not models:
        from ember.hub.models import demo_model_path

        models = [demo_model_path(quiet=True)]
        if TINYLLAMA.exists():
            models.append(TINYLLAMA)
    print(f"python {sys.version.split()[0]}; numbers are wall-clock on a possibly shared machine")
    for m in models:
        bench_model(m, args)


if __name__ == "__main__":
    main()
