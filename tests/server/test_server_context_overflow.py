"""A conversation longer than the context under each --context-overflow policy (ember.context_fit),
on stories260K with a 256-token context: "error" refuses it (400 naming both sizes), "shift"
drops the oldest whole turns (the system prompt and the latest user turn stay), "truncate-middle"
keeps the prompt's first and last tokens; what was dropped comes back in the usage and the
X-Context-Dropped-* headers of every API, streamed too.

Which tokens the engine ran is checked through the prefix cache: the expected prompt is sent
first (it fits, so it runs as it is), then the long one, which reuses the KV of the first one's
full blocks (16 tokens; the first one's prompt and all but its last output token were computed),
and at most all but its own last token, when its tokens are the same (and none past the first
difference)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_support import RunningServer, ok, post, serving

from ember import _core
from ember.chat.template import ChatTemplate
from ember.server.config import ServerConfig

N_CTX = 256
MAX_TOKENS = 8
ROOM = N_CTX - MAX_TOKENS  # the prompt's room with max_tokens 8
BLOCK = 16                 # tokens of a KV block


def reused(n_prompt: int) -> int:
    """The cached_tokens of a prompt of n_prompt tokens run right after the same tokens with
    max_tokens MAX_TOKENS (see the module's docstring)."""
    return min(n_prompt - 1, (n_prompt + MAX_TOKENS - 1) // BLOCK * BLOCK)


def conversation(tag: str, n_pairs: int = 6) -> list[dict[str, str]]:
    """A system prompt, n_pairs user/assistant turns, a last user message: about 58 tokens a
    turn in stories260K's ChatML (its markup is no control token there)."""
    messages = [{"role": "system", "content": f"Be kind {tag}."}]
    for i in range(n_pairs):
        messages += [{"role": "user", "content": f"Cat {tag}{i}?"},
                     {"role": "assistant", "content": f"Cat {i} ran."}]
    return messages + [{"role": "user", "content": "Dog?"}]


@pytest.fixture(scope="module")
def encode(stories_path: Path) -> Any:
    """The tokens of messages as the server renders them (the model's template, ChatML)."""
    template = ChatTemplate.from_gguf(stories_path)
    tokenizer = _core.Tokenizer(str(stories_path))
    return lambda messages: template.encode(tokenizer, messages)


def start(stories_path: Path, policy: str) -> Any:
    return serving(ServerConfig(model=str(stories_path), parallel=1, threads=1, ctx_size=N_CTX,
                                context_overflow=policy, sampling={"temperature": 0.0}))


@pytest.fixture(scope="module")
def shift(stories_path: Path) -> Iterator[RunningServer]:
    with start(stories_path, "shift") as running:
        yield running


@pytest.fixture(scope="module")
def middle(stories_path: Path) -> Iterator[RunningServer]:
    with start(stories_path, "truncate-middle") as running:
        yield running


def chat(server: RunningServer, messages: list[dict[str, str]], **fields: Any) -> httpx.Response:
    return post(server, "/v1/chat/completions",
                {"messages": messages, "max_tokens": MAX_TOKENS, **fields})


def assert_dropped(response: httpx.Response, usage: dict[str, Any], tokens: int,
                   messages: int) -> None:
    assert usage["dropped_tokens"] == tokens and usage["dropped_messages"] == messages, usage
    assert response.headers["x-context-dropped-tokens"] == str(tokens)
    assert response.headers["x-context-dropped-messages"] == str(messages)


def test_error_refuses_a_chat_longer_than_the_context(stories_path: Path, encode: Any) -> None:
    messages = conversation("e")
    n_tokens = len(encode(messages))
    assert n_tokens > N_CTX
    with start(stories_path, "error") as server:
        response = chat(server, messages)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "context_length_exceeded"
        assert error["type"] == "exceed_context_size_error"
        assert (error["n_prompt_tokens"], error["n_ctx"]) == (n_tokens, N_CTX)
        assert "x-context-dropped-tokens" not in response.headers
        # One that fits runs as it is, nothing dropped, no ember fields.
        fits = chat(server, conversation("e", 1))
        assert fits.status_code == 200, fits.text
        assert "dropped_tokens" not in fits.json()["usage"]
        assert "x-context-dropped-tokens" not in fits.headers


def test_shift_drops_the_oldest_whole_turns(shift: RunningServer, encode: Any) -> None:
    messages = conversation("s")
    full = encode(messages)
    # The fewest oldest pairs whose dropping fits the room, found here by a plain scan.
    n_pairs = next(k for k in range(7) if len(encode(messages[:1] + messages[1 + 2 * k:])) <= ROOM)
    kept = messages[:1] + messages[1 + 2 * n_pairs:]
    expected = encode(kept)
    assert n_pairs == 3 and len(full) > N_CTX  # the test's premise: some turns go, some stay
    alone = chat(shift, kept)  # fits: run as it is
    assert alone.status_code == 200, alone.text
    assert "x-context-dropped-tokens" not in alone.headers
    response = chat(shift, messages)
    assert response.status_code == 200, response.text
    body = response.json()
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(expected)
    assert usage["prompt_tokens_details"]["cached_tokens"] == reused(len(expected))
    assert_dropped(response, usage, len(full) - len(expected), 2 * n_pairs)
    assert body["choices"][0]["message"] == alone.json()["choices"][0]["message"]  # greedy


def test_shift_keeps_room_for_the_answer(shift: RunningServer, encode: Any) -> None:
    """Without max_tokens a quarter of the context is kept for the answer; with it, max_tokens
    up to half the context."""
    messages = conversation("r", 3)  # ~247 tokens: fits the context, not with a quarter free
    full = encode(messages)
    assert N_CTX * 3 // 4 < len(full) <= N_CTX
    fit = next(k for k in range(4)
               if len(encode(messages[:1] + messages[1 + 2 * k:])) <= N_CTX * 3 // 4)
    response = post(shift, "/v1/chat/completions", {"messages": messages, "max_tokens": None})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    expected = encode(messages[:1] + messages[1 + 2 * fit:])
    assert usage["prompt_tokens"] == len(expected)
    assert_dropped(response, usage, len(full) - len(expected), 2 * fit)
    # max_tokens 200 keeps only half the context (128) for the answer.
    half = chat(shift, messages, max_tokens=200)
    fit = next(k for k in range(4)
               if len(encode(messages[:1] + messages[1 + 2 * k:])) <= N_CTX // 2)
    assert half.json()["usage"]["prompt_tokens"] == len(encode(messages[:1] + messages[1 + 2 * fit:]))


def test_shift_cuts_the_middle_of_a_single_message_too_long(shift: RunningServer,
                                                            encode: Any) -> None:
    """The last resort: the latest user turn alone is longer than the room, so its middle goes
    (the first half of the room and the rest from the end), as truncate-middle does."""
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": " ".join(f"word{i}" for i in range(120))}]
    full = encode(messages)
    assert len(full) > N_CTX
    expected = full[:ROOM // 2] + full[len(full) - (ROOM - ROOM // 2):]
    warm = ok(shift, "/v1/completions", {"prompt": expected, "max_tokens": MAX_TOKENS})
    assert warm["usage"]["prompt_tokens"] == ROOM and "dropped_tokens" not in warm["usage"]
    response = chat(shift, messages)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == ROOM
    assert usage["prompt_tokens_details"]["cached_tokens"] == reused(ROOM)
    assert_dropped(response, usage, len(full) - ROOM, 0)


def test_truncate_middle_on_completions_keeps_the_first_and_last_tokens(
        middle: RunningServer) -> None:
    prompt = [(7 * i) % 500 + 3 for i in range(400)]  # token ids: no BOS is added
    expected = prompt[:ROOM // 2] + prompt[-(ROOM - ROOM // 2):]
    ok(middle, "/v1/completions", {"prompt": expected, "max_tokens": MAX_TOKENS})
    response = post(middle, "/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == ROOM
    assert usage["prompt_tokens_details"]["cached_tokens"] == reused(ROOM)
    assert_dropped(response, usage, len(prompt) - ROOM, 0)
    # Several prompts (two choices each): each is fitted, and counted once.
    both = post(middle, "/v1/completions", {"prompt": [prompt, prompt[:10]], "n": 2,
                                            "max_tokens": MAX_TOKENS})
    assert both.status_code == 200, both.text
    usage = both.json()["usage"]
    assert usage["prompt_tokens"] == ROOM + 10
    assert_dropped(both, usage, len(prompt) - ROOM, 0)


def test_truncate_middle_honours_n_keep_on_completion(middle: RunningServer) -> None:
    """llama-server's n_keep: the first n_keep tokens, not counting the BOS (kept as well)."""
    text = " ".join(f"w{i}" for i in range(200))
    tokens = ok(middle, "/tokenize", {"content": text, "add_special": True})["tokens"]
    assert tokens[0] == 1 and len(tokens) > N_CTX  # BOS
    n_keep = 10
    expected = tokens[:1 + n_keep] + tokens[len(tokens) - (ROOM - 1 - n_keep):]
    ok(middle, "/completion", {"prompt": expected, "n_predict": MAX_TOKENS})
    response = post(middle, "/completion", {"prompt": text, "n_predict": MAX_TOKENS,
                                            "n_keep": n_keep})
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["tokens_evaluated"] == ROOM and out["tokens_cached"] == reused(ROOM)
    assert out["truncated"] is True
    assert (out["dropped_tokens"], out["dropped_messages"]) == (len(tokens) - ROOM, 0)
    assert response.headers["x-context-dropped-tokens"] == str(len(tokens) - ROOM)
    # The same prompt streamed: the header first, the counts in the summary.
    with httpx.stream("POST", middle.url + "/completion", timeout=60,
                      json={"prompt": text, "n_predict": MAX_TOKENS, "n_keep": n_keep,
                            "stream": True}) as streamed:
        assert streamed.headers["x-context-dropped-tokens"] == str(len(tokens) - ROOM)
        events = [json.loads(line[6:]) for line in streamed.iter_lines()
                  if line.startswith("data: ")]
    assert events[-1]["stop"] is True and events[-1]["dropped_tokens"] == len(tokens) - ROOM


def test_truncate_middle_on_chat_cuts_tokens_not_turns(middle: RunningServer,
                                                       encode: Any) -> None:
    messages = conversation("m")
    full = encode(messages)
    response = chat(middle, messages)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == ROOM
    assert_dropped(response, usage, len(full) - ROOM, 0)


def test_shift_is_reported_by_every_api_and_in_streams(shift: RunningServer,
                                                       encode: Any) -> None:
    messages = conversation("a")
    full = encode(messages)
    n_pairs = next(k for k in range(7) if len(encode(messages[:1] + messages[1 + 2 * k:])) <= ROOM)
    n_tokens = len(full) - len(encode(messages[:1] + messages[1 + 2 * n_pairs:]))
    dropped = {"dropped_tokens": n_tokens, "dropped_messages": 2 * n_pairs}
    headers = {"x-context-dropped-tokens": str(n_tokens),
               "x-context-dropped-messages": str(2 * n_pairs)}

    def streamed(path: str, body: dict[str, Any]) -> list[Any]:
        with httpx.stream("POST", shift.url + path, json={**body, "stream": True},
                          timeout=60) as response:
            assert response.status_code == 200, response.read()
            assert {k: response.headers[k] for k in headers} == headers
            return [json.loads(line[6:]) for line in response.iter_lines()
                    if line.startswith("data: {")]

    chunks = streamed("/v1/chat/completions", {"messages": messages, "max_tokens": MAX_TOKENS,
                                               "stream_options": {"include_usage": True}})
    assert {k: chunks[-1]["usage"][k] for k in dropped} == dropped

    anthropic = {"model": "x", "max_tokens": MAX_TOKENS, "system": messages[0]["content"],
                 "messages": messages[1:]}
    response = post(shift, "/v1/messages", anthropic)
    assert response.status_code == 200, response.text
    assert {k: response.json()["usage"][k] for k in dropped} == dropped
    assert {k: response.headers[k] for k in headers} == headers
    events = streamed("/v1/messages", anthropic)
    ending = next(e for e in events if e["type"] == "message_delta")
    assert {k: ending["usage"][k] for k in dropped} == dropped

    responses = {"input": messages[1:], "instructions": messages[0]["content"],
                 "max_output_tokens": MAX_TOKENS}
    response = post(shift, "/v1/responses", responses)
    assert response.status_code == 200, response.text
    out = response.json()
    assert {k: out["usage"][k] for k in dropped} == dropped and out["truncation"] == "auto"
    events = streamed("/v1/responses", responses)
    done = events[-1]
    assert done["type"] == "response.incomplete"  # the answer reached max_output_tokens
    assert {k: done["response"]["usage"][k] for k in dropped} == dropped
    # Responses' own truncation "disabled" refuses the conversation on this server.
    refused = post(shift, "/v1/responses", {**responses, "truncation": "disabled"})
    assert refused.status_code == 400 and "context" in refused.text
    bad = post(shift, "/v1/responses", {**responses, "truncation": "sometimes"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "truncation"
