"""The fields and shapes llama-server's clients rely on (issue 46, item 3), each against a value:
system_fingerprint, logit_bias in every form, n_probs with post_sampling_probs, timings,
timings_per_token, return_progress, cache_prompt and the over-context error — on stories260K
behind a real server, the shapes as llama-server's tools/server answers them."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_support import RunningServer, ok, post, serving

from ember.build_info import build_info
from ember.server.config import ServerConfig

EOS = 2  # stories260K's end-of-sequence token
NO_EOS = [[EOS, False]]
PROMPT = "Once upon a time"
CHAT = {"messages": [{"role": "user", "content": PROMPT}]}


@pytest.fixture(scope="module")
def server(stories_path: Path) -> Iterator[RunningServer]:
    config = ServerConfig(model=str(stories_path), parallel=2, threads=1, ctx_size=256,
                          sampling={"temperature": 0.0, "seed": 7})
    with serving(config) as running:
        yield running


def events(server: RunningServer, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", server.url + path, json={**body, "stream": True},
                      timeout=60) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line[6:]) for line in response.iter_lines()
                if line.startswith("data: {")]


def tokens_of(server: RunningServer, text: str) -> list[int]:
    """As llama-server tokenizes a logit_bias text: no BOS, control-token texts as text."""
    return ok(server, "/tokenize", {"content": text, "add_special": False,
                                    "parse_special": False})["tokens"]


def first_piece(server: RunningServer, path: str, bias: Any) -> str:
    """The text of the first token greedy decoding picks under `bias` on `path`."""
    if path == "/completion":
        out = ok(server, path, {"prompt": PROMPT, "n_predict": 1, "n_probs": 1,
                                "logit_bias": bias})
        return out["completion_probabilities"][0]["token"]
    if path == "/v1/completions":
        out = ok(server, path, {"prompt": PROMPT, "max_tokens": 1, "logprobs": 0,
                                "logit_bias": bias})
        return out["choices"][0]["logprobs"]["tokens"][0]
    out = ok(server, path, {**CHAT, "max_tokens": 1, "logprobs": True, "logit_bias": bias})
    return out["choices"][0]["logprobs"]["content"][0]["token"]


def word_of(server: RunningServer, piece: str, alone: bool) -> tuple[int, str]:
    """The id of a token's piece, and a text whose tokens include it (`alone`: are only it).
    stories260K's SentencePiece vocabulary puts a space before a text, so " there" is
    spelled "there" and "," comes out as [" ", ","]."""
    text = piece[1:] if piece.startswith(" ") else piece
    tokens = ok(server, "/tokenize", {"content": text, "add_special": False,
                                      "parse_special": False, "with_pieces": True})["tokens"]
    pieces = [t["piece"] for t in tokens]
    assert pieces == [piece] if alone else piece in pieces, (piece, tokens)
    return tokens[pieces.index(piece)]["id"], text


# --- system_fingerprint -------------------------------------------------------------------------

def test_system_fingerprint_on_every_response_and_chunk(server: RunningServer) -> None:
    fingerprint = build_info()
    assert fingerprint.startswith("b0.") and len(fingerprint.split("-")[-1]) == 8
    chat = ok(server, "/v1/chat/completions", {**CHAT, "max_tokens": 2})
    completion = ok(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
    assert chat["system_fingerprint"] == completion["system_fingerprint"] == fingerprint
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": PROMPT})):
        chunks = events(server, path, {**body, "max_tokens": 3,
                                       "stream_options": {"include_usage": True}})
        assert len(chunks) >= 3
        assert {c["system_fingerprint"] for c in chunks} == {fingerprint}
    # One definition: /props tells the same build.
    assert httpx.get(server.url + "/props").json()["build_info"] == fingerprint


# --- logit_bias -----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/completion", "/v1/completions", "/v1/chat/completions"])
def test_logit_bias_every_form(server: RunningServer, path: str) -> None:
    greedy = first_piece(server, path, None)
    target_piece = " little" if greedy != " little" else " the"
    target, word = word_of(server, target_piece, alone=True)
    # Forced, in each form (the array form takes any finite bias, as llama-server does;
    # entries naming one token add up).
    for force in ({str(target): 100}, [[target, 100]], [[word, 100]], {word: 100},
                  [[target, 1e6]], [[target, 60], [word, 60]]):
        assert first_piece(server, path, force) == target_piece, force
    # Banned (false) in each form, over a force in another: never that token.
    for both in ([[target, 100], [target, False]], [[target, 100], [word, False]],
                 [[word, 100], [target, False]], {str(target): 100, word: False},
                 {word: 100, str(target): False}):
        assert first_piece(server, path, both) != target_piece, both
    # +100 and -100 on one token cancel: greedy decoding as without a bias.
    assert first_piece(server, path, {word: -100, str(target): 100}) == greedy


def test_logit_bias_text_biases_every_token_and_shows_in_settings(server: RunningServer) -> None:
    text = " the little dragon"
    pieces = tokens_of(server, text)
    assert len(set(pieces)) > 1
    out = ok(server, "/completion", {"prompt": PROMPT, "n_predict": 1, "return_tokens": True,
                                     "logit_bias": [[text, 100], [EOS, False]]})
    assert out["tokens"][0] in pieces
    # llama-server's generation_settings lists every (token, bias); -inf is null there.
    settings = out["generation_settings"]["logit_bias"]
    assert settings == sorted([{"bias": 100.0, "token": t} for t in set(pieces)]
                              + [{"bias": None, "token": EOS}], key=lambda e: e["token"])


@pytest.mark.parametrize("bias", [[[5]], [["a"]], [[1.5, 1]], [[True, 1]], {"x": True},
                                  {"5": "1"}, [[5, "1"]], [[600, 1]], {"600": 1}, {"5": 101},
                                  {"-1": 1}, {"5": 1e300}, "x", 5, [5]])
def test_logit_bias_malformed_is_a_400_naming_it(server: RunningServer, bias: Any) -> None:
    for path in ("/completion", "/v1/completions", "/v1/chat/completions"):
        body = CHAT if path == "/v1/chat/completions" else {"prompt": PROMPT}
        response = post(server, path, {**body, "max_tokens": 1, "logit_bias": bias})
        assert response.status_code == 400, (path, bias, response.text)
        assert response.json()["error"]["param"] == "logit_bias"


# --- n_probs, post_sampling_probs ---------------------------------------------------------------

def test_post_sampling_probs_are_the_sampler_chain_distribution(server: RunningServer) -> None:
    """With top_k 2 at temperature 1, the chain's distribution is the softmax of the two most
    likely logits: computed here from the raw logprobs of the same (seeded) run."""
    body = {"prompt": PROMPT, "n_predict": 6, "n_probs": 3, "temperature": 1.0, "top_k": 2,
            "top_p": 1.0, "min_p": 0.0, "seed": 11, "logit_bias": NO_EOS}
    raw = ok(server, "/completion", body)["completion_probabilities"]
    post_ = ok(server, "/completion", {**body, "post_sampling_probs": True})
    post_probs = post_["completion_probabilities"]
    assert post_["generation_settings"]["post_sampling_probs"] is True
    assert [e["id"] for e in raw] == [e["id"] for e in post_probs]  # the same draws
    assert len(post_probs) == 6
    for r, p in zip(raw, post_probs):
        assert set(r) == {"id", "token", "bytes", "logprob", "top_logprobs"}
        assert set(p) == {"id", "token", "bytes", "prob", "top_probs"}
        assert len(r["top_logprobs"]) == 3 and len(p["top_probs"]) == 2  # top_k kept two
        a, b = (math.exp(t["logprob"]) for t in r["top_logprobs"][:2])
        expected = [a / (a + b), b / (a + b)]
        assert [t["id"] for t in p["top_probs"]] == [t["id"] for t in r["top_logprobs"][:2]]
        assert [t["prob"] for t in p["top_probs"]] == pytest.approx(expected, abs=1e-5)
        chosen = next(t["prob"] for t in p["top_probs"] if t["id"] == p["id"])
        assert p["prob"] == pytest.approx(chosen, abs=1e-7)
    # Greedy: the chain keeps one token, with probability 1.
    greedy = ok(server, "/completion", {**body, "temperature": 0, "post_sampling_probs": True})
    for p in greedy["completion_probabilities"]:
        assert p["prob"] == 1.0 and [t["prob"] for t in p["top_probs"]] == [1.0]
    # Streamed pieces carry them too.
    chunks = events(server, "/completion", {**body, "post_sampling_probs": True})
    streamed = [e for c in chunks if not c["stop"] for e in c["completion_probabilities"]]
    assert [e["id"] for e in streamed] == [e["id"] for e in post_probs]
    assert [e["prob"] for e in streamed] == pytest.approx([e["prob"] for e in post_probs])


def test_post_sampling_probs_on_chat(server: RunningServer) -> None:
    out = ok(server, "/v1/chat/completions", {
        **CHAT, "max_tokens": 3, "logprobs": True, "top_logprobs": 2, "temperature": 1.0,
        "top_k": 1, "post_sampling_probs": True, "logit_bias": NO_EOS})
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == 3
    for entry in content:  # top_k 1: one token left, certain
        assert set(entry) == {"id", "token", "bytes", "prob", "top_probs"}
        assert entry["prob"] == 1.0 and [t["id"] for t in entry["top_probs"]] == [entry["id"]]
    bad = post(server, "/completion", {"prompt": PROMPT, "post_sampling_probs": "yes"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "post_sampling_probs"


# --- timings, timings_per_token, return_progress ------------------------------------------------

TIMING_KEYS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
               "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}


def test_timings_on_openai_responses(server: RunningServer) -> None:
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": PROMPT})):
        out = ok(server, path, {**body, "max_tokens": 4, "logit_bias": NO_EOS})
        timings, usage = out["timings"], out["usage"]
        assert set(timings) == TIMING_KEYS
        assert timings["predicted_n"] == usage["completion_tokens"] == 4
        assert timings["prompt_n"] + timings["cache_n"] == usage["prompt_tokens"]
        assert timings["cache_n"] == usage["prompt_tokens_details"]["cached_tokens"]
        # Without timings_per_token only the last chunk has them (llama-server's place).
        chunks = events(server, path, {**body, "max_tokens": 4, "logit_bias": NO_EOS})
        assert [i for i, c in enumerate(chunks) if "timings" in c] == [len(chunks) - 1]
        assert chunks[-1]["timings"]["predicted_n"] == 4
        with_usage = events(server, path, {**body, "max_tokens": 4, "logit_bias": NO_EOS,
                                           "stream_options": {"include_usage": True}})
        assert [i for i, c in enumerate(with_usage) if "timings" in c] == [len(with_usage) - 1]
        assert with_usage[-1]["choices"] == [] and with_usage[-1]["timings"]["predicted_n"] == 4


def test_timings_per_token(server: RunningServer) -> None:
    body = {"prompt": PROMPT, "n_predict": 5, "logit_bias": NO_EOS, "timings_per_token": True}
    chunks = events(server, "/completion", body)
    pieces = [c for c in chunks if not c["stop"]]
    assert len(pieces) >= 2
    for c in pieces:
        assert set(c["timings"]) == TIMING_KEYS
        assert c["timings"]["predicted_n"] == c["tokens_predicted"]
    assert [c["timings"]["predicted_n"] for c in pieces] == sorted(
        c["timings"]["predicted_n"] for c in pieces)
    assert chunks[-1]["stop"] and chunks[-1]["generation_settings"]["timings_per_token"] is True
    without = events(server, "/completion", {**body, "timings_per_token": False})
    assert not any("timings" in c for c in without if not c["stop"])
    chat = events(server, "/v1/chat/completions", {**CHAT, "max_tokens": 5,
                                                   "logit_bias": NO_EOS,
                                                   "timings_per_token": True})
    generated = [c for c in chat if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert generated and all(set(c["timings"]) == TIMING_KEYS for c in generated)
    assert chat[-1]["timings"]["predicted_n"] == 5


def test_return_progress(server: RunningServer) -> None:
    body = {"prompt": PROMPT, "n_predict": 3, "logit_bias": NO_EOS, "return_progress": True}
    chunks = events(server, "/completion", body)
    first = chunks[0]
    progress = first["prompt_progress"]
    assert first["content"] == "" and first["tokens"] == [] and first["stop"] is False
    assert set(progress) == {"total", "cache", "processed", "time_ms"}
    assert progress["total"] == progress["processed"] == first["tokens_evaluated"] \
        == chunks[-1]["tokens_evaluated"]
    assert progress["cache"] == chunks[-1]["tokens_cached"]
    assert isinstance(progress["time_ms"], int) and progress["time_ms"] >= 0
    assert not any("prompt_progress" in c for c in chunks[1:])
    assert not any("prompt_progress" in c
                   for c in events(server, "/completion", {**body, "return_progress": False}))
    # Chat: the opening (role) chunk carries it, as llama-server's does.
    chat = events(server, "/v1/chat/completions", {**CHAT, "max_tokens": 3,
                                                   "return_progress": True})
    assert chat[0]["choices"][0]["delta"]["role"] == "assistant"
    n_prompt = ok(server, "/v1/chat/completions", {**CHAT, "max_tokens": 1})["usage"][
        "prompt_tokens"]
    assert chat[0]["prompt_progress"]["total"] == n_prompt
    assert sum("prompt_progress" in c for c in chat) == 1
    assert sum(1 for c in chat if c["choices"] and "role" in c["choices"][0]["delta"]) == 1


# --- cache_prompt ---------------------------------------------------------------------------------

def test_cache_prompt_false_computes_the_whole_prompt(server: RunningServer) -> None:
    prompt = "Once upon a time there was a little girl named Lily. She loved to play " * 2
    body = {"prompt": prompt, "n_predict": 4, "logit_bias": NO_EOS}
    cold = ok(server, "/completion", body)
    warm = ok(server, "/completion", body)
    assert warm["tokens_cached"] > 0 and warm["timings"]["cache_n"] == warm["tokens_cached"]
    uncached = ok(server, "/completion", {**body, "cache_prompt": False})
    assert uncached["tokens_cached"] == 0
    assert uncached["timings"]["prompt_n"] == uncached["tokens_evaluated"]
    assert uncached["content"] == warm["content"] == cold["content"]
    openai = ok(server, "/v1/completions", {"prompt": prompt, "max_tokens": 4,
                                            "cache_prompt": False})
    assert openai["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    again = ok(server, "/v1/completions", {"prompt": prompt, "max_tokens": 4})
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


# --- a prompt over the context ------------------------------------------------------------------

def test_prompt_over_the_context_is_exceed_context_size_error(server: RunningServer) -> None:
    prompt = "Once upon a time " * 100
    n_tokens = ok(server, "/tokenize", {"content": prompt})["count"]
    assert n_tokens > 256
    for path, body in (("/completion", {"prompt": prompt}),
                       ("/v1/completions", {"prompt": prompt}),
                       ("/v1/chat/completions",
                        {"messages": [{"role": "user", "content": prompt}]})):
        response = post(server, path, body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "exceed_context_size_error"
        assert error["code"] == "context_length_exceeded"  # OpenAI's, kept beside it
        assert error["n_ctx"] == 256
        if path != "/v1/chat/completions":
            assert error["n_prompt_tokens"] == n_tokens
        else:  # the rendered chat, a little longer than the text
            assert error["n_prompt_tokens"] > n_tokens
        assert str(error["n_prompt_tokens"]) in error["message"]


# --- /lora-adapters, /v1/chat/completions/input_tokens ------------------------------------------

def test_lora_adapters_lists_none_and_refuses_any_id(server: RunningServer) -> None:
    assert httpx.get(server.url + "/lora-adapters").json() == []
    assert ok(server, "/lora-adapters", []) == {"success": True}
    response = post(server, "/lora-adapters", [{"id": 0, "scale": 0.5}])
    assert response.status_code == 400 and response.json()["error"]["param"] == "[0].id"
    assert post(server, "/lora-adapters", {"id": 0}).status_code == 400  # not an array


def test_chat_input_tokens_counts_the_rendered_prompt(server: RunningServer) -> None:
    n_prompt = ok(server, "/v1/chat/completions", {**CHAT, "max_tokens": 1})["usage"][
        "prompt_tokens"]
    for path in ("/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"):
        assert ok(server, path, CHAT) == {"object": "response.input_tokens",
                                          "input_tokens": n_prompt}
    response = post(server, "/v1/chat/completions/input_tokens", {"messages": "Hi"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"
