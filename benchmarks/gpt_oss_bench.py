"""Decode speed on gpt-oss-20b's layer shape: a GGUF file written here with random weights and
the 20B's widths and expert layout (n_embd 2880, 64 query heads and 8 kv heads of 64, 32 experts
of width 2880 with 4 chosen, experts in MXFP4, a 128-token window on every other layer), fewer
layers (--layers) and stories260K's 512-token vocabulary (so the output head is not the 20B's
201k rows), run by `ember bench` and, with --llama-bench, by llama.cpp with the same threads.

    python benchmarks/gpt_oss_bench.py [--layers 4] [-n 32] [-t 2] [-r 5] [--llama-bench PATH]

Prints each engine's median tokens/s of the repetitions and the machine's load average before
and after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np

from ember import _core
from ember.commands.bench import run_bench

N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_EXPERT, TOP_K, N_FF, WINDOW = 2880, 64, 8, 64, 32, 4, 2880, 128


def vocab_fields() -> list:
    """The tokenizer.* fields of a tiny converted model (stories260K's vocabulary)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "model"))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from checkpoints import save_checkpoint
    from test_model_gpt_oss import make_gpt_oss

    from ember.convert import convert

    with tempfile.TemporaryDirectory() as tmp:
        folder = save_checkpoint(make_gpt_oss(), Path(tmp) / "ckpt")
        path = convert(folder, Path(tmp) / "tiny.gguf", "f32", progress=False).path
        reader = gguf.GGUFReader(path)
        return [(f.name, f.contents(), f.types) for f in reader.fields.values()
                if f.name.startswith("tokenizer.")]


def write_model(path: Path, n_layer: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    arch = "gpt-oss"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(131072)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(150000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(TOP_K)
    w.add_expert_feed_forward_length(N_FF)
    w.add_uint32(f"{arch}.attention.sliding_window", WINDOW)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    for name, value, types in vocab_fields():
        if types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(name, value)
        elif types[0] == gguf.GGUFValueType.STRING:
            w.add_string(name, value)
        elif types[0] == gguf.GGUFValueType.BOOL:
            w.add_bool(name, value)
        else:
            w.add_uint32(name, int(value))
    n_vocab = 512

    def f32(*shape, scale=1.0):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)

    def q8(rows, cols):
        data = np.frombuffer(_core.quantize(f32(rows, cols, scale=cols ** -0.5), "q8_0"), np.uint8)
        return data.reshape(rows, -1), gguf.GGMLQuantizationType.Q8_0

    def add(name, data, qtype=None):
        w.add_tensor(name, data, raw_dtype=qtype) if qtype is not None else w.add_tensor(name, data)

    def mxfp4(n_expert, rows, cols):
        blocks = np.empty((n_expert, rows, cols // 32, 17), np.uint8)
        blocks[..., 0] = 120  # scale 2^-8: values up to 12 * 2^-8, about 1/sqrt(2880) in RMS
        blocks[..., 1:] = rng.integers(0, 256, blocks[..., 1:].shape, dtype=np.uint8)
        return blocks.reshape(n_expert, rows, cols // 32 * 17)

    add("token_embd.weight", *q8(n_vocab, N_EMBD))
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    for i in range(n_layer):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", 1 + f32(N_EMBD, scale=0.1))
        for proj, rows in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
            add(f"{b}attn_{proj}.weight", *q8(rows, N_EMBD))
            add(f"{b}attn_{proj}.bias", f32(rows, scale=0.1))
        add(b + "attn_output.weight", *q8(N_EMBD, q_dim))
        add(b + "attn_output.bias", f32(N_EMBD, scale=0.1))
        add(b + "attn_sinks.weight", f32(N_HEAD))
        add(b + "post_attention_norm.weight", 1 + f32(N_EMBD, scale=0.1))
        add(b + "ffn_gate_inp.weight", f32(N_EXPERT, N_EMBD, scale=N_EMBD ** -0.5))
        add(b + "ffn_gate_inp.bias", f32(N_EXPERT, scale=0.1))
        add(b + "ffn_gate_exps.weight", mxfp4(N_EXPERT, N_FF, N_EMBD), gguf.GGMLQuantizationType.MXFP4)
        add(b + "ffn_gate_exps.bias", f32(N_EXPERT, N_FF, scale=0.1))
        add(b + "ffn_up_exps.weight", mxfp4(N_EXPERT, N_FF, N_EMBD), gguf.GGMLQuantizationType.MXFP4)
        add(b + "ffn_up_exps.bias", f32(N_EXPERT, N_FF, scale=0.1))
        add(b + "ffn_down_exps.weight", mxfp4(N_EXPERT, N_EMBD, N_FF), gguf.GGMLQuantizationType.MXFP4)
        add(b + "ffn_down_exps.bias", f32(N_EXPERT, N_EMBD, scale=0.1))
    add("output_norm.weight", 1 + f32(N_EMBD, scale=0.1))
    add("output.weight", *q8(n_vocab, N_EMBD))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("--llama-bench", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="write the model here and keep it")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "gpt-oss-shape.gguf"
        if not path.exists():
            write_model(path, args.layers)
        print(f"gpt-oss-20b layer shape, {args.layers} layers, MXFP4 experts (32, top-4), "
              f"{path.stat().st_size / 1e9:.2f} GB; tg{args.n_gen}, {args.threads} threads, median "
              f"of {args.repetitions}; load average before {os.getloadavg()[0]:.2f}")
        row = run_bench(path, 0, args.n_gen, args.threads, args.repetitions, "cpu")[0]
        runs = row.get("samples_ts") or row.get("samples") or [row["tokens_per_second"]]
        print(f"  ember:     {statistics.median(runs):7.2f} tokens/s  (runs {[round(x, 2) for x in runs]})")
        if args.llama_bench:
            cmd = [str(args.llama_bench), "-m", str(path), "-p", "0", "-n", str(args.n_gen),
                   "-t", str(args.threads), "-r", str(args.repetitions), "-o", "json"]
            out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)[0]
            runs = out.get("samples_ts") or [out["avg_ts"]]
            rounded = [round(x, 2) for x in runs]
            print(f"  llama.cpp: {statistics.median(runs):7.2f} tokens/s  (runs {rounded})")
        print(f"  load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
