"""Server-side defaults (--n-predict, --temp, ...) and llama-server's request fields: each works
or is a 400 naming it (docs/server-fields.md), on stories260K behind a real server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_support import RunningServer, ok, post, serving

from ember.server.config import ServerConfig
from ember.server.fields import OFF_VALUES

EOS = 2  # stories260K's end-of-sequence token
NO_EOS = {str(EOS): -100}
CHAT = {"messages": [{"role": "user", "content": "Once upon a time"}]}


@pytest.fixture(scope="module")
def server(stories_path: Path) -> Iterator[RunningServer]:
    # Greedy and 6 tokens unless a request says otherwise.
    config = ServerConfig(model=str(stories_path), parallel=2, threads=1, ctx_size=256,
                          n_predict=6, sampling={"temperature": 0.0, "seed": 7})
    with serving(config) as running:
        yield running


def test_server_defaults_apply_when_a_request_omits_them(server: RunningServer) -> None:
    out = ok(server, "/v1/chat/completions", {**CHAT, "logit_bias": NO_EOS})
    assert out["usage"]["completion_tokens"] == 6  # --n-predict 6
    text = out["choices"][0]["message"]["content"]
    greedy = ok(server, "/v1/chat/completions",
                {**CHAT, "logit_bias": NO_EOS, "max_tokens": 6, "temperature": 0})
    assert greedy["choices"][0]["message"]["content"] == text  # --temp 0
    # The server's default covers /v1/completions too (instead of OpenAI's 16).
    completion = ok(server, "/v1/completions", {"prompt": "Once upon a time",
                                                "logit_bias": NO_EOS})
    assert completion["usage"]["completion_tokens"] == 6
    # A request's own values win.
    hot = ok(server, "/v1/completions", {"prompt": "Once upon a time", "logit_bias": NO_EOS,
                                         "max_tokens": 3, "temperature": 1.5, "seed": 1})
    assert hot["usage"]["completion_tokens"] == 3


def test_n_predict_and_n_cmpl(server: RunningServer) -> None:
    out = ok(server, "/v1/completions", {"prompt": "Once upon a time", "n_predict": 4,
                                         "logit_bias": NO_EOS, "n_cmpl": 2})
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert out["usage"]["completion_tokens"] == 8
    unlimited = ok(server, "/v1/completions", {"prompt": "Once upon a time", "n_predict": -1,
                                               "logit_bias": NO_EOS})
    usage = unlimited["usage"]  # not cut at the server's 6: on to the full context
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 256
    assert post(server, "/v1/completions", {"prompt": "a", "n_predict": -2}).status_code == 400


def test_ignore_eos(server: RunningServer) -> None:
    """With EOS made certain, a request ends at once; with ignore_eos it runs to its limit."""
    eos_certain = {str(EOS): 100}
    stops = ok(server, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 5,
                                           "logit_bias": eos_certain})
    assert stops["usage"]["completion_tokens"] == 0
    assert stops["choices"][0]["finish_reason"] == "stop"
    runs = ok(server, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 5,
                                          "logit_bias": eos_certain, "ignore_eos": True})
    assert runs["usage"]["completion_tokens"] == 5
    assert runs["choices"][0]["finish_reason"] == "length"


def test_cache_prompt_id_slot_and_llama_logit_bias(server: RunningServer) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 6, "logit_bias": NO_EOS}
    reference = ok(server, "/v1/completions", body)["choices"][0]["text"]
    for extra in ({"cache_prompt": False}, {"cache_prompt": True}, {"id_slot": 1},
                  {"id_slot": -1}, {"logit_bias": [[EOS, False]]}):
        assert ok(server, "/v1/completions", {**body, **extra})["choices"][0]["text"] == \
            reference, extra
    for bad in ({"id_slot": 2}, {"cache_prompt": "no"}, {"logit_bias": [[EOS]]}):
        [name] = bad
        response = post(server, "/v1/completions", {**body, **bad})
        assert response.status_code == 400, bad
        assert response.json()["error"]["param"] == name


def test_n_probs_gives_logprobs(server: RunningServer) -> None:
    out = ok(server, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 3,
                                         "n_probs": 2, "logit_bias": NO_EOS})
    logprobs = out["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == 3
    assert all(len(top) == 2 for top in logprobs["top_logprobs"])


def test_samplers(server: RunningServer) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 6, "logit_bias": NO_EOS}
    greedy = ok(server, "/v1/completions", body)["choices"][0]["text"]
    # Greedy whatever the stages; the order must be ember's.
    for samplers in (["top_k", "top_p", "min_p", "temperature"], "kpmt",
                     ["dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]):
        out = ok(server, "/v1/completions", {**body, "samplers": samplers, "temperature": 0})
        assert out["choices"][0]["text"] == greedy
    for bad in (["temperature", "top_k"], ["top_k", "top_k"], ["mirostat_v3"], 5):
        response = post(server, "/v1/completions", {**body, "samplers": bad})
        assert response.status_code == 400, bad
        assert response.json()["error"]["param"] == "samplers"


@pytest.mark.parametrize("name", sorted(OFF_VALUES))
def test_fields_ember_cannot_honour_are_refused_unless_off(server: RunningServer,
                                                           name: str) -> None:
    off = OFF_VALUES[name][0][0]
    on = {bool: True, int: 3, float: 0.5, list: [{"id": 0, "scale": 1.0}]}[type(off)]
    if name == "response_fields":
        on = ["content"]
    for path, body in (("/v1/completions", {"prompt": "a", "max_tokens": 1}),
                       ("/v1/chat/completions", {**CHAT, "max_tokens": 1})):
        response = post(server, path, {**body, name: on})
        assert response.status_code == 400, (name, response.text)
        error = response.json()["error"]
        assert error["param"] == name and error["code"] == "unsupported_parameter"
        assert post(server, path, {**body, name: off}).status_code == 200


@pytest.mark.parametrize(("field", "allowed"), [
    ({"grammar": 'root ::= "a" | "bc"'}, {"a", "bc"}),
    ({"json_schema": {"enum": ["yes", "no"]}}, {'"yes"', '"no"'}),
    ({"json_schema": {"type": "boolean"}}, {"true", "false"})])
def test_llama_server_grammar_fields_are_honoured(server: RunningServer, field: dict[str, Any],
                                                  allowed: set[str]) -> None:
    response = post(server, "/v1/completions", {"prompt": "a", "max_tokens": 16, **field})
    assert response.status_code == 200, response.text
    [choice] = response.json()["choices"]
    assert choice["text"] in allowed and choice["finish_reason"] == "stop", choice


# --- chat prompts: prefill, content parts ----------------------------------------------------

def chatml(messages: list[dict[str, str]]) -> str:
    """stories260K has no template: ember renders ChatML."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def test_a_trailing_assistant_message_is_continued(server: RunningServer) -> None:
    user = {"role": "user", "content": "Tell me a story."}
    start = "Once upon a time"
    prefilled = {"messages": [user, {"role": "assistant", "content": start}],
                 "max_tokens": 8, "logit_bias": NO_EOS}
    out = ok(server, "/v1/chat/completions", prefilled)
    raw = ok(server, "/v1/completions", {"prompt": chatml([user]) + "<|im_start|>assistant\n"
                                         + start, "max_tokens": 8, "logit_bias": NO_EOS})
    continuation = raw["choices"][0]["text"]
    # As llama-server: the reply is the whole assistant message, prefill included.
    assert out["choices"][0]["message"]["content"] == start + continuation
    assert out["usage"]["prompt_tokens"] == raw["usage"]["prompt_tokens"]
    assert out["usage"]["completion_tokens"] == 8
    with httpx.stream("POST", server.url + "/v1/chat/completions",
                      json={**prefilled, "stream": True}, timeout=60) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: {")]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert streamed == start + continuation
    # vLLM's spelling continues too, and answers the continuation only (as vLLM does);
    # closing the turn instead is asked for explicitly.
    same = ok(server, "/v1/chat/completions", {**prefilled, "continue_final_message": True})
    assert same["choices"][0]["message"]["content"] == continuation
    closed = ok(server, "/v1/chat/completions", {**prefilled, "continue_final_message": False})
    new_turn = ok(server, "/v1/completions", {
        "prompt": chatml(prefilled["messages"]) + "<|im_start|>assistant\n", "max_tokens": 8,
        "logit_bias": NO_EOS})
    assert closed["choices"][0]["message"]["content"] == new_turn["choices"][0]["text"]
    no_prompt = ok(server, "/v1/chat/completions", {**prefilled, "add_generation_prompt": False})
    assert no_prompt["usage"]["prompt_tokens"] == len(httpx.post(
        server.url + "/tokenize", json={"content": chatml(prefilled["messages"])}).json()["tokens"])
    for bad in ({"continue_final_message": True, "add_generation_prompt": True},
                {"continue_final_message": True, "messages": [user]}):
        response = post(server, "/v1/chat/completions", {**prefilled, **bad})
        assert response.status_code == 400, bad
        assert response.json()["error"]["param"] == "continue_final_message"


def test_text_parts_are_joined_with_newlines(server: RunningServer) -> None:
    parts = [{"type": "text", "text": "Once upon"}, {"type": "text", "text": "a time"}]

    def tokens(content: Any) -> list[int]:
        return httpx.post(server.url + "/tokenize", json={
            "messages": [{"role": "user", "content": content}]}).json()["tokens"]

    assert tokens(parts) == tokens("Once upon\na time")
    assert tokens(parts) != tokens("Once upona time")
