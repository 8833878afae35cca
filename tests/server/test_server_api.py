"""`ember serve` against the official openai client (sync and async, streamed and not), on
stories260K behind a real uvicorn server on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from server_support import RunningServer, sample, serving

from ember.server.config import ServerConfig

# Greedy stories260K from "Once upon a time" (see shared/README.md).
STORY = ", there was a little girl named Lily. She loved to play outside in the park."
EOS = 2  # stories260K's end-of-sequence token
NO_EOS = {str(EOS): -100}


@pytest.fixture(scope="module")
def server(stories_path: Path) -> Iterator[RunningServer]:
    config = ServerConfig(model=str(stories_path), parallel=2, threads=1, ctx_size=512,
                          aliases=["stories", "tiny"])
    with serving(config) as running:
        yield running



def test_chat_completion(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="stories", messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=12, temperature=0)
    assert out.id.startswith("chatcmpl-")
    assert out.object == "chat.completion"
    assert out.model == "stories"
    [choice] = out.choices
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = out.usage
    assert usage is not None
    assert usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens is not None


def test_chat_stream_matches_non_streamed(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Once upon a time"}]
    whole = client.chat.completions.create(model="stories", messages=messages, max_tokens=20,
                                           temperature=0, logit_bias=NO_EOS)
    chunks = list(client.chat.completions.create(
        model="stories", messages=messages, max_tokens=20, temperature=0, logit_bias=NO_EOS,
        stream=True, stream_options={"include_usage": True}))
    assert all(c.id.startswith("chatcmpl-") and c.object == "chat.completion.chunk"
               for c in chunks)
    assert len({c.id for c in chunks}) == 1
    first, *middle, finish, usage = chunks
    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].delta.content == ""
    assert all(c.choices[0].finish_reason is None and c.choices[0].delta.content
               for c in middle)
    assert finish.choices[0].finish_reason == "length"
    assert finish.choices[0].delta.content is None and finish.choices[0].delta.role is None
    assert usage.choices == []
    assert usage.usage is not None and usage.usage.completion_tokens == 20
    text = "".join(c.choices[0].delta.content for c in middle)
    assert text == whole.choices[0].message.content
    assert usage.usage.prompt_tokens == whole.usage.prompt_tokens


def test_completion_greedy_text(client: openai.OpenAI) -> None:
    out = client.completions.create(model="stories260K.gguf", prompt="Once upon a time",
                                    max_tokens=18, temperature=0)
    assert out.id.startswith("cmpl-")
    assert out.object == "text_completion"
    assert STORY.startswith(out.choices[0].text)
    assert len(out.choices[0].text) > 40
    assert out.usage.prompt_tokens == 5
    assert out.usage.completion_tokens == 18


def test_completion_default_max_tokens_is_16(client: openai.OpenAI) -> None:
    out = client.completions.create(model="stories", prompt="Once upon a time",
                                    logit_bias=NO_EOS)
    assert out.usage.completion_tokens == 16
    assert out.choices[0].finish_reason == "length"


def test_async_completions(server: RunningServer) -> None:
    async def main() -> tuple[str, str, int]:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        whole = await client.completions.create(model="stories", prompt="Once upon a time",
                                                max_tokens=15, temperature=0)
        stream = await client.completions.create(
            model="stories", prompt="Once upon a time", max_tokens=15, temperature=0,
            stream=True, stream_options={"include_usage": True})
        pieces, n_tokens = [], 0
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].text)
            if chunk.usage is not None:
                n_tokens = chunk.usage.completion_tokens
        await client.close()
        return whole.choices[0].text, "".join(pieces), n_tokens

    whole, streamed, n_tokens = asyncio.run(main())
    assert whole == streamed
    assert STORY.startswith(whole)
    assert n_tokens == 15


def test_async_chat_stream(server: RunningServer) -> None:
    async def main() -> tuple[list[str | None], str]:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        stream = await client.chat.completions.create(
            model="stories", messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
            temperature=0, stream=True)
        reasons, text = [], []
        async for chunk in stream:
            reasons.append(chunk.choices[0].finish_reason)
            text.append(chunk.choices[0].delta.content or "")
        await client.close()
        return reasons, "".join(text)

    reasons, text = asyncio.run(main())
    assert reasons[-1] in ("stop", "length")
    assert all(r is None for r in reasons[:-1])
    assert text


def test_raw_event_stream_format(server: RunningServer) -> None:
    body = {"model": "stories", "prompt": "Once upon a time", "max_tokens": 4,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", server.base_url + "/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == ""
    assert events[-2] == "data: [DONE]"
    for event in events[:-2]:
        assert event.startswith("data: ")
        chunk = json.loads(event[len("data: "):])
        assert chunk["object"] == "text_completion"
        assert chunk["id"].startswith("cmpl-")


def test_n_choices_seeded(client: openai.OpenAI) -> None:
    def ask() -> openai.types.Completion:
        return client.completions.create(model="stories", prompt="Once upon a time", n=3,
                                         max_tokens=10, temperature=1.0, seed=1234,
                                         logit_bias=NO_EOS)

    first, second = ask(), ask()
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in second.choices]
    assert first.usage.completion_tokens == 30
    assert first.usage.prompt_tokens == 5  # the prompt counts once


def test_n_choices_streamed_chat(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model="stories", messages=[{"role": "user", "content": "Hi"}], n=2, max_tokens=6,
        temperature=0.9, seed=7, logit_bias=NO_EOS, stream=True,
        stream_options={"include_usage": True}))
    by_choice: dict[int, list[str]] = {0: [], 1: []}
    finished = set()
    for chunk in chunks[:-1]:
        [choice] = chunk.choices
        by_choice[choice.index].append(choice.delta.content or "")
        if choice.finish_reason:
            finished.add(choice.index)
    assert finished == {0, 1}
    assert all(by_choice[i] for i in (0, 1))
    assert chunks[-1].usage.completion_tokens == 12


def test_chat_logprobs(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="stories", messages=[{"role": "user", "content": "Once upon a time"}],
        max_tokens=6, temperature=0, logprobs=True, top_logprobs=3, logit_bias=NO_EOS)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 6
    assert "".join(e.token for e in content) == out.choices[0].message.content
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy picks the most likely
        assert entry.bytes == list(entry.token.encode())


def test_completion_logprobs(client: openai.OpenAI) -> None:
    out = client.completions.create(model="stories", prompt="Once upon a time", max_tokens=5,
                                    temperature=0, logprobs=2)
    logprobs = out.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 5
    assert len(logprobs.top_logprobs) == 5 and all(len(t) == 2 for t in logprobs.top_logprobs)
    assert "".join(logprobs.tokens) == out.choices[0].text
    assert logprobs.text_offset[0] == 0
    assert logprobs.text_offset[1] == len(logprobs.tokens[0])


def test_stop_strings(client: openai.OpenAI) -> None:
    out = client.completions.create(model="stories", prompt="Once upon a time", max_tokens=30,
                                    temperature=0, stop=["Lily", "never"])
    assert out.choices[0].text == ", there was a little girl named "
    assert out.choices[0].finish_reason == "stop"
    chat = client.chat.completions.create(
        model="stories", messages=[{"role": "user", "content": "Once upon a time"}],
        max_tokens=30, temperature=0, stop="e")
    assert "e" not in chat.choices[0].message.content


def test_logit_bias_forces_a_token(client: openai.OpenAI, server: RunningServer) -> None:
    out = client.completions.create(model="stories", prompt="Once upon a time", max_tokens=5,
                                    temperature=0, logit_bias={"100": 100})
    assert out.choices[0].text == "aaaaa"  # token 100 is "a"
    detok = httpx.post(server.url + "/detokenize", json={"tokens": [100] * 5}).json()
    assert detok["content"] == "aaaaa"


def test_penalties_change_greedy_text(client: openai.OpenAI) -> None:
    def text(**penalties: float) -> str:
        out = client.completions.create(model="stories", prompt="Once upon a time",
                                        max_tokens=40, temperature=0, **penalties)
        return out.choices[0].text

    plain = text()
    assert text(frequency_penalty=2.0) != plain
    assert text(presence_penalty=2.0) != plain
    assert text(extra_body={"repetition_penalty": 3.0}) != plain  # type: ignore[arg-type]


def test_max_completion_tokens(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="stories", messages=[{"role": "user", "content": "Hi"}],
        max_completion_tokens=7, max_tokens=3, temperature=0, logit_bias=NO_EOS)
    assert out.usage.completion_tokens == 7  # max_completion_tokens wins, as in OpenAI
    assert out.choices[0].finish_reason == "length"


def test_seed_reproducible(client: openai.OpenAI) -> None:
    def ask(seed: int) -> str:
        out = client.completions.create(model="stories", prompt="Once upon a time",
                                        max_tokens=20, temperature=1.2, seed=seed)
        return out.choices[0].text

    assert ask(42) == ask(42)
    assert len({ask(s) for s in (1, 2, 3, 4)}) > 1


def test_prefix_cache_reports_cached_tokens(client: openai.OpenAI,
                                            server: RunningServer) -> None:
    # A prompt of several KV blocks (16 tokens) whose opening (ids 511, 510) no other test
    # sends: cold, nothing of it is cached; repeated and extended, all of it is reused.
    text = "Once upon a time, a small dog ran to the park. It saw a big red ball and a cat. "
    tokens = [511, 510] + httpx.post(server.url + "/tokenize",
                                     json={"content": text * 2}).json()["tokens"]
    assert len(tokens) >= 40
    hits_before = sample(server.url, "ember_prefix_cache_hits_total")
    cold = client.completions.create(model="stories", prompt=tokens, max_tokens=1,
                                     temperature=0)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    warm = client.completions.create(model="stories", prompt=tokens + [100, 101],
                                     max_tokens=1, temperature=0)
    assert warm.usage.prompt_tokens == len(tokens) + 2
    cached = warm.usage.prompt_tokens_details.cached_tokens
    assert cached == len(tokens)  # all of the cold request's prompt
    assert sample(server.url, "ember_prefix_cache_hits_total") - hits_before == cached


def test_models(client: openai.OpenAI, server: RunningServer) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["stories", "tiny"]  # the id, then the other aliases
    assert models.data[0].owned_by == "ember"
    assert client.models.retrieve("tiny").id == "tiny"
    assert client.models.retrieve("stories260K.gguf").id == "stories"
    for name in ("stories", "tiny", "stories260K.gguf", "stories260K", "gpt-4o"):
        out = client.completions.create(model=name, prompt="Hi", max_tokens=1)
        assert out.model == "stories"


def test_tokenize_detokenize(server: RunningServer) -> None:
    out = httpx.post(server.url + "/tokenize", json={"content": "Once upon a time"}).json()
    assert out["count"] == len(out["tokens"]) == 5
    assert out["tokens"][0] == 1  # BOS
    assert out["max_model_len"] == 512
    plain = httpx.post(server.url + "/tokenize",
                       json={"prompt": "Once upon a time", "add_special": False}).json()
    assert plain["tokens"] == out["tokens"][1:]
    pieces = httpx.post(server.url + "/tokenize",
                        json={"content": "upon", "add_special": False,
                              "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] for p in pieces).strip() == "upon"
    text = httpx.post(server.url + "/detokenize", json={"tokens": out["tokens"]}).json()
    assert text["content"].strip() == "Once upon a time"
    chat = httpx.post(server.url + "/tokenize",
                      json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat["count"] > 3


def test_slots(server: RunningServer, client: openai.OpenAI) -> None:
    client.completions.create(model="stories", prompt="Once", max_tokens=3)
    slots = httpx.get(server.url + "/slots").json()
    assert [s["id"] for s in slots] == [0, 1]
    for slot in slots:
        assert slot["state"] == "idle" and slot["is_processing"] is False
        assert slot["n_ctx"] == 512
        assert {"request_id", "n_prompt_tokens", "n_decoded", "n_cached_tokens"} <= set(slot)
    assert any(s["request_id"] and s["request_id"].startswith("cmpl-") for s in slots)


def test_metrics(server: RunningServer, client: openai.OpenAI) -> None:
    before = sample(server.url, "ember_generation_tokens_total")
    prompt_before = sample(server.url, "ember_prompt_tokens_total")
    ttft_before = sample(server.url, "ember_time_to_first_token_seconds_count")
    out = client.completions.create(model="stories", prompt="Once upon a time", max_tokens=9,
                                    logit_bias=NO_EOS)
    assert out.usage.completion_tokens == 9
    assert sample(server.url, "ember_generation_tokens_total") - before == 9
    assert sample(server.url, "ember_prompt_tokens_total") - prompt_before == 5
    assert sample(server.url, "ember_time_to_first_token_seconds_count") - ttft_before == 1
    text = httpx.get(server.url + "/metrics").text
    for name in ("ember_requests_running", "ember_requests_waiting",
                 "ember_kv_cache_usage_ratio", "ember_prefix_cache_hits_total",
                 "ember_prompt_tokens_total", "ember_generation_tokens_total",
                 "ember_time_to_first_token_seconds_bucket",
                 "ember_time_per_output_token_seconds_bucket",
                 "ember_request_latency_seconds_bucket"):
        assert f"\n{name}" in text, name
    # Nothing runs now: the batching engine holds no KV blocks for a finished request (its
    # prefix-cache blocks are reusable, not in use).
    assert 0 <= sample(server.url, "ember_kv_cache_usage_ratio") <= 1
    assert sample(server.url, "ember_requests_running") == 0


def test_health(server: RunningServer) -> None:
    response = httpx.get(server.url + "/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
