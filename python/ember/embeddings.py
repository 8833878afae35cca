"""Embeddings from an encoder model (GGUF architecture "bert"): ember.LLM.embed, `ember serve
--embedding` and /v1/embeddings run through this.

    embedder = Embedder("all-MiniLM-L6-v2.gguf")
    vectors = embedder.embed(["first sentence", "second one"])   # float32 [2, n_embd], unit norm

Embedding does not go through the generation engine (ember.engine): an encoder attends both ways,
so a sequence's keys depend on every one of its tokens — it cannot be split into chunks across
steps, a prefix's cached keys are not reusable, and there is nothing to sample. The C++ Embedder
instead packs whole sequences into forward passes of up to n_batch rows (one pass over the
weights serves all of them), then pools each as the model's file says (mean, CLS or last token).
Concurrent calls take turns.

A cross-encoder reranker (BertForSequenceClassification, converted with its head: cls.* tensors,
see ember.convert's bert module) also scores query-document pairs:

    scores = embedder.rerank("what is a panda?", ["a bear", "a car"])   # float32 [2], raw logits

Each pair is one sequence, [CLS] query [SEP] document [SEP], with token type 0 for the query's
part and 1 for the document's (as Hugging Face's tokenizers pair them); its [CLS] state goes
through the head: tanh(cls · h + b), then cls.output (label 0's logit is the score, as
llama-server's). The head is a few small matrices, applied here in numpy (float64) on the states
the C++ Embedder returns.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np

from ember import _core
from ember.core_attribute import CoreAttribute
from ember.options import resolve_device

EmbeddingInput = Union[str, Sequence[int]]  # a text, or token ids used as they are

# The GGUF architectures that are embedding models (model/config.h: ModelConfig::is_encoder).
ENCODER_ARCHITECTURES = frozenset({"bert"})


def is_embedding_model(path: str | os.PathLike[str]) -> bool:
    return _core.GGUFFile(str(path)).get("general.architecture") in ENCODER_ARCHITECTURES


class ClassificationHead:
    """A sequence classifier's head from its GGUF file: the pooler (cls.weight / cls.bias, with
    tanh), when there is one, then the classifier (cls.output.weight / cls.output.bias)."""

    def __init__(self, file: Any) -> None:
        names = {t.name for t in file.tensors}

        def load(name: str) -> np.ndarray | None:
            return np.asarray(file.dequantize(name), np.float64) if name in names else None

        self.pooler = load("cls.weight"), load("cls.bias")    # [n_embd, n_embd], [n_embd]
        self.out = load("cls.output.weight"), load("cls.output.bias")  # [n_labels, n_embd], [n_labels]

    @staticmethod
    def of(file: Any) -> ClassificationHead | None:
        """The file's head; None for an embedding model (no cls.output.weight)."""
        has = any(t.name == "cls.output.weight" for t in file.tensors)
        return ClassificationHead(file) if has else None

    def logits(self, states: np.ndarray) -> np.ndarray:
        """float64 [n, n_labels] of [CLS] states [n, n_embd]."""
        h = states.astype(np.float64)
        weight, bias = self.pooler
        if weight is not None:
            h = np.tanh(h @ weight.T + (bias if bias is not None else 0.0))
        weight, bias = self.out
        assert weight is not None
        return h @ weight.T + (bias if bias is not None else 0.0)


class Embedder:
    """An encoder model and its tokenizer. n_threads defaults to the physical cores; n_batch
    (token rows per forward pass) to 2048; device to $EMBER_DEVICE, else the CPU ("auto" is the
    CPU too: the GPU backends lack the encoders' layer_norm and gelu, and loading on one raises
    ember.UnsupportedError saying to use --device cpu)."""

    def __init__(self, path: str | os.PathLike[str], *, n_threads: int | None = None,
                 n_batch: int | None = None, device: str | None = None) -> None:
        self.path = Path(path)
        device = resolve_device(device)
        self._core = _core.Embedder(str(self.path), n_threads=n_threads, n_batch=n_batch,
                                    device="cpu" if device == "auto" else device)
        self.tokenizer = _core.Tokenizer(str(self.path))
        self.head = ClassificationHead.of(_core.GGUFFile(str(self.path)))

    device = CoreAttribute[str]('The device the model runs on ("cpu").')
    n_embd = CoreAttribute[int]()
    max_tokens = CoreAttribute[int]("The longest input, in tokens (the model's position table).")
    pooling = CoreAttribute[str]()

    def tokenize(self, inputs: Sequence[EmbeddingInput]) -> list[list[int]]:
        """Each input's token ids: texts with the vocabulary's [CLS] ... [SEP], ids as given.
        Raises ValueError naming the input when one is empty or longer than max_tokens."""
        out = []
        for i, item in enumerate(inputs):
            tokens = (list(self.tokenizer.encode(item, True, False)) if isinstance(item, str)
                      else [int(t) for t in item])
            if not tokens:
                raise ValueError(f"input {i} is empty (it has no tokens)")
            if len(tokens) > self.max_tokens:
                raise ValueError(f"input {i} has {len(tokens)} tokens, more than the model's "
                                 f"{self.max_tokens}")
            out.append(tokens)
        return out

    def embed_tokens(self, token_lists: Sequence[Sequence[int]], normalize: bool = True
                     ) -> np.ndarray:
        """float32 [len(token_lists), n_embd]; ValueError for a token id outside the vocabulary."""
        return self._core.embed([list(t) for t in token_lists], normalize)

    def embed(self, inputs: Sequence[EmbeddingInput], normalize: bool = True) -> np.ndarray:
        """float32 [len(inputs), n_embd]: one embedding per input, of unit Euclidean length
        unless normalize=False."""
        return self.embed_tokens(self.tokenize(inputs), normalize)

    @property
    def is_reranker(self) -> bool:
        """Does the file hold a classification head (a cross-encoder) that rerank() needs?"""
        return self.head is not None

    def pair_tokens(self, query: str, documents: Sequence[str]
                    ) -> tuple[list[list[int]], list[list[int]]]:
        """Each (query, document) pair's tokens, [CLS] query [SEP] document [SEP], and token
        types (0 for the query's part, 1 for the document's, where the model has two).
        ValueError naming the document when a pair is longer than max_tokens."""
        q = list(self.tokenizer.encode(query, True, False))
        second = 1 if self._core.n_token_types > 1 else 0
        tokens, types = [], []
        for i, document in enumerate(documents):
            d = list(self.tokenizer.encode(document, True, False))[1:]  # its [CLS] dropped
            if len(q) + len(d) > self.max_tokens:
                raise ValueError(f"document {i} with the query has {len(q) + len(d)} tokens, "
                                 f"more than the model's {self.max_tokens}")
            tokens.append(q + d)
            types.append([0] * len(q) + [second] * len(d))
        return tokens, types

    def rerank(self, query: str, documents: Sequence[str]) -> np.ndarray:
        """float32 [len(documents)]: each document's relevance to the query, the head's logit
        (higher is more relevant). ValueError for a model without a head."""
        return self.rerank_tokens(*self.pair_tokens(query, documents))

    def rerank_tokens(self, tokens: Sequence[Sequence[int]], token_types: Sequence[Sequence[int]]
                      ) -> np.ndarray:
        """rerank() of pairs already tokenized (pair_tokens)."""
        if self.head is None:
            raise ValueError(f"{self.path.name} is not a reranking model (it has no "
                             "classification head, cls.output.weight)")
        if self.pooling != "cls":
            raise ValueError(f"{self.path.name}: a reranker reads the [CLS] state, but the "
                             f"file pools {self.pooling}")
        states = self._core.embed([list(t) for t in tokens], False,
                                  [list(t) for t in token_types])
        return self.head.logits(states)[:, 0].astype(np.float32)
