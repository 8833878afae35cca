"""Reranking: a tiny random BertForSequenceClassification (a cross-encoder) made here with
transformers, converted by ember with its head, scores query-document pairs as transformers
does (token types included); `ember serve --rerank` answers llama-server's /rerank in its Jina
and TEI shapes, sorted and cut to top_n; bad requests are 400s naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from checkpoints import write_wordpiece_tokenizer
from server_support import RunningServer, assert_400_naming, serving

from ember import _core
from ember.convert import convert
from ember.embeddings import Embedder
from ember.server.config import ServerConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(115)]
QUERY = "w3 w7 w8"
DOCUMENTS = ["w9 w10 w11", "w3", "w50 w51 w52 w53 w54", "w3 w7 w8", "w100"]


def ids(text: str) -> list[int]:
    return [VOCAB.index(word) for word in text.split()]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the Hugging Face folder, its f32 GGUF)."""
    folder = tmp_path_factory.mktemp("reranker") / "hf"
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=96,
                                     max_position_embeddings=24, type_vocab_size=2, num_labels=1)
    model = transformers.BertForSequenceClassification(config).eval()
    with torch.no_grad():  # weights large enough that the documents' scores differ by far
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("weight") else 0.0))
            else:
                p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(folder)
    write_wordpiece_tokenizer(folder, VOCAB)
    path = convert(folder, folder.parent / "reranker.gguf", "f32", progress=False).path
    return folder, path


def transformers_scores(folder: Path, token_types: bool) -> np.ndarray:
    """The model's logits for [CLS] query [SEP] document [SEP], built by hand here; with
    token_types, 1 for the document's part (as Hugging Face's tokenizers pair texts)."""
    model = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    out = []
    for document in DOCUMENTS:
        first, second = [2, *ids(QUERY), 3], [*ids(document), 3]
        types = [0] * len(first) + [int(token_types)] * len(second)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([first + second]),
                           token_type_ids=torch.tensor([types])).logits
        out.append(float(logits[0, 0]))
    return np.array(out)


def test_scores_match_transformers(cross_encoder: tuple[Path, Path]) -> None:
    folder, path = cross_encoder
    file = _core.GGUFFile(str(path))
    assert file.get("bert.classifier.output_labels") == ["LABEL_0"]
    assert file.get("bert.pooling_type") == 2  # cls: the state the head reads
    assert {"cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias"} <= {
        t.name for t in file.tensors}
    embedder = Embedder(path, n_threads=1)
    assert embedder.is_reranker
    tokens, types = embedder.pair_tokens(QUERY, DOCUMENTS[:1])
    assert tokens == [[2, *ids(QUERY), 3, *ids(DOCUMENTS[0]), 3]]
    assert types == [[0] * 5 + [1] * 4]
    got = embedder.rerank(QUERY, DOCUMENTS)
    expected = transformers_scores(folder, token_types=True)
    # f32 throughout except K/V stored as f16 (relative 2^-11 on states of size ~1, through a
    # tanh and one projection): 4e-4 seen at most; the scores spread over ~0.6.
    np.testing.assert_allclose(got, expected, atol=1e-3, rtol=0)
    assert np.ptp(expected) > 0.3
    # The document's token type is 1: scoring it as type 0 (as llama.cpp does) is another answer.
    assert np.abs(transformers_scores(folder, token_types=False) - got).max() > 0.05


@pytest.fixture(scope="module")
def server(cross_encoder: tuple[Path, Path]) -> Iterator[RunningServer]:
    with serving(ServerConfig(model=str(cross_encoder[1]), rerank=True, threads=1,
                              aliases=["reranker"])) as running:
        yield running


def test_rerank_endpoint_shapes(server: RunningServer, cross_encoder: tuple[Path, Path]) -> None:
    scores = Embedder(cross_encoder[1], n_threads=1).rerank(QUERY, DOCUMENTS)
    order = [int(i) for i in np.argsort(-scores)]
    for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
        r = httpx.post(server.url + path, timeout=30, json={
            "model": "reranker", "query": QUERY, "documents": DOCUMENTS, "top_n": 3,
            "return_documents": True})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["object"] == "list" and out["model"] == "reranker"
        assert [x["index"] for x in out["results"]] == order[:3]
        for x in out["results"]:
            assert x["relevance_score"] == pytest.approx(float(scores[x["index"]]), abs=1e-6)
            assert x["document"] == {"text": DOCUMENTS[x["index"]]}
        n_tokens = sum(5 + len(d.split()) + 1 for d in DOCUMENTS)
        assert out["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    every = httpx.post(server.url + "/v1/rerank", json={"query": QUERY,
                                                        "documents": DOCUMENTS}).json()
    assert [x["index"] for x in every["results"]] == order
    assert "document" not in every["results"][0]
    tei = httpx.post(server.url + "/rerank", json={"query": QUERY, "texts": DOCUMENTS,
                                                   "return_text": True}).json()
    assert [(x["index"], x["text"]) for x in tei] == [(i, DOCUMENTS[i]) for i in order]
    assert tei[0]["score"] == pytest.approx(float(scores[order[0]]), abs=1e-6)
    # The embedding routes answer too: the [CLS] state, normalized.
    r = httpx.post(server.url + "/v1/embeddings", json={"input": "w3"})
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 64


@pytest.mark.parametrize("body, param, text", [
    ({"documents": ["w1"]}, "query", "'query' is required"),
    ({"query": 3, "documents": ["w1"]}, "query", "must be a string"),
    ({"query": "w1", "documents": []}, "documents", "non-empty array of strings"),
    ({"query": "w1", "documents": ["w1", 2]}, "documents", "non-empty array of strings"),
    ({"query": "w1", "documents": ["w1"], "top_n": 0}, "top_n", ">= 1"),
    ({"query": "w1", "documents": ["w1 " * 30]}, "documents",
     "document 0 with the query has 34 tokens, more than the model's 24"),
])
def test_bad_rerank_requests_are_400s(server: RunningServer, body: dict, param: str,
                                      text: str) -> None:
    assert_400_naming(httpx.post(server.url + "/v1/rerank", json=body), param, text)
