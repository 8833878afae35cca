"""Dequantization throughput: ember's reference converters (ember._core.dequantize) against
gguf-py's numpy ones (gguf.quants.dequantize), per type, on random blocks with finite scales.
Note that gguf-py's f32 "dequantize" is a zero-copy view, so its figure for f32 is meaningless.

    PYTHONPATH=build/quant/pkg python benchmarks/dequant_bench.py [--size-mb 64] [--numpy-size-mb 8]

GB/s counts quantized input bytes read; Gelem/s counts float32 values written. ember's time
includes allocating the output array, as a caller of ember.dequantize pays it. "per CPU-s"
divides by the CPU time of all threads instead of wall time: on a busy machine it shows what the
code costs when the wall-clock figures mostly show waiting for a core.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import gguf
import numpy as np
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize as gguf_dequantize

import ember._core as core

TYPES = [
    "f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
    "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs",
]  # fmt: skip

# Byte offsets of the f16 scales in each block; random bytes there could be inf/NaN.
F16_FIELDS = {
    "q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q8_0": [0],
    "q2_k": [80, 82], "q3_k": [108], "q4_k": [0, 2], "q5_k": [0, 2], "q6_k": [208],
    "iq4_nl": [0], "iq4_xs": [0],
}  # fmt: skip


def random_blocks(name: str, n_bytes: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """About n_bytes of random blocks of type `name` (uint8) and their element count. Plain float
    types keep their random bit patterns (NaNs cost nothing when only converting)."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[GT[name.upper()]]
    n_blocks = max(n_bytes // type_size, 1)
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for offset in F16_FIELDS.get(name, []):
        scales = rng.uniform(1e-4, 1e-2, n_blocks).astype(np.float16)
        raw[:, offset : offset + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1), n_blocks * block_size


def best_seconds(fn: Callable[..., object], fn_args: tuple, repeats: int) -> tuple[float, float]:
    """The fastest of `repeats` calls fn(*fn_args): (wall seconds, CPU seconds of all threads)."""
    best_wall, best_cpu = float("inf"), float("inf")
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn(*fn_args)
        best_wall = min(best_wall, time.perf_counter() - wall)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    return best_wall, best_cpu


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size-mb", type=float, default=64.0, help="quantized input per type for ember"
    )
    parser.add_argument(
        "--numpy-size-mb",
        type=float,
        default=8.0,
        help="input per type for gguf-py (slow, memory hungry)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--types", nargs="*", default=TYPES)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    print(
        f"cpus available: {len(os.sched_getaffinity(0))}; ember input {args.size_mb:g} MB, "
        f"gguf-py input {args.numpy_size_mb:g} MB"
    )
    header = (
        f"{'type':8s} {'ember GB/s':>10s} {'Gelem/s':>8s} {'GB/CPU-s':>9s}"
        f" {'gguf-py GB/s':>12s} {'Gelem/s':>8s} {'GB/CPU-s':>9s} {'speedup':>8s}"
    )
    print(header)
    print("-" * len(header))
    for name in args.types:
        raw, n = random_blocks(name, int(args.size_mb * 2**20), rng)
        wall, cpu = best_seconds(core.dequantize, (name, raw, n), args.repeats)
        small, n_small = random_blocks(name, int(args.numpy_size_mb * 2**20), rng)
        qtype = GT[name.upper()]
        np_wall, np_cpu = best_seconds(gguf_dequantize, (small, qtype), max(1, args.repeats // 2))
        print(
            f"{name:8s} {raw.size / wall / 1e9:10.2f} {n / wall / 1e9:8.3f} {raw.size / cpu / 1e9:9.2f}"
            f" {small.size / np_wall / 1e9:12.3f} {n_small / np_wall / 1e9:8.3f}"
            f" {small.size / np_cpu / 1e9:9.3f} {(raw.size / wall) / (small.size / np_wall):7.1f}x"
        )


if __name__ == "__main__":
    main()
