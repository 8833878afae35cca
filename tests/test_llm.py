"""ember.LLM on the real models: exact greedy texts, stop strings, seeds, logprobs against the
model's own logits, prefix-cache reuse across calls, OpenAI-shaped results, concurrent streams
and interruption."""

from __future__ import annotations

import _thread
import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ember import _core
from ember.llm import LLM
from ember.sampling import SamplingParams

PROMPT = "Once upon a time"
STORY = (", there was a little girl named Lily. She loved to play outside in the park. "
         "One day, she saw a big, red ball.")
STORY_TOKENS = 40  # STORY is exactly the first 40 greedy tokens
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
PARIS = "The capital of France is Paris."
HELPFUL = {"role": "system", "content": "You are a helpful assistant."}
DEFAULT_SYSTEM_ANSWER = "L'Étoile, la Marseillaise,"

GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def stories(stories_path: Path) -> LLM:
    return LLM(stories_path, n_threads=1)


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> LLM:
    return LLM(smollm2_path, n_threads=1, n_ctx=512)


# --- generate ----------------------------------------------------------------------------------

def test_greedy_story(stories: LLM) -> None:
    r = stories.generate(PROMPT, max_tokens=STORY_TOKENS, **GREEDY)
    assert r.text == STORY
    assert r.finish_reason == "length"
    assert len(r.tokens) == STORY_TOKENS
    assert stories.detokenize(r.tokens) == STORY
    prompt_tokens = len(stories.tokenize(PROMPT))
    assert prompt_tokens == 5  # BOS + 4 pieces
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (5, 40, 45)
    assert r.timings.prompt_ms > 0 and r.timings.generation_ms > 0 and r.timings.tokens_per_s > 0


def test_token_ids_as_prompt(stories: LLM) -> None:
    ids = stories.tokenize(PROMPT)
    assert stories.generate(ids, max_tokens=STORY_TOKENS, **GREEDY).text == STORY


def test_stream_pieces_add_up_to_the_text(stories: LLM) -> None:
    pieces = list(stories.stream(PROMPT, max_tokens=STORY_TOKENS, **GREEDY))
    assert len(pieces) > 20 and "".join(pieces) == STORY


def test_stop_string_is_never_emitted_even_across_tokens(stories: LLM) -> None:
    # "girl" is three tokens (" g", "ir", "l"): the stream holds " g" back until it can tell.
    pieces = list(stories.stream(PROMPT, max_tokens=STORY_TOKENS, stop=["girl"], **GREEDY))
    assert "".join(pieces) == ", there was a little "
    assert not any("g" in p for p in pieces)
    r = stories.generate(PROMPT, max_tokens=STORY_TOKENS, stop=["xyz", "park."], **GREEDY)
    assert r.text == ", there was a little girl named Lily. She loved to play outside in the "
    assert (r.finish_reason, r.stop_string) == ("stop", "park.")


def test_max_tokens_zero_and_one(stories: LLM) -> None:
    r = stories.generate(PROMPT, max_tokens=0, **GREEDY)
    assert (r.text, r.tokens, r.finish_reason) == ("", [], "length")
    assert stories.generate(PROMPT, max_tokens=1, **GREEDY).text == ","


def test_end_of_generation_token_stops_with_finish_reason_stop(stories: LLM) -> None:
    # Biasing EOS up makes it the greedy choice right away.
    eos = stories.tokenizer.eos
    r = stories.generate(PROMPT, max_tokens=10, logit_bias={eos: 100.0}, **GREEDY)
    assert (r.text, r.tokens, r.finish_reason) == ("", [], "stop")


def test_context_full_ends_with_length(stories_path: Path) -> None:
    small = LLM(stories_path, n_threads=1, n_ctx=16)
    r = small.generate(PROMPT, **GREEDY)
    assert r.finish_reason == "length" and r.usage.total_tokens == 16
    assert STORY.startswith(r.text)
    with pytest.raises(ValueError, match="more than the context of 16 tokens"):
        small.generate(PROMPT * 10)
    # Streams check the request when they are made, before the first chunk is asked for.
    with pytest.raises(ValueError, match="more than the context of 16 tokens"):
        small.create_chat_completion([{"role": "user", "content": PROMPT * 10}], stream=True)
    with pytest.raises(ValueError, match="top_p"):
        small.create_completion(PROMPT, stream=True, top_p=7)


def test_context_overflow_fits_prompts_and_chats(stories_path: Path) -> None:
    """context_overflow (ember.context_fit): a raw prompt's middle cut, a chat's oldest turns
    dropped, each reported in the usage; with max_tokens 8 of a 128-token context, 120 are the
    prompt's."""
    llm = LLM(stories_path, n_threads=1, n_ctx=128, context_overflow="truncate-middle")
    prompt = [(7 * i) % 500 + 3 for i in range(300)]
    r = llm.generate(prompt, max_tokens=8, **GREEDY)
    assert (r.usage.prompt_tokens, r.usage.dropped_tokens, r.usage.dropped_messages) == (120, 180, 0)
    assert r.text == llm.generate(prompt[:60] + prompt[-60:], max_tokens=8, **GREEDY).text
    [batched] = llm.generate_batch([prompt], max_tokens=8, **GREEDY)
    assert batched.text == r.text and batched.usage.dropped_tokens == 180
    llm.context_overflow = "shift"
    chat = [{"role": "system", "content": "Be kind."}]
    for i in range(4):
        chat += [{"role": "user", "content": f"Cat {i}?"}, {"role": "assistant", "content": "Ran."}]
    chat.append({"role": "user", "content": "Dog?"})
    kept = chat[:1] + chat[-1:]  # ~73 tokens; one more pair (~55) would not fit 120
    r = llm.chat(chat, max_tokens=8, **GREEDY)
    want = llm.tokenize_chat(kept)
    assert r.usage.prompt_tokens == len(want)
    assert r.usage.dropped_tokens == len(llm.tokenize_chat(chat)) - len(want)
    assert r.usage.dropped_messages == 8
    assert r.text == llm.chat(kept, max_tokens=8, **GREEDY).text
    out = llm.create_chat_completion(chat, max_tokens=8, temperature=0.0)
    assert out["usage"]["dropped_messages"] == 8
    llm.close()


# --- sampling ------------------------------------------------------------------------------------

def test_same_seed_same_text(stories: LLM) -> None:
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=30)
    a = stories.generate(PROMPT, params, seed=1234)
    b = stories.generate(PROMPT, params, seed=1234)
    c = stories.generate(PROMPT, params, seed=1235)
    assert a.tokens == b.tokens and a.text == b.text
    assert c.tokens != a.tokens


def test_repeat_penalty_changes_greedy_text(stories: LLM) -> None:
    r = stories.generate(PROMPT, max_tokens=STORY_TOKENS, repeat_penalty=1.5, **GREEDY)
    assert r.text != STORY


def test_logprobs_are_the_models_log_softmax(stories: LLM) -> None:
    r = stories.generate(PROMPT, max_tokens=8, logprobs=True, top_logprobs=3, **GREEDY)
    assert r.logprobs is not None and len(r.logprobs) == 8
    prompt = stories.tokenize(PROMPT)
    logits = _core.Model(str(stories.path)).eval(prompt + r.tokens).astype(np.float64)
    rows = logits[len(prompt) - 1:-1]  # the rows that predicted each generated token
    log_softmax = rows - (rows.max(1, keepdims=True)
                          + np.log(np.exp(rows - rows.max(1, keepdims=True)).sum(1, keepdims=True)))
    for k, entry in enumerate(r.logprobs):
        assert entry.token == r.tokens[k]
        assert entry.logprob == pytest.approx(log_softmax[k, entry.token], abs=1e-4)
        order = np.argsort(-log_softmax[k], kind="stable")[:3]
        assert [t.token for t in entry.top] == order.tolist()
        assert entry.top[0].token == entry.token  # greedy takes the most likely one
        assert [t.logprob for t in entry.top] == pytest.approx(log_softmax[k, order], abs=1e-4)
    assert "".join(e.text for e in r.logprobs) == r.text


def test_bad_sampling_arguments(stories: LLM) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
        stories.generate(PROMPT, temprature=0.5)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        stories.generate(PROMPT, top_p=0.0)
    with pytest.raises(ValueError, match="max_tokens must be >= 0"):
        stories.generate(PROMPT, max_tokens=-1)
    with pytest.raises(ValueError, match="logit_bias: token id 99999"):
        stories.generate(PROMPT, logit_bias={99999: 1.0})


# --- prefix-cache reuse ------------------------------------------------------------------------

def test_a_shared_400_token_prefix_is_served_from_the_cache(smollm2_path: Path) -> None:
    """Two generate calls sharing a 400-token system prompt: the second reuses every token the
    two prompts share and reaches its first token >= 5x sooner."""
    llm = LLM(smollm2_path, n_threads=1, n_ctx=1024, parallel=2)
    system = " ".join(f"Rule {i}: be kind and brief." for i in range(80))
    shared = llm.tokenize(system)[:400]
    assert len(shared) == 400
    one = shared + llm.tokenize(" Question one?", add_special=False)
    two = shared + llm.tokenize(" Question two?", add_special=False)
    cold = llm.generate(one, max_tokens=1, **GREEDY)
    warm = llm.generate(two, max_tokens=1, **GREEDY)
    assert cold.usage.cached_tokens == 0
    n_common = next(i for i, (a, b) in enumerate(zip(one, two, strict=False)) if a != b)
    assert n_common >= 400
    assert warm.usage.cached_tokens == n_common
    assert warm.timings.prompt_ms * 5 <= cold.timings.prompt_ms, (cold.timings, warm.timings)


def test_prompt_extending_the_last_one_reuses_its_full_blocks(stories: LLM) -> None:
    first = stories.generate(PROMPT, max_tokens=60, **GREEDY)
    follow_up = stories.tokenize(PROMPT) + first.tokens + stories.tokenize(" The", add_special=False)
    reused = stories.generate(follow_up, max_tokens=12, **GREEDY)
    # The first prompt and its output, except the last output token (sampled, never
    # evaluated): 5 + 60 - 1 = 64 tokens.
    assert reused.usage.cached_tokens == 64
    fresh = LLM(stories.path, n_threads=1).generate(follow_up, max_tokens=12, **GREEDY)
    assert fresh.usage.cached_tokens == 0
    assert reused.tokens == fresh.tokens


def test_tokenize_detokenize(stories: LLM) -> None:
    ids = stories.tokenize(PROMPT)
    assert ids[0] == stories.tokenizer.bos
    assert stories.tokenize(PROMPT, add_special=False) == ids[1:]
    assert stories.detokenize(ids) == PROMPT


# --- chat --------------------------------------------------------------------------------------

def test_chat_paris(smollm2: LLM) -> None:
    r = smollm2.chat([HELPFUL, *FRANCE], max_tokens=32, **GREEDY)
    assert r.text == PARIS
    assert r.finish_reason == "stop"
    assert len(r.tokens) == 7  # "The capital of France is Paris." then <|im_end|>, not counted


def test_chat_with_the_default_system_message(smollm2: LLM) -> None:
    # Pinned: 'The' wins by only 0.08 in transformers' f32 logits; with int8 activations 'L'
    # wins, and llama.cpp gives the same "L'Étoile, …" on this file.
    assert smollm2.chat(FRANCE, max_tokens=12, **GREEDY).text == DEFAULT_SYSTEM_ANSWER


def test_chat_stream_matches_chat(smollm2: LLM) -> None:
    r = smollm2.chat(FRANCE, max_tokens=24, **GREEDY)
    assert "".join(smollm2.stream_chat(FRANCE, max_tokens=24, **GREEDY)) == r.text
    assert r.usage.prompt_tokens == len(smollm2.tokenize_chat(FRANCE)) == 37


def test_chat_turns_reuse_the_cache(smollm2: LLM) -> None:
    first = smollm2.chat(FRANCE, max_tokens=32, **GREEDY)
    history = [*FRANCE, {"role": "assistant", "content": first.text},
               {"role": "user", "content": "And of Italy?"}]
    second = smollm2.chat(history, max_tokens=8, **GREEDY)
    if first.finish_reason == "stop":
        # Everything up to the first answer's end-of-turn token is reused.
        assert second.usage.cached_tokens == first.usage.prompt_tokens + len(first.tokens)
    else:
        assert second.usage.cached_tokens >= first.usage.prompt_tokens
    assert second.usage.prompt_tokens > second.usage.cached_tokens
    # What was reused is what the new prompt starts with: the first prompt and its answer.
    # (Not compared with a fresh run: batched and one-by-one evaluation of a quantized model
    # round differently, and greedy choices with small margins may then differ.)
    reused = smollm2.tokenize_chat(history)[:second.usage.cached_tokens]
    assert reused == (smollm2.tokenize_chat(FRANCE) + first.tokens)[:len(reused)]


def test_chat_prompt_uses_the_gguf_template(smollm2: LLM) -> None:
    text = smollm2.apply_chat_template(FRANCE)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    ids = smollm2.tokenize_chat(FRANCE)
    assert ids[0] == smollm2.tokenize("<|im_start|>", add_special=False, parse_special=True)[0]
    assert ids.count(ids[0]) == 3  # system, user, assistant headers; no extra BOS


# --- OpenAI shapes -------------------------------------------------------------------------------

def test_create_completion(stories: LLM) -> None:
    # The prompt in the prefix cache (whatever ran before): the call reuses 4 of its 5 tokens.
    stories.create_completion(PROMPT, max_tokens=1, temperature=0.0)
    out = stories.create_completion(PROMPT, max_tokens=STORY_TOKENS, temperature=0.0)
    assert out["id"].startswith("cmpl-") and out["object"] == "text_completion"
    assert isinstance(out["created"], int) and out["model"] == "stories260K.gguf"
    assert out["choices"] == [{"text": STORY, "index": 0, "logprobs": None, "finish_reason": "length"}]
    assert out["usage"] == {"prompt_tokens": 5, "completion_tokens": 40, "total_tokens": 45,
                            "prompt_tokens_details": {"cached_tokens": 4}}
    # As OpenAI's, max_tokens defaults to 16.
    assert stories.create_completion(PROMPT, temperature=0.0)["usage"]["completion_tokens"] == 16


def test_create_completion_logprobs_and_stream(stories: LLM) -> None:
    out = stories.create_completion(PROMPT, max_tokens=5, temperature=0.0, logprobs=2)
    lp = out["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == out["choices"][0]["text"]
    assert lp["text_offset"] == [0, 1, 7, 11, 13]  # ",", " there", " was", " a", " little"
    assert all(len(top) == 2 and max(top.values()) == v
               for top, v in zip(lp["top_logprobs"], lp["token_logprobs"]))

    chunks = list(stories.create_completion(PROMPT, max_tokens=STORY_TOKENS, temperature=0.0,
                                            stream=True))
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("cmpl-")
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == STORY
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_create_chat_completion(smollm2: LLM) -> None:
    want = smollm2.chat(FRANCE, max_tokens=24, **GREEDY)
    out = smollm2.create_chat_completion(FRANCE, temperature=0.0, max_tokens=24, logprobs=True,
                                         top_logprobs=2)
    assert out["id"].startswith("chatcmpl-") and out["object"] == "chat.completion"
    assert isinstance(out["created"], int) and out["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    choice = out["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": want.text}
    assert choice["finish_reason"] == want.finish_reason
    content = choice["logprobs"]["content"]
    assert "".join(c["token"] for c in content) == want.text
    assert all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 for c in content)
    assert bytes(content[0]["bytes"]) == content[0]["token"].encode()
    usage = out["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_create_chat_completion_stream(smollm2: LLM) -> None:
    want = smollm2.chat(FRANCE, max_tokens=24, **GREEDY)
    chunks = list(smollm2.create_chat_completion(
        FRANCE, temperature=0.0, max_tokens=24, stream=True,
        stream_options={"include_usage": True}))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = chunks[1:-2]
    assert all(set(c["choices"][0]["delta"]) == {"content"} for c in content)
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == want.text
    assert chunks[-2]["choices"][0]["delta"] == {}
    assert chunks[-2]["choices"][0]["finish_reason"] == want.finish_reason
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == want.usage.completion_tokens


def test_openai_names_and_nulls(stories: LLM) -> None:
    out = stories.create_completion(PROMPT, max_tokens=STORY_TOKENS, temperature=0.0,
                                    top_p=None, repetition_penalty=1.0, stop="park.")
    assert out["choices"][0]["text"].endswith("in the ")
    with pytest.raises(TypeError, match="unknown sampling parameter 'best_of'"):
        stories.create_completion(PROMPT, best_of=2)


# --- interruption ------------------------------------------------------------------------------

def test_keyboard_interrupt_leaves_the_llm_usable(stories: LLM) -> None:
    timer = threading.Timer(0.05, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        while True:  # each generation is short; the interrupt lands in one of them
            stories.generate(PROMPT, max_tokens=None, **GREEDY)
    timer.cancel()
    r = stories.generate(PROMPT, max_tokens=STORY_TOKENS, **GREEDY)
    assert r.text == STORY


def test_interleaved_and_abandoned_streams(stories: LLM) -> None:
    a = stories.stream(PROMPT, max_tokens=STORY_TOKENS, **GREEDY)
    b = stories.stream(PROMPT, max_tokens=STORY_TOKENS, **GREEDY)
    assert next(a) == "," and next(b) == ","
    # Both run on the engine at once; neither disturbs the other.
    assert stories.generate(PROMPT, max_tokens=STORY_TOKENS, **GREEDY).text == STORY
    assert "," + "".join(a) == STORY and "," + "".join(b) == STORY
    for i, _ in enumerate(stories.stream(PROMPT, max_tokens=200, **GREEDY)):
        if i == 3:
            break  # leaving the stream cancels its request
    deadline = time.monotonic() + 10
    while stories.engine.stats().running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stories.engine.stats().running == 0
    assert stories.generate(PROMPT, max_tokens=STORY_TOKENS, **GREEDY).text == STORY


def test_sampling_params_dataclass() -> None:
    p = SamplingParams(stop="x", logit_bias={"5": -100})
    assert p.stop == ["x"] and p.logit_bias == {5: -100.0}
    assert SamplingParams().temperature == 0.8 and not math.isnan(SamplingParams().top_p)
    with pytest.raises(ValueError, match="top_logprobs must be in"):
        SamplingParams(top_logprobs=21)


def test_generate_batch_equals_one_at_a_time(stories: LLM) -> None:
    prompts = ["Once upon a time", "The little dog", "One day, Lily", "Tom and Sue went"]
    batch = stories.generate_batch(prompts, max_tokens=24, temperature=0)
    assert [r.text for r in batch] == [stories.generate(p, max_tokens=24, temperature=0).text
                                       for p in prompts]
    assert batch[0].text.startswith(", there was a little girl named Lily")
    assert all(r.usage.completion_tokens == 24 or r.finish_reason == "stop" for r in batch)
