"""Image encode time per image: ember's vision encoder (ember._core.VisionModel on the CPU) and
llama.cpp's mtmd (`llama-mtmd-cli`) on the same mmproj file, same threads.

    python benchmarks/image_encode.py [--mmproj MMPROJ.gguf --model TEXT.gguf] [-t 2] [-r 3]
                                      [--shape base|tiny] [--mtmd-cli PATH]

Without --mmproj, a random Gemma 3 checkpoint of the shape chosen is made and converted with
ember convert (f16; its tower as below, a 2-layer text model): "base" is a SigLIP-B-shaped tower
(12 layers, width 768, 224x224 pixels in 16x16 patches: 196 patches pooled 2x2 into 49 tokens),
"tiny" the tests' (64x64, 2 layers). The image is the tests' gradient-and-noise picture at the
tower's size (no resize on either side). ember: one warm-up, then -r timed encodes, each of the
same pixels through VisionModel.encode (the Python preprocessing not included, as llama.cpp's
figure excludes its own). llama.cpp: llama-mtmd-cli -m TEXT --mmproj MMPROJ --image PNG -n 1
-t T --chat-template gemma, run -r times after a warm-up; its log's "mtmd batch encoding done
in N ms" (older builds: "image slice encoded in N ms") is the encode alone. The peer is
found in $EMBER_PEER_DIR/llama.cpp/build/bin (default ~/.cache/ember-peer), as
benchmarks/llamacpp_peer.py finds it (`cmake --build build --target llama-mtmd-cli`).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llamacpp_peer import peer_binary

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

SHAPES = {
    "base": ({"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
              "num_attention_heads": 12, "image_size": 224, "patch_size": 16}, 49),
    "tiny": (None, None),
}


def make_files(shape: str, folder: Path) -> tuple[Path, Path]:
    import vision_support as vs

    from ember.convert import convert
    vision, tokens = SHAPES[shape]
    if vision is not None:
        vs.GEMMA3_VISION = {**vs.GEMMA3_VISION, **vision}
        vs.GEMMA3_MM_TOKENS = tokens
    model = vs.make_gemma3_vision()
    vs.save_gemma3_vision(model, folder / "hf")
    result = convert(folder / "hf", folder / "text.gguf", "f16", progress=False)
    return result.path, result.mmproj


def time_ember(mmproj: Path, n_threads: int, reps: int, image) -> list[float]:
    from ember import _core, vision
    projector = _core.VisionModel(str(mmproj), "cpu", n_threads)
    pixels = vision.preprocess(image, projector)
    projector.encode(pixels)  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        projector.encode(pixels)
        times.append(time.perf_counter() - start)
    return times


def time_mtmd(exe: str, model: Path, mmproj: Path, png: Path, n_threads: int, reps: int
              ) -> list[float]:
    times = []
    for _ in range(reps + 1):  # the first is a warm-up (page cache)
        proc = subprocess.run([exe, "-m", str(model), "--mmproj", str(mmproj), "--image", str(png),
                               "-p", "describe", "-n", "1", "-t", str(n_threads), "--temp", "0",
                               "--chat-template", "gemma"],
                              capture_output=True, text=True, timeout=600)
        found = re.search(r"(?:image slice encoded in|mtmd batch encoding done in) (\d+) ms",
                          proc.stdout + proc.stderr)
        if not found:
            raise RuntimeError(f"llama-mtmd-cli printed no encode time (exit {proc.returncode}):\n"
                               f"{(proc.stdout + proc.stderr)[-2000:]}")
        times.append(int(found.group(1)) / 1000)
    return times[1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mmproj", type=Path)
    ap.add_argument("--model", type=Path, help="the text model llama-mtmd-cli needs beside it")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="base")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--mtmd-cli")
    args = ap.parse_args()
    from PIL import Image
    from vision_support import sample_image

    from ember import _core
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model, mmproj = ((args.model, args.mmproj) if args.mmproj
                         else make_files(args.shape, folder))
        side = _core.VisionModel(str(mmproj)).image_size
        image = sample_image(0, (side, side))
        png = folder / "image.png"
        Image.fromarray(image).save(png)
        ours = time_ember(mmproj, args.threads, args.reps, image)
        print(f"ember      {statistics.median(ours) * 1e3:8.1f} ms per image "
              f"(median of {args.reps}: {', '.join(f'{t * 1e3:.1f}' for t in ours)})")
        exe = peer_binary("llama-mtmd-cli", args.mtmd_cli)
        if exe is None or model is None:
            print("llama.cpp  (no llama-mtmd-cli, or no --model beside --mmproj)")
            return
        theirs = time_mtmd(exe, model, mmproj, png, args.threads, args.reps)
        print(f"llama.cpp  {statistics.median(theirs) * 1e3:8.1f} ms per image "
              f"(median of {args.reps}: {', '.join(f'{t * 1e3:.1f}' for t in theirs)})")
        print(f"ratio      {statistics.median(ours) / statistics.median(theirs):8.2f} "
              "(ember / llama.cpp; < 1: ember faster)")


if __name__ == "__main__":
    main()
