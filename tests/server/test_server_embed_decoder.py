"""Embeddings and reranking from decoder models on a real uvicorn server: `--embedding` with a
tiny random Qwen3 (converted by ember) keeps the chat routes beside /v1/embeddings and /embedding
(llama-server's behaviour), the vectors are transformers' pooled final hidden states (cosine >=
0.9999, as tests/model/test_model_embed_decoder.py justifies), --pooling none gives every token's
vector on /embedding and a 400 on /v1/embeddings, and /v1/rerank with a converted
Qwen3ForSequenceClassification orders documents as transformers' logits do."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import transformers
from checkpoints import N_VOCAB, save_checkpoint, spread_weights, tokens_for_test
from server_support import RunningServer, serve_process, serving
from tiny_models import make_model

from ember.convert import convert
from ember.embeddings import Embedder
from ember.server.config import ServerConfig

SEQS = [tokens_for_test(n, seed=i) for i, n in enumerate((3, 12, 40))]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    model = make_model("qwen3", vocab_size=N_VOCAB)
    folder = save_checkpoint(model, tmp_path_factory.mktemp("qwen3"))
    return model.double().eval(), convert(folder, folder / "m.gguf", "f32", progress=False).path


def hidden(model, tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model.model(torch.tensor([tokens])).last_hidden_state[0].numpy()


@pytest.fixture(scope="module")
def chat_and_embed(qwen3) -> Iterator[RunningServer]:
    config = ServerConfig(model=str(qwen3[1]), embedding=True, pooling="last", threads=2,
                          parallel=2, ctx_size=256)
    with serving(config) as running:
        yield running


def test_embeddings_beside_chat(chat_and_embed: RunningServer, qwen3) -> None:
    model, _ = qwen3
    r = httpx.post(chat_and_embed.url + "/v1/embeddings", json={"input": SEQS}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == sum(len(s) for s in SEQS)
    vectors = np.array([d["embedding"] for d in body["data"]])
    assert vectors.shape == (3, 64)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    for tokens, v in zip(SEQS, vectors):
        assert cosine(v, hidden(model, tokens)[-1]) >= 0.9999
    native = httpx.post(chat_and_embed.url + "/embedding", json={"content": SEQS}, timeout=60)
    assert native.status_code == 200
    np.testing.assert_array_equal(np.array([d["embedding"][0] for d in native.json()]), vectors)
    # The chat and completion routes answer from the same server.
    chat = httpx.post(chat_and_embed.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["role"] == "assistant"
    completion = httpx.post(chat_and_embed.url + "/v1/completions", timeout=60,
                            json={"prompt": SEQS[1], "max_tokens": 2})
    assert completion.status_code == 200
    assert completion.json()["usage"]["prompt_tokens"] == len(SEQS[1])


def test_without_embedding_the_routes_are_501(qwen3) -> None:
    with serving(ServerConfig(model=str(qwen3[1]), threads=1, parallel=1, ctx_size=128)) as s:
        r = httpx.post(s.url + "/v1/embeddings", json={"input": "hi"})
        assert r.status_code == 501 and "--embedding" in r.json()["error"]["message"]


def test_pooling_none_gives_every_token_on_embedding(qwen3) -> None:
    model, path = qwen3
    config = ServerConfig(model=str(path), embedding=True, pooling="none", threads=1,
                          parallel=1, ctx_size=128)
    with serving(config) as s:
        r = httpx.post(s.url + "/embedding", json={"content": SEQS[:2]}, timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()
        assert [np.array(d["embedding"]).shape for d in out] == [(3, 64), (12, 64)]
        for tokens, d in zip(SEQS, out):
            got, want = np.array(d["embedding"]), hidden(model, tokens)
            assert min(cosine(a, b) for a, b in zip(got, want)) >= 0.9999
            assert abs(np.linalg.norm(got[0]) / np.linalg.norm(want[0]) - 1) < 1e-3  # raw
        oai = httpx.post(s.url + "/v1/embeddings", json={"input": "hi"})
        assert oai.status_code == 400 and "pooling 'none'" in oai.json()["error"]["message"]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    config = transformers.Qwen3Config(
        vocab_size=N_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
        rms_norm_eps=1e-5, num_labels=1, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(3)
    model = transformers.Qwen3ForSequenceClassification(config).eval()
    spread_weights(model)
    folder = save_checkpoint(model, tmp_path_factory.mktemp("rerank"))
    return model.double(), convert(folder, folder / "r.gguf", "f32", progress=False).path


def test_rerank_with_a_decoder_reranker(reranker) -> None:
    model, path = reranker
    query, documents = "the cat", ["a dog ran", "the cat sat on the mat", "once upon a time", "x"]
    tokens, _ = Embedder(path, n_threads=1).pair_tokens(query, documents)
    with torch.no_grad():
        want = [float(model(torch.tensor([t])).logits[0, 0]) for t in tokens]
    config = ServerConfig(model=str(path), rerank=True, threads=1, parallel=1, ctx_size=128)
    with serving(config) as s:
        for route in ("/v1/rerank", "/rerank"):
            r = httpx.post(s.url + route, timeout=60, json={
                "query": query, "documents": documents, "top_n": 3, "return_documents": True})
            assert r.status_code == 200, r.text
            results = r.json()["results"]
            assert [x["index"] for x in results] == list(np.argsort(want)[::-1][:3])
            for x in results:
                assert abs(x["relevance_score"] - want[x["index"]]) < 1e-3 * max(1, np.ptp(want))
                assert x["document"] == {"text": documents[x["index"]]}
        # A decoder reranker is a decoder: it also generates.
        chat = httpx.post(s.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1})
        assert chat.status_code == 200


def test_ember_serve_embedding_cli_with_a_decoder(qwen3, tmp_path: Path) -> None:
    model, path = qwen3
    with serve_process(path, ["--embedding", "--pooling", "mean", "-t", "1"], tmp_path) as (url, _):
        r = httpx.post(url + "/v1/embeddings", json={"input": [SEQS[2]]}, timeout=60)
        assert r.status_code == 200, r.text
        v = np.array(r.json()["data"][0]["embedding"])
        assert cosine(v, hidden(model, SEQS[2]).mean(0)) >= 0.9999


def test_rerank_refuses_a_decoder_without_a_head(qwen3) -> None:
    """`--rerank` on a chat model fails the load with a message naming what it needs."""
    import asyncio

    from ember.server.context import AppContext

    ctx = AppContext(ServerConfig(model=str(qwen3[1]), rerank=True, threads=1, parallel=1,
                                  ctx_size=64))
    ctx.loop = asyncio.new_event_loop()
    try:
        ctx.load()
        assert ctx.load_error is not None and "is not a reranking model" in ctx.load_error
        assert "Qwen3ForSequenceClassification" in ctx.load_error
    finally:
        ctx.close()
        ctx.loop.close()
