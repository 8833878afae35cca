"""LoRA adapters per request on the engine (ember._core.Engine(lora=[...]), submit's
lora_adapter / lora_scale), against transformers + PEFT on a tiny random Llama (lora_support.py).

Requests of different adapters, and requests without one, share the engine's steps: each row
adds its own adapter's low-rank product. So the central checks are that a request's logprobs
match PEFT's whatever runs beside it, that they are the same bits alone and batched, and that
the prefix cache never hands one adapter's K/V to another."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from checkpoints import F32_REL
from engine_support import prompts_of, settled_stats
from lora_support import ADAPTERS, LoraCase, lora_case_fixture

from ember import _core

lora_case = lora_case_fixture()

N_VOCAB = 512
N_GEN = 6
INDEX = {name: i for i, name in enumerate(ADAPTERS)}  # the engine's adapter order


def engine_of(case: LoraCase, **options) -> _core.Engine:
    paths = [str(case.adapter_ggufs[name]) for name in ADAPTERS]
    return _core.Engine(str(case.base_gguf), lora=paths, n_threads=2, **options)


def submit(engine: _core.Engine, prompt: list[int], adapter: str | None, scale: float = 1.0):
    return engine.submit(prompt, _core.SamplingParams(temperature=0.0), max_tokens=N_GEN,
                         logprobs=N_VOCAB, lora_adapter=INDEX[adapter] if adapter else -1,
                         lora_scale=scale)


def collect(handle) -> tuple[list[int], np.ndarray, int]:
    """A request's greedy tokens, the full log-softmax of each step [n, n_vocab], and its
    prefix-cache hit."""
    events = []
    while not handle.done:
        events += handle.next_events(60.0)
    tokens = [e.token for e in events if e.token is not None]
    rows = []
    for e in events:
        if e.logprobs is None:
            continue
        row = np.full(N_VOCAB, np.nan, dtype=np.float64)
        for token, value in e.logprobs[1]:
            row[token] = value
        rows.append(row)
    return tokens, np.array(rows), events[-1].n_cached_tokens


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def check_against_peft(case: LoraCase, prompt: list[int], adapter: str | None, scale: float,
                       tokens: list[int], logprobs: np.ndarray) -> None:
    """ember's logprobs of every generated position against PEFT's on the same tokens. The KV
    cache is f16, so logits move by up to F32_REL of the largest (tests/model/test_model_tiny.py);
    a log-softmax value moves by at most twice what the logits do. The adapters move the logits
    by O(1) (asserted), 20-70x that bound."""
    ref = case.hf_logits(adapter, prompt + tokens[:-1], scale)[len(prompt) - 1:]
    tol = 2 * F32_REL * np.abs(ref).max()
    assert logprobs.shape == ref.shape == (N_GEN, N_VOCAB)
    assert np.abs(logprobs - log_softmax(ref)).max() < tol, (adapter, scale)
    assert tokens == ref.argmax(-1).tolist(), (adapter, scale)
    if adapter is not None:
        base = case.hf_logits(None, prompt + tokens[:-1])[len(prompt) - 1:]
        assert np.abs(ref - base).max() > 10 * tol, "the adapter hardly changes the logits"


# (adapter, scale) of the requests that run together: both adapters, one at another scale, and
# requests without one.
MIX = [(None, 1.0), ("all", 1.0), ("qvd", 1.0), ("all", 0.5), (None, 1.0), ("qvd", 2.0)]
LENGTHS = [20, 33, 7, 41, 12, 26]


def test_mixed_adapters_in_one_batch_match_peft_and_running_alone(lora_case: LoraCase) -> None:
    prompts = prompts_of(N_VOCAB, LENGTHS, seed=5)
    # A small step budget: prompts are chunked, and chunks share steps with others' decodes.
    engine = engine_of(lora_case, parallel=8, kv_size=2048, max_batch_tokens=24,
                       prefix_caching=False)
    handles = [submit(engine, p, a, s) for p, (a, s) in zip(prompts, MIX)]
    together = [collect(h) for h in handles]
    stats = settled_stats(engine)
    assert stats["steps"] < len(MIX) * N_GEN  # the requests really shared steps
    for prompt, (adapter, scale), (tokens, logprobs, _) in zip(prompts, MIX, together):
        check_against_peft(lora_case, prompt, adapter, scale, tokens, logprobs)
    # Alone, each request gives the same bits as among the others (the engine is batch-invariant).
    for prompt, (adapter, scale), (tokens, logprobs, _) in zip(prompts, MIX, together):
        alone_tokens, alone_logprobs, _ = collect(submit(engine, prompt, adapter, scale))
        assert alone_tokens == tokens
        np.testing.assert_array_equal(alone_logprobs, logprobs)


def test_f16_adapters_match_peft_in_one_batch(lora_case: LoraCase, tmp_path) -> None:
    """f16 adapter files (`ember convert --lora`'s default) run with f16 pairs: PEFT's f32 values
    rounded to f16 once (alpha / rank is 2 and 0.5 here, so folding it into B rounds nothing
    more), a relative 2^-11 of the adapters' O(1) share of the logits, far inside the tolerance."""
    from ember.convert import convert_lora

    paths = []
    for name in ADAPTERS:
        paths.append(str(tmp_path / f"{name}-f16.gguf"))
        convert_lora(lora_case.adapter_dirs[name], paths[-1], "f16", base=str(lora_case.base_dir),
                     progress=False)
    engine = _core.Engine(str(lora_case.base_gguf), lora=paths, n_threads=2, parallel=4,
                          kv_size=1024, prefix_caching=False)
    mix = MIX[:4]
    prompts = prompts_of(N_VOCAB, LENGTHS[:4], seed=9)
    handles = [submit(engine, p, a, s) for p, (a, s) in zip(prompts, mix)]
    for prompt, (adapter, scale), handle in zip(prompts, mix, handles):
        tokens, logprobs, _ = collect(handle)
        check_against_peft(lora_case, prompt, adapter, scale, tokens, logprobs)


def test_prefix_cache_is_keyed_by_adapter_and_scale(lora_case: LoraCase) -> None:
    engine = engine_of(lora_case, parallel=2, kv_size=2048, block_size=16)
    prompt = prompts_of(N_VOCAB, [40], seed=7)[0]
    first = {}
    for adapter, scale in [("all", 1.0), (None, 1.0), ("qvd", 1.0), ("all", 0.5)]:
        tokens, logprobs, cached = collect(submit(engine, prompt, adapter, scale))
        assert cached == 0, f"{adapter} x{scale} was served another adapter's K/V"
        check_against_peft(lora_case, prompt, adapter, scale, tokens, logprobs)
        first[adapter, scale] = tokens, logprobs
    for key in first:  # each again: its own blocks, every token but the last
        tokens, logprobs, cached = collect(submit(engine, prompt, *key))
        assert cached == 39
        assert tokens == first[key][0]
        np.testing.assert_array_equal(logprobs, first[key][1])


def test_bad_adapter_choices_are_invalid_requests(lora_case: LoraCase) -> None:
    engine = engine_of(lora_case, parallel=1, kv_size=256)
    with pytest.raises(_core.InvalidRequest, match="LoRA adapter 2 does not exist; 2 adapters"):
        engine.submit([1, 5, 6], lora_adapter=2)
    with pytest.raises(_core.InvalidRequest, match="LoRA scale must be a finite number"):
        engine.submit([1, 5, 6], lora_adapter=0, lora_scale=float("nan"))
    plain = _core.Engine(str(lora_case.base_gguf), n_threads=1, parallel=1, kv_size=256)
    with pytest.raises(_core.InvalidRequest, match="LoRA adapter 0 does not exist; 0 adapters"):
        plain.submit([1, 5, 6], lora_adapter=0)


def _adapter_file(path, arch: str = "llama", shape_a=(4, 64), shape_b=(64, 4),
                  name: str = "blk.0.attn_q.weight", general_type: str = "adapter"):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type(general_type)
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 8.0)
    w.add_tensor(name + ".lora_a", np.ones(shape_a, dtype=np.float32))
    w.add_tensor(name + ".lora_b", np.ones(shape_b, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_adapters_that_do_not_fit_the_model_are_refused(lora_case: LoraCase, tmp_path) -> None:
    base = str(lora_case.base_gguf)
    cases = [
        (base, "general.type is '[a-z]*', expected 'adapter'"),
        (_adapter_file(tmp_path / "arch.gguf", arch="qwen2"),
         "general.architecture is 'qwen2', the model's is 'llama'"),
        (_adapter_file(tmp_path / "shape.gguf", shape_a=(4, 32)),
         r"tensor 'blk.0.attn_q.weight.lora_a': lora_a has shape \[32, 4\].*needs \[64, rank\]"),
        (_adapter_file(tmp_path / "layer.gguf", name="blk.7.attn_q.weight"),
         "'blk.7.attn_q.weight' is not a projection ember adapts"),
        (_adapter_file(tmp_path / "embd.gguf", name="token_embd.weight"),
         "'token_embd.weight' is not a projection ember adapts"),
    ]
    for path, message in cases:
        with pytest.raises((ValueError, NotImplementedError), match=message):
            _core.Engine(base, lora=[path], n_threads=1, parallel=1, kv_size=256)


def test_adapter_equals_its_merged_weights(lora_case: LoraCase, tmp_path) -> None:
    """The adapter's product added per row against PEFT's merge_and_unload (W + alpha / rank · BA)
    converted as a plain model: both keep K/V in f16, so what differs is only the f32 rounding of
    W·x + B·(A·x) against (W + BA)·x (~1e-6 relative), which now and then tips one f16 rounding of
    a cached value; measured at most 1.3e-4 on logprobs of magnitude ~10, 30x below
    check_against_peft's bound. 1e-3 leaves 8x room; dropping any one projection's product
    moves them by O(1)."""
    import copy

    from checkpoints import save_checkpoint

    from ember.convert import convert

    merged = copy.deepcopy(lora_case.peft["all"]).merge_and_unload()
    convert(save_checkpoint(merged, tmp_path / "merged"), tmp_path / "merged.gguf", "f32",
            progress=False)
    adapted = engine_of(lora_case, parallel=2, kv_size=1024)
    plain = _core.Engine(str(tmp_path / "merged.gguf"), n_threads=2, parallel=2, kv_size=1024)
    for prompt in prompts_of(N_VOCAB, [20, 45], seed=3):
        tokens, logprobs, _ = collect(submit(adapted, prompt, "all"))
        merged_tokens, merged_logprobs, _ = collect(submit(plain, prompt, None))
        assert tokens == merged_tokens
        assert np.abs(logprobs - merged_logprobs).max() < 1e-3


def test_llm_and_ember_run_pick_adapters_by_name(lora_case: LoraCase) -> None:
    """ember.LLM(path, lora={name: file}) with per-call lora=NAME, and `ember run --lora FILE
    --lora-scale S`, give PEFT's greedy tokens."""
    import json
    import subprocess
    import sys

    from ember import LLM

    prompt = prompts_of(N_VOCAB, [15], seed=9)[0]

    def greedy(adapter: str | None, scale: float = 1.0) -> list[int]:
        tokens = list(prompt)
        for _ in range(N_GEN):
            tokens.append(int(lora_case.hf_logits(adapter, tokens, scale)[-1].argmax()))
        return tokens[len(prompt):]

    files = {name: lora_case.adapter_ggufs[name] for name in ADAPTERS}
    llm = LLM(str(lora_case.base_gguf), n_threads=2, parallel=2, kv_size=512, lora=files)
    try:
        for adapter, scale in [(None, 1.0), ("all", 1.0), ("qvd", 0.5)]:
            result = llm.generate(prompt, max_tokens=N_GEN, temperature=0.0, lora=adapter,
                                  lora_scale=scale, ignore_eos=True)
            assert result.tokens == greedy(adapter, scale), (adapter, scale)
        with pytest.raises(ValueError, match=r"unknown LoRA adapter 'nope' \(loaded: all, qvd\)"):
            llm.generate(prompt, max_tokens=2, lora="nope")
    finally:
        llm.close()
    with pytest.raises(FileNotFoundError, match="LoRA adapter 'x': no such file"):
        LLM(str(lora_case.base_gguf), n_threads=1, lora={"x": "/nonexistent.gguf"})

    run = subprocess.run(
        [sys.executable, "-m", "ember.cli", "run", str(lora_case.base_gguf), "-p", "Once upon",
         "-n", str(N_GEN), "--temp", "0", "--json", "--lora",
         str(lora_case.adapter_ggufs["all"]), "--lora-scale", "0.5", "-t", "2"],
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    tokens = json.loads(run.stdout)["tokens"]
    llm = LLM(str(lora_case.base_gguf), n_threads=2, parallel=1, kv_size=512, lora=files)
    try:
        expected = llm.generate("Once upon", max_tokens=N_GEN, temperature=0.0, lora="all",
                                lora_scale=0.5)
        plain = llm.generate("Once upon", max_tokens=N_GEN, temperature=0.0)
    finally:
        llm.close()
    assert tokens == expected.tokens != plain.tokens


def test_the_cache_key_is_the_adapters_content_not_its_place(lora_case: LoraCase, tmp_path) -> None:
    """Blocks on disk (--cache-dir) outlive the engine: a restarted engine that loads the same
    adapters in the other order reads each adapter's own blocks, never the other's (the
    namespace is a hash of an adapter's values and scale, not its index)."""
    prompt = prompts_of(N_VOCAB, [40], seed=11)[0]
    paths = [str(lora_case.adapter_ggufs[name]) for name in ADAPTERS]
    options = dict(n_threads=2, parallel=2, kv_size=2048, block_size=16, cache_dir=str(tmp_path))
    engine = _core.Engine(str(lora_case.base_gguf), lora=paths, **options)
    first = {name: collect(submit(engine, prompt, name)) for name in ADAPTERS}
    assert all(cached == 0 for _, _, cached in first.values())
    del engine  # flushes the disk cache
    swapped = _core.Engine(str(lora_case.base_gguf), lora=paths[::-1], **options)
    for i, name in enumerate(reversed(ADAPTERS)):
        handle = swapped.submit(prompt, _core.SamplingParams(temperature=0.0), max_tokens=N_GEN,
                                logprobs=N_VOCAB, lora_adapter=i, lora_scale=1.0)
        tokens, logprobs, cached = collect(handle)
        assert cached == 32, name  # its own two full blocks, from disk
        assert tokens == first[name][0], name
        np.testing.assert_allclose(logprobs, first[name][1], atol=0, rtol=0)
