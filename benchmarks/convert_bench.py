"""Time and peak memory of `ember convert` / `ember quantize` on a TinyLlama-1.1B-sized model.

    PYTHONPATH=build/conv/pkg python benchmarks/convert_bench.py [--size tinyllama|small]
        [--workdir DIR] [--keep]

Writes a checkpoint with TinyLlama-1.1B's shapes (22 layers, hidden 2048, ffn 5632, 32 heads,
4 kv heads, vocab 32000; random f16 weights in two safetensors shards, ~2.2 GB), then runs
each step in a fresh process and reports wall time and peak RSS (VmHWM in /proc/self/status:
getrusage's ru_maxrss survives exec, so a child would report its parent's peak):
  1. convert HF f16 -> q4_k_m GGUF
  2. convert HF f16 -> f16 GGUF
  3. quantize the f16 GGUF -> q4_k_m
Peak RSS should stay at a few copies of the largest tensor (the 32000 x 2048 embedding: 131 MB
in f16, 262 MB in f32), far below the checkpoint's size. Needs ~6 GB of free disk for
--size tinyllama.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SIZES = {
    "tinyllama": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
                  "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000},
    "small": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 32000},
}


def _tensor_shapes(c: dict) -> list[tuple[str, tuple[int, ...]]]:
    d, ff, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = d // c["num_attention_heads"] * c["num_key_value_heads"]
    shapes = [("model.embed_tokens.weight", (v, d))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes += [(p + "input_layernorm.weight", (d,)),
                   (p + "self_attn.q_proj.weight", (d, d)),
                   (p + "self_attn.k_proj.weight", (kv, d)),
                   (p + "self_attn.v_proj.weight", (kv, d)),
                   (p + "self_attn.o_proj.weight", (d, d)),
                   (p + "post_attention_layernorm.weight", (d,)),
                   (p + "mlp.gate_proj.weight", (ff, d)),
                   (p + "mlp.up_proj.weight", (ff, d)),
                   (p + "mlp.down_proj.weight", (d, ff))]
    shapes += [("model.norm.weight", (d,)), ("lm_head.weight", (v, d))]
    return shapes


def write_checkpoint(folder: Path, size: str, n_shards: int = 2) -> int:
    """A random f16 Llama checkpoint of `size`, written tensor by tensor; returns its bytes."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float16",
              "bos_token_id": 1, "eos_token_id": 2, **SIZES[size]}
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("tokenizer.model", "tokenizer_config.json"):  # 512 pieces, padded to 32000
        shutil.copy(REPO / "tests" / "data" / "stories260K-hf" / name, folder / name)
    shapes = _tensor_shapes(config)
    per_shard = -(-len(shapes) // n_shards)
    rng = np.random.default_rng(0)
    weight_map, total = {}, 0
    for s in range(n_shards):
        part = shapes[s * per_shard:(s + 1) * per_shard]
        shard = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        header, offset = {}, 0
        for name, shape in part:
            n_bytes = int(np.prod(shape)) * 2
            header[name] = {"dtype": "F16", "shape": list(shape),
                            "data_offsets": [offset, offset + n_bytes]}
            offset += n_bytes
            weight_map[name] = shard
        blob = json.dumps(header).encode()
        blob += b" " * (-len(blob) % 8)
        with open(folder / shard, "wb") as f:
            f.write(struct.pack("<Q", len(blob)) + blob)
            for _name, shape in part:
                scale = 1.0 if len(shape) == 1 else 1.0 / np.sqrt(shape[-1])
                values = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
                if len(shape) == 1:
                    values += 1.0
                f.write(values.astype(np.float16).tobytes())
        total += (folder / shard).stat().st_size
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return total


_STEP = """
import json, resource, sys, time

def vm(key):  # this process's own figures; ru_maxrss would include the parent's (kept on exec)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

from ember.convert import convert, quantize_gguf
base = vm("VmRSS")
t0 = time.perf_counter()
kind, src, out, typ = sys.argv[1:5]
if kind == "convert":
    convert(src, out, typ, force=True, progress=False)
else:
    quantize_gguf(src, out, typ, force=True, progress=False)
print(json.dumps({"seconds": time.perf_counter() - t0, "peak_rss_mb": vm("VmHWM"),
                  "import_rss_mb": base}))
"""


def run_step(kind: str, src: Path, out: Path, out_type: str) -> dict:
    r = subprocess.run([sys.executable, "-c", _STEP, kind, str(src), str(out), out_type],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{kind} {src} -> {out} failed:\n{r.stderr}")
    result = json.loads(r.stdout.strip().splitlines()[-1])
    result["out_mb"] = out.stat().st_size / 1e6
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=list(SIZES), default="tinyllama")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/ember-convert-bench"))
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint and outputs")
    args = ap.parse_args()
    work = args.workdir / args.size
    if work.exists():
        shutil.rmtree(work)
    hf = work / "hf"
    t0 = time.perf_counter()
    ckpt_bytes = write_checkpoint(hf, args.size)
    print(f"checkpoint: {args.size}, {ckpt_bytes / 1e9:.2f} GB f16 in 2 shards "
          f"(written in {time.perf_counter() - t0:.1f} s)")
    steps = [("convert", hf, work / "direct-q4_k_m.gguf", "q4_k_m"),
             ("convert", hf, work / "f16.gguf", "f16"),
             ("quantize", work / "f16.gguf", work / "requant-q4_k_m.gguf", "q4_k_m")]
    print(f"{'step':<40} {'seconds':>8} {'peak RSS MB':>12} {'(imports) MB':>13} {'out MB':>8}")
    try:
        for kind, src, out, typ in steps:
            r = run_step(kind, src, out, typ)
            label = f"{kind} {src.name} -> {out.name}"
            print(f"{label:<40} {r['seconds']:8.1f} {r['peak_rss_mb']:12.0f} "
                  f"{r['import_rss_mb']:13.0f} {r['out_mb']:8.0f}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
