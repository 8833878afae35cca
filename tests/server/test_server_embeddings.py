"""/v1/embeddings on `ember serve --embedding` with all-MiniLM-L6-v2 (converted by ember), through
the official openai client and raw HTTP: the vectors equal LLM.embed's, in float and base64,
for text and token-id inputs, with OpenAI's response shape and usage; bad requests are 400s
naming the field; generation routes and non-embedding servers refuse clearly."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from server_support import RunningServer, assert_400_naming, serve_process, serving, start_server

from ember.convert import convert
from ember.llm import LLM
from ember.server.config import ServerConfig

TEXTS = ["The cat sat on the mat.", "Paris is the capital of France.", "ok"]


@pytest.fixture(scope="module")
def minilm(minilm_hf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert(minilm_hf_path, tmp_path_factory.mktemp("minilm") / "minilm.gguf", "f16",
                   progress=False).path


@pytest.fixture(scope="module")
def expected(minilm: Path) -> np.ndarray:
    return LLM(minilm, n_threads=2).embed(TEXTS)


@pytest.fixture(scope="module")
def server(minilm: Path) -> Iterator[RunningServer]:
    with serving(ServerConfig(model=str(minilm), embedding=True, threads=2)) as running:
        yield running



def test_openai_client_gets_the_same_vectors(client: openai.OpenAI, expected: np.ndarray) -> None:
    r = client.embeddings.create(model="minilm.gguf", input=TEXTS)
    assert r.object == "list" and r.model == "minilm.gguf"
    assert [d.index for d in r.data] == [0, 1, 2] and all(d.object == "embedding" for d in r.data)
    got = np.array([d.embedding for d in r.data], dtype=np.float32)
    np.testing.assert_array_equal(got, expected)  # float32 -> JSON -> float32 round-trips exactly
    # [CLS] + 7 + [SEP], [CLS] + 7 + [SEP], [CLS] ok [SEP]
    assert (r.usage.prompt_tokens, r.usage.total_tokens) == (21, 21)
    # Asked for base64 explicitly, the client hands the string over as it came.
    b = client.embeddings.create(model="minilm.gguf", input=TEXTS[1], encoding_format="base64")
    got = np.frombuffer(base64.b64decode(b.data[0].embedding), dtype="<f4")
    np.testing.assert_array_equal(got, expected[1])


def test_raw_http_shapes(server: RunningServer, expected: np.ndarray, minilm: Path) -> None:
    ids = LLM(minilm, n_threads=1).tokenize(TEXTS[0])
    for body, rows in [({"input": TEXTS[2]}, [2]), ({"input": ids}, [0]),
                       ({"input": [ids, ids], "encoding_format": "base64"}, [0, 0]),
                       ({"input": TEXTS, "dimensions": 384, "user": "u"}, [0, 1, 2])]:
        r = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        for d, row in zip(data, rows):
            vec = (np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
                   if body.get("encoding_format") == "base64" else np.array(d["embedding"], np.float32))
            # Fewer rows in a pass than in `expected`'s may pick another f16 matmul kernel
            # (Backend::matmul_exact_min_rows), whose rounding moves values by ~1e-5.
            np.testing.assert_allclose(vec, expected[row], atol=1e-4, rtol=0)
    assert httpx.post(server.url + "/embeddings", json={"input": "x"}).status_code == 200


@pytest.mark.parametrize(("body", "param", "message"), [
    ({}, "input", "'input' must be a string"),
    ({"input": []}, "input", "non-empty"),
    ({"input": ["a", 5]}, "input", "not a mix"),
    ({"input": [[]]}, "input", "input 0 is empty"),
    ({"input": [[101] * 513]}, "input", "input 0 has 513 tokens, more than the model's 512"),
    ({"input": [101, 40000]}, "input", "token 1 has id 40000, outside the vocabulary"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format", "'float' or 'base64'"),
    ({"input": "a", "dimensions": 128}, "dimensions", "must be 384"),
    ({"input": "a", "temperature": 1}, "temperature", "unknown field"),
])
def test_bad_requests_are_400s_naming_the_field(server: RunningServer, body: dict, param: str,
                                                message: str) -> None:
    assert_400_naming(httpx.post(server.url + "/v1/embeddings", json=body), param, message)


def test_llama_server_native_embedding(server: RunningServer, expected: np.ndarray,
                                       minilm: Path) -> None:
    """/embedding (and /embeddings, its alias in llama-server): [{"index", "embedding": [vec]}],
    normalized as embd_normalize says (llama.cpp's common_embd_normalize, recomputed here in
    float64 from the unnormalized vectors)."""
    raw = LLM(minilm, n_threads=2).embed(TEXTS, normalize=False).astype(np.float64)
    for path, body in [("/embedding", {"content": TEXTS}), ("/embeddings", {"input": TEXTS}),
                       ("/embedding", {"content": TEXTS, "embd_normalize": 2})]:
        r = httpx.post(server.url + path, json=body, timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()
        assert [d["index"] for d in out] == [0, 1, 2]
        assert all(len(d["embedding"]) == 1 for d in out)  # one pooled vector each
        np.testing.assert_array_equal(np.array([d["embedding"][0] for d in out], np.float32),
                                      expected)
    one = httpx.post(server.url + "/embedding", json={"content": TEXTS[1]}, timeout=60).json()
    np.testing.assert_allclose(one[0]["embedding"][0], expected[1], atol=1e-4, rtol=0)
    scales = {-1: np.ones(len(TEXTS)), 0: np.abs(raw).max(axis=1) / 32760.0,
              1: np.abs(raw).sum(axis=1), 3: (np.abs(raw) ** 3).sum(axis=1) ** (1 / 3)}
    for norm, scale in scales.items():
        r = httpx.post(server.url + "/embedding", json={"content": TEXTS, "embd_normalize": norm},
                       timeout=60)
        got = np.array([d["embedding"][0] for d in r.json()], np.float64)
        # float32 vectors: relative error of a few float32 ulps
        np.testing.assert_allclose(got, raw / scale[:, None], rtol=1e-5,
                                   atol=1e-6 * np.abs(raw / scale[:, None]).max())
    bad_norm = httpx.post(server.url + "/embedding", json={"content": "x", "embd_normalize": 1.5})
    assert bad_norm.status_code == 400 and bad_norm.json()["error"]["param"] == "embd_normalize"
    mixed = httpx.post(server.url + "/embedding", json={"content": ["a", 5]})
    assert mixed.status_code == 400 and mixed.json()["error"]["param"] == "content"


def test_an_embedding_model_does_not_rerank(server: RunningServer, minilm: Path) -> None:
    from ember.embeddings import Embedder

    assert not Embedder(minilm, n_threads=1).is_reranker  # no classification head
    r = httpx.post(server.url + "/v1/rerank", json={"query": "a", "documents": ["b"]})
    assert r.status_code == 501 and "ember serve --rerank" in r.json()["error"]["message"]


def test_generation_routes_refuse(server: RunningServer) -> None:
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "embedding model" in r.json()["error"]["message"]


def test_a_generation_server_refuses_embeddings(stories_path: Path) -> None:
    running = start_server(ServerConfig(model=str(stories_path), threads=1))
    try:
        r = httpx.post(running.url + "/v1/embeddings", json={"input": "hi"})
        assert r.status_code == 501 and "--embedding" in r.json()["error"]["message"]
    finally:
        running.stop()


def test_ember_serve_embedding_cli(minilm: Path, expected: np.ndarray, tmp_path: Path) -> None:
    with serve_process(minilm, ["--embedding", "-t", "1"], tmp_path) as (url, _):
        r = httpx.post(url + "/v1/embeddings", json={"input": TEXTS}, timeout=60)
        assert r.status_code == 200
        got = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
        np.testing.assert_array_equal(got, expected)
