"""What the GPU backends' tests (tests/vulkan, tests/cuda) share: a model's logits on a device,
the comparison of a device's greedy text with the CPU's up to near ties, the tiny llama in
every k-quant and iq4_nl that reaches every weight type's kernels at model scale, and the checks
both backends must pass the same way (check_*: a device's test calls them with its device)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
from engine_support import prompts_of, reference_greedy, run_all, settled_stats, tokens_of

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


def check_smollm2_greedy_up_to_near_ties(smollm2_path: Path, device: str) -> None:
    """SmolLM2 (Q4_1): the allowed deviation is twice the spread between the CPU backend's own
    scalar and SIMD kernels (which round activations and sums differently)."""

    def twice_the_cpu_spread(tokens: list[int], ref: np.ndarray) -> float:
        return 2 * np.abs(ref - logits(smollm2_path, "cpu", tokens, isa="scalar")).max()

    tokenizer = _core.Tokenizer(str(smollm2_path))
    for prompt in ("The capital of France is", "def fibonacci(n):"):
        assert_greedy_is_the_cpus_up_to_near_ties(smollm2_path, device, list(tokenizer.encode(prompt)), 8,
                                                  twice_the_cpu_spread)


def check_quantized_llama_up_to_a_quarter_of_the_rounding(path: Path, device: str) -> None:
    """The device's logits of a quantized_tiny_llamas file stay within a quarter of what quantizing
    did to the CPU's (the CPU's logits of the file against its f32.gguf's), and its greedy text is
    the CPU's up to near ties."""
    f32 = path.parent / "f32.gguf"

    def quarter_of_the_rounding(tokens: list[int], ref: np.ndarray) -> float:
        return np.abs(ref - logits(f32, "cpu", tokens)).max() / 4

    for prompt in prompts_of(256, [1, 9, 30], seed=11):
        assert_greedy_is_the_cpus_up_to_near_ties(path, device, prompt, 16, quarter_of_the_rounding)


def check_batching_is_invisible_and_prefix_caching_holds(stories_path: Path, device: str) -> None:
    model = _core.Model(str(stories_path), n_threads=2, device="cpu")
    prompts = prompts_of(model.n_vocab, [1, 17, 40, 5, 33, 70], seed=5)
    n_gen = 12
    reference = [reference_greedy(model, p, n_gen) for p in prompts]
    engine = _core.Engine(str(stories_path), parallel=8, kv_size=2048, max_batch_tokens=32,
                          prefix_caching=False, device=device)
    batched = [tokens_of(ev) for ev in run_all(engine, prompts, n_gen)]
    for i, p in enumerate(prompts):
        assert batched[i] == reference[i], f"prompt {i} ({len(p)} tokens) among others"
    # Prefix caching: 2 full blocks of 16 shared, then rows copied from the 3rd (copy_kv): 39 of
    # the same 40 tokens (the last one runs for its logits), and 36 shared ones.
    cached = _core.Engine(str(stories_path), parallel=4, kv_size=1024, block_size=16, device=device)
    base = prompts[2]
    first = run_all(cached, [base], n_gen)[0]
    other = base[:36] + prompts_of(model.n_vocab, [9], seed=6)[0][1:]
    again, shared = run_all(cached, [base, other], n_gen)
    assert first[-1].n_cached_tokens == 0
    assert again[-1].n_cached_tokens == 39 and shared[-1].n_cached_tokens == 36
    assert tokens_of(again) == tokens_of(first) == reference[2]
    assert tokens_of(shared) == reference_greedy(model, other, n_gen)


def check_one_device_submission_per_engine_step(stories_path: Path, device: str) -> None:
    engine = _core.Engine(str(stories_path), parallel=4, kv_size=1024, max_batch_tokens=16, device=device)
    before = engine.device_submissions
    model = _core.Model(str(stories_path), n_threads=2, device="cpu")
    run_all(engine, prompts_of(model.n_vocab, [3, 30, 50], seed=7), 10)
    stats = settled_stats(engine)
    assert engine.device_submissions - before == stats["steps"] > 0
    total, free = engine.device_memory
    assert total > 0 and 0 <= free <= total
    assert engine.device.startswith(device)


def check_the_server_contract_tests_pass(device: str) -> None:
    """tests/server/test_server_api.py (the openai client against the server on stories260K: chat and
    completions, streamed and not, n, logprobs, stops, logit_bias, penalties, seeds, prefix-cache
    usage, models, tokenize, slots, metrics, health), unchanged, with its server on `device`: its
    ServerConfig leaves the device to $EMBER_DEVICE."""
    env = dict(os.environ, EMBER_DEVICE=device)
    suite = Path(__file__).resolve().parent / "server" / "test_server_api.py"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]
