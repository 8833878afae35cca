"""Decode speed of a mixture-of-experts model that reads only its chosen experts: the same random
Qwen3-MoE weights converted twice, once routing each token to top-k experts (the model's
setting) and once to all of them (expert_used_count = expert_count), run by `ember bench`.

    python benchmarks/moe_bench.py [--hidden 1024] [--experts 8] [--top-k 2] [--layers 4]
                                   [--type q8_0] [-n 64] [-t 2] [-r 3] [--llama-bench PATH]

If only the chosen experts' rows are read, generation with top-k is faster by about the ratio of
the weight bytes each token streams (attention, router and output weights are read either way);
were every expert read, both would run at the same speed. With --llama-bench, llama.cpp runs the
same two files too.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers

from ember.commands.bench import matmul_weight_bytes, run_bench
from ember.convert import convert


def checkpoint(folder: Path, hidden: int, n_expert: int, top_k: int, n_layer: int) -> Path:
    config = transformers.Qwen3MoeConfig(
        vocab_size=512, hidden_size=hidden, intermediate_size=hidden, moe_intermediate_size=hidden,
        num_experts=n_expert, num_experts_per_tok=top_k, num_hidden_layers=n_layer,
        num_attention_heads=hidden // 128, num_key_value_heads=max(hidden // 512, 1), head_dim=128,
        norm_topk_prob=True, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]))
    model.save_pretrained(folder)
    tokenizer = Path(__file__).resolve().parents[1] / "tests" / "data" / "stories260K-hf"
    for name in ("tokenizer.model", "tokenizer_config.json"):
        (folder / name).write_bytes((tokenizer / name).read_bytes())
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--type", default="q8_0")
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--llama-bench", type=Path, default=None)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        files = {}
        for k in (args.top_k, args.experts):
            folder = checkpoint(work / f"hf-top{k}", args.hidden, args.experts, k, args.layers)
            files[k] = convert(folder, work / f"top{k}.gguf", args.type, progress=False).path
        print(f"Qwen3-MoE {args.layers} layers, hidden {args.hidden}, {args.experts} experts of "
              f"width {args.hidden}, {args.type}; tg{args.n_gen}, {args.threads} threads, mean of "
              f"{args.repetitions}")
        speeds = {}
        for k, path in files.items():
            row = [r for r in run_bench(path, 0, args.n_gen, args.threads, args.repetitions, "cpu")][0]
            speeds[k] = row["tokens_per_second"]
            streamed = matmul_weight_bytes(path) / 1e6
            print(f"  ember top-{k}: {speeds[k]:8.1f} tokens/s  (streams {streamed:.1f} MB of weights "
                  f"per token, file {path.stat().st_size / 1e6:.1f} MB)")
            if args.llama_bench:
                cmd = [str(args.llama_bench), "-m", str(path), "-p", "0", "-n", str(args.n_gen),
                       "-t", str(args.threads), "-r", str(args.repetitions), "-o", "json"]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                print(f"  llama.cpp top-{k}: {json.loads(out)[0]['avg_ts']:8.1f} tokens/s")
        bytes_ratio = matmul_weight_bytes(files[args.experts]) / matmul_weight_bytes(files[args.top_k])
        speedup = speeds[args.top_k] / speeds[args.experts]
        print(f"  speed-up top-{args.top_k} over all {args.experts}: {speedup:.2f}x "
              f"(weight bytes per token ratio {bytes_ratio:.2f}x)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
