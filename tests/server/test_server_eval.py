"""What evaluation harnesses ask of /v1/completions: echo + logprobs + max_tokens 0 scores a
prompt (lm-evaluation-harness's local-completions), against ember.Model.eval; suffix (fill in
the middle) on a model with FIM tokens and a clear 400 without them; best_of."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from gguf_template import with_metadata
from server_support import RunningServer, ok, post, serving, start_server

import ember
from ember.server.config import ServerConfig

NO_EOS = {"2": -100}


@pytest.fixture(scope="module")
def stories(stories_path: Path) -> Iterator[RunningServer]:
    with serving(ServerConfig(model=str(stories_path), threads=1, ctx_size=256,
                              sampling={"temperature": 0.0})) as running:
        yield running


def reference_logprobs(model: ember.Model, tokens: list[int]) -> list[float]:
    """log P(token i | tokens < i) for i >= 1, from ember.Model.eval's logits in float64."""
    logits = model.eval(tokens).astype(np.float64)
    log_z = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    return [float(logits[i - 1, tokens[i]] - log_z[i - 1]) for i in range(1, len(tokens))]


def test_echo_logprobs_max_tokens_0_scores_the_prompt(stories: RunningServer,
                                                      stories_path: Path) -> None:
    prompt = "Once upon a time, there was a little girl"
    out = ok(stories, "/v1/completions", {"prompt": prompt, "echo": True, "logprobs": 2,
                                          "max_tokens": 0})
    [choice] = out["choices"]
    assert choice["text"] == prompt
    assert choice["finish_reason"] == "length"
    tokens = httpx.post(stories.url + "/tokenize", json={"content": prompt}).json()["tokens"]
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(tokens) == out["usage"]["prompt_tokens"]
    assert out["usage"]["completion_tokens"] == 0
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    # Float32 logits, log-softmax in double on both sides (ember._core.token_logprobs, numpy):
    # the two differ by float32 rounding of the result, far below 1e-4.
    expected = reference_logprobs(ember.Model(str(stories_path), n_threads=1), tokens)
    assert np.allclose(logprobs["token_logprobs"][1:], expected, atol=1e-4)
    for top, logprob in zip(logprobs["top_logprobs"][1:], logprobs["token_logprobs"][1:]):
        assert len(top) == 2 and max(top.values()) >= logprob - 1e-6
    assert logprobs["text_offset"][0] == 0
    assert logprobs["text_offset"] == sorted(logprobs["text_offset"])


def test_echo_with_generation_streamed_and_with_the_openai_client(
        stories: RunningServer) -> None:
    prompt = "Once upon a time"
    whole = ok(stories, "/v1/completions", {"prompt": prompt, "max_tokens": 5,
                                            "logit_bias": NO_EOS})["choices"][0]["text"]
    echoed = ok(stories, "/v1/completions", {"prompt": prompt, "max_tokens": 5, "echo": True,
                                             "logit_bias": NO_EOS})
    assert echoed["choices"][0]["text"] == prompt + whole
    client = openai.OpenAI(base_url=stories.base_url, api_key="x", max_retries=0)
    chunks = list(client.completions.create(model="any", prompt=prompt, max_tokens=5,
                                            echo=True, stream=True, logit_bias=NO_EOS,
                                            logprobs=1))
    text = "".join(c.choices[0].text for c in chunks)
    assert text == prompt + whole
    assert chunks[0].choices[0].text.startswith(prompt)
    first = chunks[0].choices[0].logprobs
    assert first is not None and first.token_logprobs is not None
    assert first.token_logprobs[0] is None
    scored = client.completions.create(model="any", prompt=prompt, max_tokens=0, echo=True,
                                       logprobs=0)
    lp = scored.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None
    assert lp.token_logprobs[0] is None and all(v < 0 for v in lp.token_logprobs[1:])


def test_a_multiple_choice_item_scored_over_http_matches_model_eval(smollm2_path: Path) -> None:
    """lm-evaluation-harness's recipe: token ids of context + continuation, echo, logprobs,
    max_tokens 0; a choice's score is the sum of its continuation tokens' logprobs."""
    context = "Question: What is the capital of France?\nAnswer:"
    choices = [" Paris", " London", " Berlin", " Madrid"]
    running = start_server(ServerConfig(model=str(smollm2_path), threads=1, ctx_size=256))
    try:
        def tokenize(text: str) -> list[int]:
            return httpx.post(running.url + "/tokenize", json={
                "content": text, "add_special": False}).json()["tokens"]

        n_context = len(tokenize(context))
        requests = [tokenize(context + c) for c in choices]
        assert all(r[:n_context] == tokenize(context) for r in requests)
        out = ok(running, "/v1/completions", {"model": "smollm2", "prompt": requests,
                                              "echo": True, "logprobs": 1, "max_tokens": 0})
        http_scores = [sum(c["logprobs"]["token_logprobs"][n_context:])
                       for c in sorted(out["choices"], key=lambda c: c["index"])]
    finally:
        running.stop()
    model = ember.Model(str(smollm2_path), n_threads=1)
    eval_scores = [sum(reference_logprobs(model, r)[n_context - 1:]) for r in requests]
    assert int(np.argmax(http_scores)) == int(np.argmax(eval_scores))
    assert np.allclose(http_scores, eval_scores, atol=1e-3)
    print("scores", dict(zip(choices, http_scores)))


def test_suffix_needs_fim_tokens(stories: RunningServer, stories_path: Path,
                                 tmp_path: Path) -> None:
    response = post(stories, "/v1/completions", {"prompt": "def f(", "suffix": ")"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "suffix" and "fill in the middle" in error["message"]
    # The same weights with three of its tokens named as FIM prefix/suffix/middle.
    fim_model = with_metadata(stories_path, tmp_path / "fim.gguf", uint32s={
        "tokenizer.ggml.fim_pre_token_id": 3, "tokenizer.ggml.fim_suf_token_id": 4,
        "tokenizer.ggml.fim_mid_token_id": 5})
    running = start_server(ServerConfig(model=str(fim_model), threads=1, ctx_size=256,
                                        sampling={"temperature": 0.0}))
    try:
        def tokenize(text: str) -> list[int]:
            return httpx.post(running.url + "/tokenize", json={
                "content": text, "add_special": False, "parse_special": False}).json()["tokens"]

        expected = [1, 3, *tokenize("Once upon"), 4, *tokenize("a time"), 5]  # BOS, PRE, SUF, MID
        body = {"max_tokens": 6, "logit_bias": NO_EOS}
        infilled = ok(running, "/v1/completions", {**body, "prompt": "Once upon",
                                                   "suffix": "a time"})
        by_hand = ok(running, "/v1/completions", {**body, "prompt": expected})
        assert infilled["choices"][0]["text"] == by_hand["choices"][0]["text"]
        assert infilled["usage"]["prompt_tokens"] == len(expected)
        native = ok(running, "/infill", {**body, "n_predict": 6, "input_prefix": "Once upon",
                                         "input_suffix": "a time"})
        assert native["content"] == by_hand["choices"][0]["text"]
        assert native["tokens_evaluated"] == len(expected)
        # Extra context (no repo/file-separator tokens here): its text goes first, as llama-server.
        extra = ok(running, "/infill", {**body, "n_predict": 6, "input_prefix": "Once upon",
                                        "input_suffix": "a time", "input_extra": [
                                            {"filename": "a.txt", "text": "The dog"}]})
        with_extra = ok(running, "/v1/completions", {**body, "prompt": [
            *tokenize("The dog"), *expected]})
        assert extra["content"] == with_extra["choices"][0]["text"]
        assert extra["tokens_evaluated"] == len(expected) + len(tokenize("The dog"))
    finally:
        running.stop()


def test_best_of(stories: RunningServer) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 1.0, "seed": 11}
    assert len(ok(stories, "/v1/completions", {**body, "best_of": 2, "n": 2})["choices"]) == 2
    assert len(ok(stories, "/v1/completions", {**body, "best_of": 1})["choices"]) == 1
    # Candidate i runs with seed + i, as choice i of n does: the n=3 answer shows all three.
    candidates = ok(stories, "/v1/completions", {**body, "n": 3, "logprobs": 0})
    ranked = sorted(candidates["choices"], key=lambda c: -np.mean(
        c["logprobs"]["token_logprobs"]) if c["logprobs"]["token_logprobs"] else np.inf)
    best = ok(stories, "/v1/completions", {**body, "best_of": 3})
    assert [c["text"] for c in best["choices"]] == [ranked[0]["text"]]
    assert best["choices"][0]["logprobs"] is None  # not asked for
    assert best["usage"]["completion_tokens"] == candidates["usage"]["completion_tokens"]
    two = ok(stories, "/v1/completions", {**body, "best_of": 3, "n": 2})
    expected = [c["text"] for c in sorted(ranked[:2], key=lambda c: c["index"])]
    assert [c["text"] for c in two["choices"]] == expected
    for extra in ({"best_of": 1, "n": 2}, {"best_of": 3, "stream": True}, {"best_of": 17}):
        response = post(stories, "/v1/completions", {**body, **extra})
        assert response.status_code == 400, extra
        assert response.json()["error"]["param"] == "best_of"
