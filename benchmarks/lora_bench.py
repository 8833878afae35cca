"""What per-request LoRA adapters cost in decode: a 16-request batch on a TinyLlama-1.1B-shaped
Q4_0 model (random weights, written here unless --model names a file) with rank-16 adapters on
every projection (q, k, v, o, gate, up, down of all 22 layers), each request running without an
adapter (0), all on one adapter (1), or four requests on each of four adapters (4).

    python benchmarks/lora_bench.py [--model M.gguf] [-t 2] [-c 16] [-p 16] [-n 32] [--reps 3]

Decode tokens/s is every token after each request's first over the time from the last first
token to the last token (engine_bench's decode-only rate), median of --reps runs taken
round-robin over the three cases; the cost is 1 - rate / the rate of the same engine's requests
without an adapter (an engine with none loaded is shown too). Tokens per CPU second of the
process (prefill included) is the steadier figure on a shared machine. The goal: at most 15%.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np
from engine_bench import ember_throughput, random_prompt

from ember import _core

# TinyLlama-1.1B's shape.
SHAPE = {"n_embd": 2048, "n_ff": 5632, "n_layer": 22, "n_head": 32, "n_head_kv": 4, "n_vocab": 32000}


def q4_0(rng: np.random.Generator, n_out: int, n_in: int) -> np.ndarray:
    """Random Q4_0 blocks of a {n_in, n_out} weight: an f16 scale ~ 1/sqrt(n_in) / 8 and random
    nibbles per 32 values (uint8 [n_out, n_in / 32 * 18], the layout gguf writes raw)."""
    n_blocks = n_out * n_in // 32
    blocks = np.empty((n_blocks, 18), dtype=np.uint8)
    scale = np.float16(1.0 / np.sqrt(n_in) / 8)
    blocks[:, :2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
    blocks[:, 2:] = rng.integers(0, 256, size=(n_blocks, 16), dtype=np.uint8)
    return blocks.reshape(n_out, n_in // 32 * 18)


def write_base(path: Path) -> None:
    s, rng = SHAPE, np.random.default_rng(0)
    head_dim = s["n_embd"] // s["n_head"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("random-tinyllama-q4_0")
    w.add_context_length(2048)
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" for i in range(s["n_vocab"])])
    w.add_token_scores([0.0] * s["n_vocab"])
    w.add_token_types([gguf.TokenType.NORMAL] * s["n_vocab"])
    q4 = gguf.GGMLQuantizationType.Q4_0
    ones = np.ones(s["n_embd"], dtype=np.float32)
    w.add_tensor("token_embd.weight", q4_0(rng, s["n_vocab"], s["n_embd"]), raw_dtype=q4)
    kv = s["n_head_kv"] * head_dim
    for i in range(s["n_layer"]):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones)
        for name, n_out, n_in in (("attn_q", s["n_embd"], s["n_embd"]), ("attn_k", kv, s["n_embd"]),
                                  ("attn_v", kv, s["n_embd"]), ("attn_output", s["n_embd"], s["n_embd"]),
                                  ("ffn_gate", s["n_ff"], s["n_embd"]), ("ffn_up", s["n_ff"], s["n_embd"]),
                                  ("ffn_down", s["n_embd"], s["n_ff"])):
            w.add_tensor(b + name + ".weight", q4_0(rng, n_out, n_in), raw_dtype=q4)
        w.add_tensor(b + "ffn_norm.weight", ones)
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", q4_0(rng, s["n_vocab"], s["n_embd"]), raw_dtype=q4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_adapter(path: Path, rank: int, seed: int) -> None:
    """A rank-`rank` LoRA GGUF on every projection, f16 as `ember convert --lora` writes by
    default, with alpha = rank."""
    s, rng = SHAPE, np.random.default_rng(seed)
    kv = s["n_head_kv"] * s["n_embd"] // s["n_head"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank))
    for i in range(s["n_layer"]):
        for name, n_out, n_in in (("attn_q", s["n_embd"], s["n_embd"]), ("attn_k", kv, s["n_embd"]),
                                  ("attn_v", kv, s["n_embd"]), ("attn_output", s["n_embd"], s["n_embd"]),
                                  ("ffn_gate", s["n_ff"], s["n_embd"]), ("ffn_up", s["n_ff"], s["n_embd"]),
                                  ("ffn_down", s["n_embd"], s["n_ff"])):
            base = f"blk.{i}.{name}.weight"
            a = (rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float16)
            bm = (0.1 * rng.standard_normal((n_out, rank)) / np.sqrt(rank)).astype(np.float16)
            w.add_tensor(base + ".lora_a", a)
            w.add_tensor(base + ".lora_b", bm)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


class _Routed:
    """engine_bench's ember_throughput submits every prompt alike; this engine runs request i
    with adapters[i] (-1: none)."""

    def __init__(self, engine: _core.Engine, adapters: list[int]) -> None:
        self._engine, self._adapters = engine, iter(adapters)

    def submit(self, prompt: list[int], sampling: _core.SamplingParams, max_tokens: int):
        return self._engine.submit(prompt, sampling, max_tokens=max_tokens,
                                   lora_adapter=next(self._adapters))


def decode_rate(engine: _core.Engine, prompts: list[list[int]], n_gen: int,
                adapters: list[int]) -> tuple[float, float]:
    """(decode-only tokens/s, tokens per CPU second of the whole run) of `prompts` run at once,
    request i on adapters[i]. CPU time (all of the process's threads) moves far less than wall
    time when other processes share the cores."""
    cpu = time.process_time()
    rate = ember_throughput(_Routed(engine, adapters), prompts, n_gen)[1]
    return rate, len(prompts) * n_gen / (time.process_time() - cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a llama-shaped GGUF (default: a random TinyLlama-"
                    "1.1B-shaped Q4_0 written to a temporary folder)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("-p", "--prompt", type=int, default=16)
    ap.add_argument("-n", "--gen", type=int, default=32)
    ap.add_argument("-r", "--rank", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            model = Path(tmp) / "tinyllama-random-q4_0.gguf"
            start = time.perf_counter()
            write_base(model)
            print(f"(wrote {model.name}, {model.stat().st_size / 1e6:.0f} MB, in "
                  f"{time.perf_counter() - start:.0f} s)")
        adapters = [Path(tmp) / f"adapter-{i}.gguf" for i in range(4)]
        for i, path in enumerate(adapters):
            write_adapter(path, args.rank, seed=i + 1)
        n = args.concurrency
        kv = n * (args.prompt + args.gen + 16)
        rng = np.random.default_rng(0)
        prompts = [random_prompt(rng, SHAPE["n_vocab"], args.prompt) for _ in range(n)]
        opts = {"n_threads": args.threads, "parallel": n, "kv_size": kv, "prefix_caching": False}

        plain = _core.Engine(str(model), **opts)
        ember_throughput(plain, prompts[:1], 2)  # warm-up
        unloaded = statistics.median(decode_rate(plain, prompts, args.gen, [-1] * n)[0]
                                     for _ in range(args.reps))
        plain.shutdown()
        del plain
        engine = _core.Engine(str(model), lora=[str(p) for p in adapters], **opts)
        ember_throughput(engine, prompts[:1], 2)
        configs = {"none": [-1] * n, "1 adapter": [0] * n, "4 adapters": [i % 4 for i in range(n)]}
        # Round-robin over the configurations, so that a machine's load drifting between runs
        # (other processes on its cores) moves them all alike.
        rates: dict[str, list[tuple[float, float]]] = {label: [] for label in configs}
        for _ in range(args.reps):
            for label, choice in configs.items():
                rates[label].append(decode_rate(engine, prompts, args.gen, choice))
        engine.shutdown()
    base = statistics.median(r[0] for r in rates["none"])
    base_cpu = statistics.median(r[1] for r in rates["none"])
    print(f"\n## LoRA decode cost: {n} requests, rank {args.rank} on q/k/v/o/gate/up/down, "
          f"{args.threads} threads, prompt {args.prompt}, generate {args.gen}, median of {args.reps}")
    print(f"(an engine without adapters loaded: {unloaded:.1f} tok/s)")
    print("| requests use | decode tok/s (median) | runs | cost | tok per CPU s (median) | cost |")
    print("|---|---|---|---|---|---|")
    for label, runs in rates.items():
        rate = statistics.median(r[0] for r in runs)
        per_cpu = statistics.median(r[1] for r in runs)
        print(f"| {label} | {rate:.1f} | {', '.join(f'{r[0]:.1f}' for r in runs)} | "
              f"{1 - rate / base:+.1%} | {per_cpu:.1f} | {1 - per_cpu / base_cpu:+.1%} |")

if __name__ == "__main__":
    main()
