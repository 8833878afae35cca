"""llama-server's native API (/completion and its /completions alias, /infill, /apply-template,
/props, /slots, /health, /embedding, /rerank) shaped as llama-server shapes it, on stories260K."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_support import RunningServer, serving

from ember.server.config import ServerConfig

EOS = 2
NO_EOS = [[EOS, False]]  # llama-server's form
TIMING_KEYS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
               "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}


@pytest.fixture(scope="module")
def server(stories_path: Path) -> Iterator[RunningServer]:
    config = ServerConfig(model=str(stories_path), parallel=2, threads=1, ctx_size=256,
                          sampling={"temperature": 0.0, "top_k": 20}, aliases=["stories"])
    with serving(config) as running:
        yield running


def post(server: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def ok(server: RunningServer, path: str, body: dict[str, Any]) -> Any:
    response = post(server, path, body)
    assert response.status_code == 200, response.text
    return response.json()


def test_completion_matches_openai_completions_and_has_llama_fields(
        server: RunningServer) -> None:
    body = {"prompt": "Once upon a time", "n_predict": 8, "logit_bias": NO_EOS}
    out = ok(server, "/completion", body)
    openai_text = ok(server, "/v1/completions", {**body})["choices"][0]["text"]
    assert out["content"] == openai_text
    assert out["stop"] is True and out["stop_type"] == "limit" and out["stopping_word"] == ""
    assert out["tokens_predicted"] == 8 and out["tokens_evaluated"] == 5  # BOS + 4 tokens
    assert out["model"] == "stories" and out["tokens"] == []
    assert set(out["timings"]) == TIMING_KEYS and out["timings"]["predicted_n"] == 8
    assert out["timings"]["cache_n"] == out["tokens_cached"]
    settings = out["generation_settings"]
    assert settings["n_predict"] == 8 and settings["temperature"] == 0.0
    assert settings["top_k"] == 20 and settings["n_ctx"] == 256
    assert settings["samplers"] == ["top_k", "top_p", "min_p", "temperature"]
    assert out["prompt"].endswith("Once upon a time")
    # The alias, as in llama-server (OpenAI's endpoint is /v1/completions).
    assert ok(server, "/completions", body)["content"] == out["content"]
    long = {**body, "prompt": "Once upon a time, there was a little girl named Lily. She loved "
            "to play outside in the park."}  # over one KV block (16 tokens)
    ok(server, "/completion", long)
    again = ok(server, "/completion", long)
    assert again["tokens_cached"] >= 16  # the prefix cache served the repeated prompt


def test_prompt_forms(server: RunningServer) -> None:
    body = {"n_predict": 6, "logit_bias": NO_EOS, "return_tokens": True}
    text = ok(server, "/completion", {**body, "prompt": "Once upon a time"})
    ids = httpx.post(server.url + "/tokenize", json={"content": "Once upon a time"}).json()
    tokens = ok(server, "/completion", {**body, "prompt": ids["tokens"]})
    mixed = ok(server, "/completion", {**body, "prompt": [ids["tokens"][0], "Once upon a time"]})
    for out in (tokens, mixed):
        assert out["content"] == text["content"]
        assert out["tokens_evaluated"] == len(ids["tokens"])
    assert len(text["tokens"]) == 6  # return_tokens
    several = ok(server, "/completion", {**body, "prompt": ["Once upon a time", "The dog"]})
    assert isinstance(several, list) and [s["index"] for s in several] == [0, 1]
    assert several[0]["content"] == text["content"]
    bad = post(server, "/completion", {"prompt": [1, {"x": 1}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    for field in ("echo", "suffix", "best_of"):  # OpenAI completions' fields, not lost here
        bad = post(server, "/completion", {"prompt": "a", field: 1})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == field


def test_stop_types_and_probabilities(server: RunningServer) -> None:
    eos = ok(server, "/completion", {"prompt": "Once upon a time", "n_predict": 5,
                                     "logit_bias": [[EOS, 100]]})
    assert eos["stop_type"] == "eos" and eos["tokens_predicted"] == 0
    story = ok(server, "/completion", {"prompt": "Once upon a time", "n_predict": 20,
                                       "logit_bias": NO_EOS})["content"]
    word = story.split()[3]
    stopped = ok(server, "/completion", {"prompt": "Once upon a time", "n_predict": 20,
                                         "logit_bias": NO_EOS, "stop": [word]})
    assert stopped["stop_type"] == "word" and stopped["stopping_word"] == word
    assert stopped["content"] == story[:story.index(word)]
    probs = ok(server, "/completion", {"prompt": "Once upon a time", "n_predict": 3,
                                       "n_probs": 2, "logit_bias": NO_EOS})
    entries = probs["completion_probabilities"]
    assert len(entries) == 3
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in entries)
    assert "".join(e["token"] for e in entries) == probs["content"]


def test_streaming_in_llama_servers_shape(server: RunningServer) -> None:
    body = {"prompt": "Once upon a time", "n_predict": 8, "logit_bias": NO_EOS}
    whole = ok(server, "/completion", body)["content"]
    with httpx.stream("POST", server.url + "/completion", json={**body, "stream": True},
                      timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert "[DONE]" not in lines[-1]  # llama-server's native stream has no [DONE]
    events = [json.loads(line[6:]) for line in lines]
    *partial, last = events
    assert all(e["stop"] is False and e["tokens"] for e in partial)
    assert "".join(e["content"] for e in partial) == whole
    assert sum(len(e["tokens"]) for e in partial) == 8
    assert last["stop"] is True and last["content"] == "" and last["stop_type"] == "limit"
    assert set(last["timings"]) == TIMING_KEYS


def test_apply_template_props_slots_health(server: RunningServer) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    out = ok(server, "/apply-template", {"messages": messages})
    assert out["prompt"] == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    prefilled = ok(server, "/apply-template", {
        "messages": [*messages, {"role": "assistant", "content": "Once"}]})
    assert prefilled["prompt"] == out["prompt"] + "Once"
    props = httpx.get(server.url + "/props").json()
    assert props["total_slots"] == 2
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 256
    assert settings["params"]["temperature"] == 0.0 and settings["params"]["top_k"] == 20
    assert settings["params"]["n_predict"] == -1
    assert props["model_path"].endswith("stories260K.gguf")
    assert "<|im_start|>" in props["chat_template"]  # ChatML: stories260K has no template
    slots = httpx.get(server.url + "/slots").json()
    assert [s["id"] for s in slots] == [0, 1]
    assert all(s["n_ctx"] == 256 and s["is_processing"] is False and s["id_task"] == -1
               and s["params"]["top_k"] == 20 for s in slots)
    for path in ("/health", "/v1/health"):
        assert httpx.get(server.url + path).json() == {"status": "ok"}


def test_infill_without_fim_tokens_and_no_embeddings(server: RunningServer) -> None:
    refused = post(server, "/infill", {"input_prefix": "def f(", "input_suffix": ")"})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "input_prefix"
    assert "fill in the middle" in refused.json()["error"]["message"]
    for path in ("/embedding", "/embeddings", "/v1/embeddings", "/rerank", "/v1/rerank"):
        response = post(server, path, {"content": "hi", "input": "hi"})
        assert response.status_code == 501, path
        error = response.json()["error"]
        assert error["type"] == "not_supported_error"
        assert ("rerank" if "rerank" in path else "embedding") in error["message"]
