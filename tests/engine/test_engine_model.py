"""The continuous-batching engine on real models (ember._core.Engine, ember.engine).

The central property: batching is invisible in the output. A request's greedy tokens are the
same whether it ran alone or among 15 others with different prompt lengths (sharing steps with
their chunked prefills and decodes), whether its prefix came from the cache or not, and whether
it was preempted on the way; and they equal the single-sequence loop on ember.Model.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from engine_support import prompts_of, reference_greedy, run_all, settled_stats, submit, tokens_of

from ember import _core
from ember.engine import Engine
from ember.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


LENGTHS = [1, 3, 17, 40, 5, 64, 2, 33, 100, 9, 16, 47, 8, 71, 25, 130]  # 16 prompts


@pytest.fixture(scope="module")
def stories_model(stories_path: Path) -> _core.Model:
    return _core.Model(str(stories_path), n_threads=2)


def test_batched_equals_alone_equals_single_sequence_loop(stories_path: Path,
                                                          stories_model: _core.Model) -> None:
    prompts = prompts_of(stories_model.n_vocab, LENGTHS)
    n_gen = 20
    reference = [reference_greedy(stories_model, p, n_gen) for p in prompts]
    alone = _core.Engine(str(stories_path), n_threads=2, parallel=1, kv_size=4096)
    alone_tokens = []
    for p in prompts:
        alone_tokens.append(tokens_of(run_all(alone, [p], n_gen)[0]))
    assert alone.stats()["preemptions"] == 0
    # A small step budget: prompts are chunked, and chunks share steps with others' decodes.
    together = _core.Engine(str(stories_path), n_threads=2, parallel=16, kv_size=8192, max_batch_tokens=48,
                            prefix_caching=False)
    batched = [tokens_of(ev) for ev in run_all(together, prompts, n_gen)]
    stats = settled_stats(together)
    assert stats["generation_tokens_total"] == 16 * n_gen
    assert stats["prompt_tokens_total"] == sum(LENGTHS)
    assert stats["steps"] < 16 * n_gen  # requests really shared steps
    for i in range(16):
        assert alone_tokens[i] == reference[i], f"prompt {i} alone"
        assert batched[i] == reference[i], f"prompt {i} among 15 others"


def test_prefix_cache_hits_are_reported_and_change_nothing(stories_path: Path,
                                                           stories_model: _core.Model) -> None:
    engine = _core.Engine(str(stories_path), n_threads=2, parallel=4, kv_size=2048, block_size=16)
    base = prompts_of(stories_model.n_vocab, [100], seed=3)[0]
    first = run_all(engine, [base], 16)[0]
    assert first[-1].n_cached_tokens == 0
    # 90 shared tokens: 5 full blocks of 16 shared, 10 rows copied from the 6th.
    other = base[:90] + prompts_of(stories_model.n_vocab, [11], seed=4)[0][1:]
    again, shared = run_all(engine, [base, other], 16)
    assert again[-1].n_cached_tokens == 99  # every token but the last (its logits are needed)
    assert shared[-1].n_cached_tokens == 90
    assert tokens_of(again) == tokens_of(first) == reference_greedy(stories_model, base, 16)
    assert tokens_of(shared) == reference_greedy(stories_model, other, 16)
    stats = settled_stats(engine)
    assert stats["prefix_hit_tokens"] == 99 + 90
    assert stats["prefix_query_tokens"] == 100 + 100 + 100


def test_partial_block_reuse_keeps_tokens_and_logprobs(smollm2_path: Path) -> None:
    """Rows copied from a partly filled cached block give the same greedy tokens and the same
    logprobs, bit for bit, as computing them: prefix caching on against off."""
    prompts = prompts_of(49152, [76, 76, 70], seed=21)
    prompts[1] = prompts[0][:45] + prompts[1][45:]  # shares 45 tokens: 2 blocks and 13 rows
    prompts[2] = prompts[0][:70]                    # a strict prefix, mid-block
    runs = {}
    for caching in (False, True):
        engine = _core.Engine(str(smollm2_path), n_threads=2, parallel=2, kv_size=1024,
                              prefix_caching=caching)
        first = run_all(engine, [prompts[0]], 6, logprobs=2)[0]
        later = [run_all(engine, [p], 6, logprobs=2)[0] for p in (prompts[0], prompts[1], prompts[2])]
        runs[caching] = [first, *later]
        del engine
    assert [ev[-1].n_cached_tokens for ev in runs[True]] == [0, 75, 45, 69]
    assert [ev[-1].n_cached_tokens for ev in runs[False]] == [0, 0, 0, 0]
    for off, on in zip(runs[False], runs[True], strict=True):
        assert tokens_of(on) == tokens_of(off)
        assert [e.logprobs for e in on] == [e.logprobs for e in off]


def test_preemption_never_changes_output(stories_path: Path, stories_model: _core.Model) -> None:
    prompts = prompts_of(stories_model.n_vocab, [40, 35, 50, 45, 30, 60, 20, 55], seed=5)
    n_gen = 40
    # 12 blocks of 16 = 192 tokens for 8 requests of ~80 tokens each: most must wait or be preempted.
    engine = _core.Engine(str(stories_path), n_threads=2, parallel=8, kv_size=192, max_batch_tokens=64,
                          prefix_caching=False)
    got = [tokens_of(ev) for ev in run_all(engine, prompts, n_gen)]
    assert settled_stats(engine)["preemptions"] > 0
    for p, tokens in zip(prompts, got):
        assert tokens == reference_greedy(stories_model, p, n_gen)


def test_cancellation_frees_blocks(stories_path: Path, stories_model: _core.Model) -> None:
    engine = _core.Engine(str(stories_path), n_threads=2, parallel=4, kv_size=1024)
    prompt = prompts_of(stories_model.n_vocab, [60], seed=6)[0]
    handle = submit(engine, prompt, max_tokens=400, temperature=0.0)
    events = []
    while len(events) < 3:
        events += handle.next_events(30.0)
    assert engine.stats()["kv_usage"] > 0
    engine.cancel(handle.id)
    while not handle.done:
        events += handle.next_events(30.0)
    assert events[-1].finish_reason == "cancelled" and events[-1].token is None
    assert all(e.finish_reason is None for e in events[:-1])
    stats = settled_stats(engine)
    assert stats["running"] == 0 and stats["waiting"] == 0
    assert stats["kv_usage"] == 0.0
    assert handle.next_events(0.01) == []


def test_seeded_sampling_is_the_same_alone_and_batched(stories_path: Path,
                                                       stories_model: _core.Model) -> None:
    prompts = prompts_of(stories_model.n_vocab, [12, 30, 7, 50], seed=7)
    kw = {"max_tokens": 24, "temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 1234,
          "repeat_penalty": 1.1}

    def run(engine: _core.Engine, ps: list[list[int]]) -> list[list[int]]:
        handles = [submit(engine, p, **kw) for p in ps]
        out = []
        for h in handles:
            evs = []
            while not h.done:
                evs += h.next_events(60.0)
            out.append(tokens_of(evs))
        return out

    alone = _core.Engine(str(stories_path), n_threads=2, parallel=1, kv_size=2048)
    together = _core.Engine(str(stories_path), n_threads=2, parallel=4, kv_size=2048, max_batch_tokens=32)
    singles = [run(alone, [p])[0] for p in prompts]
    assert run(together, prompts) == singles
    # The same seeded request through the single-sequence Sampler on the model's logits.
    p = prompts[1]
    sampler = _core.Sampler(_core.SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=1234,
                                                 repeat_penalty=1.1), stories_model.n_vocab)
    sampler.accept_many(p)
    logits = stories_model.eval_last(p, reset=True)
    expected = []
    for _ in range(24):
        t = sampler.sample(logits)
        sampler.accept(t)
        expected.append(t)
        logits = stories_model.eval_last([t], reset=False)
    assert singles[1] == expected


def test_logprobs_match_the_model_logits(stories_path: Path, stories_model: _core.Model) -> None:
    engine = _core.Engine(str(stories_path), n_threads=2, parallel=2, kv_size=1024)
    prompt = prompts_of(stories_model.n_vocab, [20], seed=8)[0]
    events = run_all(engine, [prompt], 3, logprobs=5)[0]
    logits = stories_model.eval_last(prompt, reset=True)
    logprob, top = _core.token_logprobs(logits, events[0].token, 5)
    got_logprob, got_top = events[0].logprobs
    assert got_logprob == pytest.approx(logprob, abs=1e-5)
    assert [t for t, _ in got_top] == [t for t, _ in top]
    assert run_all(engine, [prompt], 1)[0][0].logprobs is None


def test_requests_that_can_never_run_are_refused(stories_path: Path) -> None:
    engine = _core.Engine(str(stories_path), n_threads=1, parallel=1, n_ctx=64, kv_size=256, max_queue=2)
    with pytest.raises(ValueError, match="empty"):
        submit(engine, [])
    with pytest.raises(ValueError, match="vocabulary"):
        submit(engine, [1, 999999])
    with pytest.raises(ValueError, match="context") as too_long:
        submit(engine, [1] * 65)
    assert isinstance(too_long.value, _core.PromptTooLong)  # an InvalidRequest, a ValueError
    assert (too_long.value.n_prompt_tokens, too_long.value.n_ctx) == (65, 64)
    with pytest.raises(ValueError, match="top_p"):
        submit(engine, [1, 2], top_p=1.5)
    with pytest.raises(ValueError):
        submit(engine, [1, 2], max_tokens=0)
    with pytest.raises(ValueError, match="kv_type must be 'f16' or 'q8_0', got 'q4_0'"):
        _core.Engine(str(stories_path), kv_type="q4_0")


def test_a_full_queue_refuses_the_next_request(smollm2_path: Path) -> None:
    # max_queue: one slot, two waiting, the next is refused. Each request asks for 2000
    # tokens of SmolLM2 (seconds on one thread), so none can finish and drain the queue while
    # the loop submits, however loaded the machine (50-token requests sometimes did).
    engine = _core.Engine(str(smollm2_path), n_threads=1, parallel=1, n_ctx=2048, kv_size=2048,
                          max_queue=2)
    handles = []
    with pytest.raises(_core.EngineBusy, match="queue"):
        for _ in range(10):
            handles.append(submit(engine, [1, 2, 3], max_tokens=2000, temperature=0.0))
    assert len(handles) == 3
    for h in handles:
        engine.cancel(h.id)


def test_submit_from_many_threads(stories_path: Path, stories_model: _core.Model) -> None:
    engine = Engine(stories_path, n_threads=2, parallel=8, kv_size=4096)
    prompts = ["Once upon a time", "The little dog", "Lily went to", "One day, a bird"] * 3
    results: dict[int, list[int]] = {}

    def worker(i: int) -> None:
        results[i] = engine.generate(prompts[i], SamplingParams(temperature=0.0, max_tokens=16)).tokens

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, p in enumerate(prompts):
        ids = engine.tokenizer.encode(p, True, False)
        expected = reference_greedy(stories_model, ids, 16)
        # generation ends early at an end-of-generation token, which is not output
        assert results[i] == expected[: len(results[i])]
        assert len(results[i]) == 16 or engine.tokenizer.is_eog(expected[len(results[i])])


def test_generate_batch_text_stop_strings_and_usage(stories_path: Path) -> None:
    engine = Engine(stories_path, n_threads=2, parallel=4, kv_size=4096)
    prompts = ["Once upon a time", "The cat sat", "Once upon a time"]
    plain = engine.generate_batch(prompts, SamplingParams(temperature=0.0, max_tokens=40))
    assert plain[0].text == plain[2].text and plain[0].text
    assert all(r.finish_reason in ("length", "stop") for r in plain)
    assert plain[0].usage.prompt_tokens == len(engine.tokenizer.encode(prompts[0], True, False))
    # A stop string taken from the middle of the greedy text ends the text right before it.
    text = plain[1].text
    stop = text[len(text) // 2: len(text) // 2 + 4]
    stopping = SamplingParams(temperature=0.0, max_tokens=40, stop=[stop])
    [stopped] = engine.generate_batch([prompts[1]], stopping)
    assert stopped.finish_reason == "stop" and stopped.stop_string == stop
    assert stopped.text == text[: text.index(stop)]
    # the stop string cancelled the request: nothing keeps running or holds blocks
    deadline = time.monotonic() + 10
    while engine.stats().running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.stats().running == 0 and engine.stats().kv_usage == 0.0
    # streamed deltas add up to the text
    deltas = list(engine.stream(prompts[1], SamplingParams(temperature=0.0, max_tokens=40)))
    assert "".join(d.text for d in deltas) == text
    assert deltas[-1].result is not None and deltas[-1].result.tokens == plain[1].tokens


def test_async_engine_streams_concurrently(stories_path: Path) -> None:
    engine = Engine(stories_path, n_threads=2, parallel=8, kv_size=4096)
    prompts = [f"Once upon a time there was a {w}" for w in ("cat", "dog", "bird", "girl", "boy", "tree")]
    params = SamplingParams(temperature=0.0, max_tokens=24)
    expected = [r.text for r in engine.generate_batch(prompts, params)]

    async def one(p: str) -> str:
        parts = []
        async for delta in engine.submit(engine.tokenize(p), params):
            parts.append(delta.text)
        return "".join(parts)

    async def cancel_early() -> None:
        long = SamplingParams(temperature=0.0, max_tokens=200)
        async for _ in engine.submit(engine.tokenize(prompts[0]), long):
            break  # leaving the stream cancels the request

    async def main() -> list[str]:
        got = await asyncio.gather(*(one(p) for p in prompts), cancel_early())
        return list(got[:-1])

    assert asyncio.run(main()) == expected
    deadline = time.monotonic() + 10
    while engine.stats().running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.stats().running == 0 and engine.stats().kv_usage == 0.0


def test_smollm2_batching_is_invisible(smollm2_path: Path) -> None:
    """On a quantized model the CPU kernels round a row differently depending on the call's
    shape; the runner keeps every row independent of the batch, so the engine's output is the
    same alone, among 15 others, from the prefix cache and after preemption."""
    # 24 blocks of 16 tokens for 16 requests of 13 to 102 tokens: requests are preempted.
    assert_batching_is_invisible(smollm2_path, [5, 60, 12, 33, 1, 90, 20, 7, 45, 16, 3, 70, 28, 9, 50, 38],
                                 n_gen=12, seed=11, tight_kv_size=384)


def assert_batching_is_invisible(path: Path, lengths: list[int], *, n_gen: int, seed: int, tight_kv_size: int,
                                 kv_type: str = "f16") -> None:
    """Each prompt's greedy tokens alone equal those among the others, from the prefix cache
    and in a KV pool of tight_kv_size tokens, where requests are preempted."""
    alone = _core.Engine(str(path), n_threads=2, parallel=1, kv_size=2048, prefix_caching=False,
                         kv_type=kv_type)
    assert alone.kv_type == kv_type
    prompts = prompts_of(alone.n_vocab, lengths, seed=seed)
    reference = [tokens_of(run_all(alone, [p], n_gen)[0]) for p in prompts]
    del alone
    engine = _core.Engine(str(path), n_threads=2, parallel=len(prompts), kv_size=4096, max_batch_tokens=64,
                          kv_type=kv_type)
    batched = [tokens_of(ev) for ev in run_all(engine, prompts, n_gen)]
    for i in range(len(prompts)):
        assert batched[i] == reference[i], f"prompt {i} among {len(prompts) - 1} others"
    # The same prompts again: every prompt token but the last comes from the cache (whole
    # blocks shared, the rows of a partly filled last block copied).
    again = run_all(engine, prompts, n_gen)
    for i, ev in enumerate(again):
        assert ev[-1].n_cached_tokens == lengths[i] - 1
        assert tokens_of(ev) == reference[i], f"prompt {i} from the prefix cache"
    del engine
    tight = _core.Engine(str(path), n_threads=2, parallel=len(prompts), kv_size=tight_kv_size,
                         max_batch_tokens=64, prefix_caching=False, kv_type=kv_type)
    preempted = [tokens_of(ev) for ev in run_all(tight, prompts, n_gen)]
    assert settled_stats(tight)["preemptions"] > 0
    for i in range(len(prompts)):
        assert preempted[i] == reference[i], f"prompt {i} with preemption"


def test_known_greedy_texts_among_other_requests(stories_path: Path, smollm2_path: Path) -> None:
    """The texts tests/test_llm.py knows from the single-sequence loop, produced by the engine
    while other requests run beside them."""
    from ember.llm import LLM

    story = (", there was a little girl named Lily. She loved to play outside in the park. "
             "One day, she saw a big, red ball.")
    stories = Engine(stories_path, n_threads=2, parallel=8, kv_size=4096)
    others = ["The dog", "Lily and Ben", "A big red", "Tom was sad"]
    results = stories.generate_batch(["Once upon a time", *others],
                             SamplingParams(temperature=0.0, max_tokens=40))
    assert results[0].text == story
    chat = LLM(smollm2_path, n_threads=2, n_ctx=512)
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    prompt = chat.tokenize_chat(messages)
    del chat
    smollm2 = Engine(smollm2_path, n_threads=2, parallel=8, kv_size=4096)
    results = smollm2.generate_batch([prompt, "The weather today is", "def add(a, b):"],
                             SamplingParams(temperature=0.0, max_tokens=32))
    assert results[0].text == "The capital of France is Paris."
    assert results[0].finish_reason == "stop" and len(results[0].tokens) == 7


def test_kv_budget_in_tokens_or_bytes_and_block_size(stories_path: Path, stories_model: _core.Model) -> None:
    by_tokens = _core.Engine(str(stories_path), n_threads=1, kv_size=1000, block_size=16)
    assert (by_tokens.block_size, by_tokens.n_blocks, by_tokens.kv_size) == (16, 62, 992)
    per_token = by_tokens.kv_bytes_per_token
    by_bytes = _core.Engine(str(stories_path), n_threads=1, kv_bytes=per_token * 800 + 5, block_size=32)
    assert (by_bytes.block_size, by_bytes.n_blocks, by_bytes.kv_size) == (32, 25, 800)
    assert by_tokens.kv_type == "f16"
    # Another block size gives the same output (a different paging of the same cache).
    prompts = prompts_of(stories_model.n_vocab, [45, 7, 70], seed=12)
    small_blocks = _core.Engine(str(stories_path), n_threads=2, parallel=3, kv_size=2048, block_size=4)
    got = [tokens_of(ev) for ev in run_all(small_blocks, prompts, 16)]
    assert got == [reference_greedy(stories_model, p, 16) for p in prompts]


# ---- the q8_0 KV cache -------------------------------------------------------------------------

def test_q8_0_kv_batching_is_invisible(smollm2_path: Path) -> None:
    """With K/V stored as q8_0 blocks, a request's greedy tokens are still the same alone, among
    other requests, from the prefix cache and after preemption."""
    # 12 blocks of 16 tokens for 8 requests of 11 to 100 tokens: requests are preempted.
    assert_batching_is_invisible(smollm2_path, [5, 60, 12, 33, 1, 90, 20, 45], n_gen=10, seed=21,
                                 tight_kv_size=192, kv_type="q8_0")


def test_q8_0_kv_stays_close_to_f16(smollm2_path: Path) -> None:
    """q8_0 K/V change the logits a little, not the answers that are clear-cut. Measured on
    SmolLM2-135M Q4_1: the first token's top-5 log-probabilities move by 0.09..0.27 nats between
    the f16 and the q8_0 cache (llama.cpp's f16 -> q8_0 KV moves them by 0.06..0.26 on the same
    file); greedy texts agree while the top choice is clear, and part ways at near ties (e.g.
    "What is 2 + 2?" differs at its first token, whose top two are 0.06 nats apart)."""
    from ember.llm import LLM

    chat = LLM(smollm2_path, n_threads=2, n_ctx=512)
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    france = chat.tokenize_chat(messages)
    story = chat.tokenize("Once upon a time, in a land far away,")
    counting = chat.tokenize("1, 2, 3, 4,")
    del chat
    prompts = [france, story, counting]
    results, first_logprobs = {}, {}
    for kv_type in ("f16", "q8_0"):
        engine = Engine(smollm2_path, n_threads=2, parallel=3, kv_size=1024, kv_type=kv_type)
        assert engine.kv_type == kv_type
        results[kv_type] = engine.generate_batch(prompts, SamplingParams(temperature=0.0, max_tokens=24))
        first = run_all(engine._core, prompts, 1, logprobs=5)
        first_logprobs[kv_type] = [dict(ev[0].logprobs[1]) for ev in first]
        del engine
    f16, q8 = results["f16"], results["q8_0"]
    assert q8[0].text == f16[0].text == "The capital of France is Paris."
    assert q8[1].tokens[:20] == f16[1].tokens[:20]  # observed: the first 36 agree
    assert q8[2].text == f16[2].text  # " 5, 6, 7, ..."
    for a, b in zip(first_logprobs["f16"], first_logprobs["q8_0"]):
        common = a.keys() & b.keys()
        assert len(common) >= 3
        shift = max(abs(a[t] - b[t]) for t in common)
        assert shift < 0.4, (a, b)
    # ... and the cache really is q8_0: the logits are not those of the f16 cache.
    assert any(abs(a[t] - b[t]) > 1e-3 for a, b in zip(first_logprobs["f16"], first_logprobs["q8_0"])
               for t in a.keys() & b.keys())


def test_q8_0_kv_budget_holds_64_over_34_more_tokens(smollm2_path: Path) -> None:
    """SmolLM2-135M: 30 layers, 3 kv heads x 64 = 192 values per K (or V) row. f16: 2 x 30 x 192
    x 2 = 23040 bytes per token; q8_0: 2 x 30 x (192 / 32) x 34 = 12240 bytes per token."""
    budget = 23040 * 1000
    f16 = _core.Engine(str(smollm2_path), n_threads=1, kv_bytes=budget)
    q8 = _core.Engine(str(smollm2_path), n_threads=1, kv_bytes=budget, kv_type="q8_0")
    assert (f16.kv_type, f16.kv_bytes_per_token, f16.n_blocks, f16.kv_size) == ("f16", 23040, 62, 992)
    # 23040000 // 12240 = 1882 tokens -> 117 blocks of 16: 1.89x the blocks of f16.
    assert (q8.kv_type, q8.kv_bytes_per_token, q8.n_blocks, q8.kv_size) == ("q8_0", 12240, 117, 1872)


def test_q8_0_kv_needs_head_dim_a_multiple_of_32(stories_path: Path) -> None:
    """stories260K has head_dim 8: a q8_0 block of 32 would straddle four heads."""
    with pytest.raises(NotImplementedError,
                       match=r"head_dim .*multiple of 32.* head_dim is 8: use kv_type f16"):
        _core.Engine(str(stories_path), kv_type="q8_0")
    with pytest.raises(NotImplementedError, match="head_dim is 8"):
        Engine(stories_path, kv_type="q8_0")
