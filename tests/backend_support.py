"""What the GPU backends' tests (tests/vulkan, tests/cuda) share: a model's logits on a device,
the comparison of a device's greedy text with the CPU's up to near ties, and the tiny llama in
every k-quant and iq4_nl that reaches every weight type's kernels at model scale."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
from engine_support import run_all, tokens_of

from ember import _core


def logits(path: Path, device: str, tokens: list[int], isa: str | None = None) -> np.ndarray:
    """Logits of every row of `tokens` on `device` (the CPU capped at `isa`: in a child process,
    as the ISA is chosen once per process)."""
    if isa is None:
        return np.asarray(_core.Model(str(path), device=device).eval(tokens))
    code = ("import sys, json, numpy as np; from ember import _core; "
            f"m = _core.Model({str(path)!r}, device={device!r}); "
            f"np.save(sys.stdout.buffer, np.asarray(m.eval({tokens!r})))")
    env = dict(os.environ, **({"EMBER_CPU_ISA": isa} if isa else {}))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=600, check=True)
    return np.load(io.BytesIO(out.stdout))


def assert_greedy_is_the_cpus_up_to_near_ties(path: Path, device: str, prompt: list[int], n: int,
                                              allowed: Callable[[list[int], np.ndarray], float]) -> None:
    """The logits on `device` stay within allowed(tokens, CPU logits) of the CPU's, and greedy
    text equals the CPU's up to the first token where the CPU's top two logits are that close."""
    cpu, dev = (tokens_of(run_all(_core.Engine(str(path), parallel=1, kv_size=256, device=d), [prompt], n)[0])
               for d in ("cpu", device))
    tokens = prompt + cpu
    ref = logits(path, "cpu", tokens)
    bound = allowed(tokens, ref)
    deviation = np.abs(ref - logits(path, device, tokens)).max()
    assert deviation <= bound, (path.name, prompt, deviation, bound)
    for i, (a, b) in enumerate(zip(cpu, dev)):
        if a == b:
            continue
        row = ref[len(prompt) + i - 1]
        margin = float(row[a] - row[b])
        print(f"{path.name} {prompt}: token {i} flips ({a} on the CPU, {b} on {device}); "
              f"CPU logit margin {margin:.4f}")
        assert margin <= 2 * deviation, (path.name, prompt, i, margin, deviation)
        break


def iq4_nl_copy(src: Path, out: Path) -> Path:
    """`src` (f32) with every 2-D weight of whole blocks of 32 rewritten as iq4_nl, the rest
    kept. ember (like gguf-py) has no iq4_nl quantizer, so this one picks, per block, the scale
    that maps the value of largest magnitude onto the codebook's -127 and the nearest codebook
    entry for each value: a plain, valid iq4_nl file (llama.cpp's quantizer also searches
    scales, which changes the values, not the format)."""
    import gguf

    codebook = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                        np.float32)
    reader = gguf.GGUFReader(src)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(str(out), arch)
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name in ("general.architecture", "general.alignment"):
            continue
        value = f.contents()
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, value, f.types[0], sub)
    for t in reader.tensors:
        a = np.asarray(t.data, np.float32).reshape([int(d) for d in reversed(t.shape)])
        if a.ndim != 2 or a.shape[-1] % 32 or not t.name.endswith(".weight"):
            w.add_tensor(t.name, a)
            continue
        blocks = a.reshape(-1, 32)
        big = blocks[np.arange(len(blocks)), np.abs(blocks).argmax(axis=1)]
        d = (big / -127).astype(np.float16)
        scaled = blocks / np.where(d == 0, 1, d).astype(np.float32)[:, None]
        q = np.abs(scaled[:, :, None] - codebook).argmin(axis=2).astype(np.uint8)
        packed = np.concatenate([d.view(np.uint8).reshape(-1, 2), q[:, :16] | (q[:, 16:] << 4)], axis=1)
        w.add_tensor(t.name, packed.reshape(a.shape[0], -1), raw_dtype=gguf.GGMLQuantizationType.IQ4_NL)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def quantized_tiny_llamas(folder: Path) -> dict[str, Path]:
    """A random llama whose rows are whole k-quant blocks (hidden 256, ffn 512), quantized by
    ember's own quantizer to q2_k (q2_k, q3_k, q4_k, q6_k weights), q3_k_m (q3_k, q4_k, q5_k)
    and q5_k_m (q5_k, q6_k), and an iq4_nl copy."""
    from tiny_models import make_model, write_gguf

    from ember.convert import quantize_gguf

    f32 = write_gguf(make_model("llama", seed=3, hidden_size=256, intermediate_size=512),
                     folder / "f32.gguf", "llama")
    files = {t: quantize_gguf(f32, folder / f"{t}.gguf", t, progress=False).path
             for t in ("q2_k", "q3_k_m", "q5_k_m")}
    files["iq4_nl"] = iq4_nl_copy(f32, folder / "iq4_nl.gguf")
    return files
