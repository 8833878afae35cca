"""The weight types table: decode (tg) and prefill (pp) speed per weight type, ember against
llama.cpp's llama-bench on the same file, same threads, back to back (compare_llamacpp.py).

    python benchmarks/weight_types_bench.py VOCAB.gguf [--preset stories110m] [-t 2] [-r 3]
                                            [--types q4_0,tq1_0,tq2_0] [--dir /tmp/wtb]

A random-weight Llama at real dimensions (../shared/bench/make_bench_model.py, stories110m: every
row whole 256-element super-blocks) is written once in f32, then quantized by `ember quantize`
to each type: the files llama.cpp reads are the ones ember writes. tg is dominated by the
matrix-vector products over the weights, so its ratio is the dot products' speed ratio.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vocab", type=Path, help="a vocab-only GGUF (llama.cpp's ggml-vocab-llama-spm.gguf)")
    parser.add_argument("--maker", type=Path, default=HERE.parent.parent / "shared/bench/make_bench_model.py")
    parser.add_argument("--preset", default="stories110m")
    parser.add_argument("--types", default="q4_0,tq1_0,tq2_0")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-r", "--repetitions", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/weight_types_bench"))
    args = parser.parse_args()
    from ember.convert import quantize_gguf

    args.dir.mkdir(parents=True, exist_ok=True)
    f32 = args.dir / f"{args.preset}-f32.gguf"
    if not f32.exists():
        subprocess.run([sys.executable, str(args.maker), str(args.vocab), str(f32), "--preset", args.preset,
                        "--f32"], check=True)
    rows = []
    for name in args.types.split(","):
        path = args.dir / f"{args.preset}-{name}.gguf"
        if not path.exists():
            quantize_gguf(f32, path, name, progress=False)
        command = [sys.executable, str(HERE / "compare_llamacpp.py"), str(path), "-p", "64", "-n", "32",
                   "-t", str(args.threads), "-r", str(args.repetitions), "--markdown"]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rows.append(out.strip().splitlines()[-1])
        print(rows[-1], flush=True)
    print("| file | threads | pp64 ember / llama.cpp | tg32 ember / llama.cpp | ember GB/s |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
