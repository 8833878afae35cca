"""Embeddings from any model ember runs: an encoder (GGUF architecture "bert") or a decoder
(llama, qwen2, qwen3, gemma...: Qwen3-Embedding, e5-mistral, gte-Qwen2 are decoders pooled by
their last token). ember.LLM.embed, `ember serve --embedding` and /v1/embeddings run through this.

    embedder = Embedder("all-MiniLM-L6-v2.gguf")
    vectors = embedder.embed(["first sentence", "second one"])   # float32 [2, n_embd], unit norm
    Embedder("qwen3-embedding.gguf", pooling="last")             # the file's pooling overridden

Embedding does not go through the generation engine (ember.engine): an encoder attends both ways,
so a sequence's keys depend on every one of its tokens — it cannot be split into chunks across
steps, a prefix's cached keys are not reusable, and there is nothing to sample. The C++ Embedder
instead packs whole sequences into forward passes of up to n_batch rows (one pass over the
weights serves all of them; a decoder attends causally within each, and its output head is left
out), then pools each sequence's final (normed) states as the file's {arch}.pooling_type says or
`pooling` overrides: mean, cls (first token), last, rank (the row a reranker's head reads) or
none (every token's state: token_embeddings). A file that does not say pools an encoder by mean
and a decoder not at all, as llama.cpp. Concurrent calls take turns.

A reranker also scores query-document pairs:

    scores = embedder.rerank("what is a panda?", ["a bear", "a car"])   # float32 [2]

- a cross-encoder (BertForSequenceClassification, converted with its head: cls.* tensors, see
  ember.convert's bert module): each pair is one sequence, [CLS] query [SEP] document [SEP],
  with token type 0 for the query's part and 1 for the document's (as Hugging Face's tokenizers
  pair them); its [CLS] state goes through the head: tanh(cls · h + b), then cls.output, and
  label 0's logit is the score, as llama-server's.
- a decoder reranker (pooling rank, a cls.output head: *ForSequenceClassification converted by
  ember.convert, or Qwen3-Reranker's yes/no rows of the LM head as llama.cpp's converter writes
  them): each pair is the file's "rerank" template (tokenizer.chat_template.rerank, {query} and
  {document} filled in) or else BOS query EOS document EOS as the vocabulary adds them
  (llama-server's format_prompt_rerank); the last token's state goes through cls.output; with
  one label its logit is the score, with several (yes, no) the softmax's first, P(yes).
The head is a few small matrices, applied here in numpy (float64) on the states the C++
Embedder returns.
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

# The GGUF architectures that only embed, never generate (model/config.h: ModelConfig::is_encoder).
ENCODER_ARCHITECTURES = frozenset({"bert"})

POOLINGS = ("none", "mean", "cls", "last", "rank")  # llama-server's --pooling values


def is_embedding_model(path: str | os.PathLike[str]) -> bool:
    """Is the file an encoder, which embeds and cannot generate? (Any model can embed.)"""
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
        self.n_labels = int(self.out[0].shape[0])  # type: ignore[union-attr]

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
    """A model (an encoder or a decoder) and its tokenizer, for embeddings. n_threads defaults to
    the physical cores; n_batch (token rows per forward pass; a decoder's inputs must fit one) to
    2048; device to $EMBER_DEVICE, else "auto" (an encoder runs on the CPU then: Vulkan lacks the
    encoders' layer_norm and gelu, and loading one there raises ember.UnsupportedError saying to
    use --device cpu; --device cuda runs one on CUDA); pooling (POOLINGS) overrides the file's.
    ValueError for a pooling outside POOLINGS."""

    def __init__(self, path: str | os.PathLike[str], *, n_threads: int | None = None,
                 n_batch: int | None = None, device: str | None = None,
                 pooling: str | None = None) -> None:
        if pooling is not None and pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        self.path = Path(path)
        file = _core.GGUFFile(str(self.path))
        device = resolve_device(device)
        if device == "auto" and file.get("general.architecture") in ENCODER_ARCHITECTURES:
            device = "cpu"
        self._core = _core.Embedder(str(self.path), n_threads=n_threads, n_batch=n_batch,
                                    device=device, pooling=pooling)
        self.tokenizer = _core.Tokenizer(str(self.path))
        self.head = ClassificationHead.of(file)
        self._rerank_template: str | None = file.get("tokenizer.chat_template.rerank", None)

    device = CoreAttribute[str]('The device the model runs on ("cpu", "vulkan:0").')
    n_embd = CoreAttribute[int]()
    max_tokens = CoreAttribute[int]("The longest input, in tokens (an encoder's position table, "
                                    "a decoder's n_batch or context, whichever is smaller).")
    pooling = CoreAttribute[str]("none, mean, cls, last or rank (POOLINGS).")
    architecture = CoreAttribute[str]()
    is_encoder = CoreAttribute[bool]("An encoder (bert) cannot generate; a decoder can.")

    def tokenize(self, inputs: Sequence[EmbeddingInput]) -> list[list[int]]:
        """Each input's token ids: texts with the vocabulary's special tokens ([CLS] ... [SEP],
        a decoder's BOS / EOS as its file says), special tokens in the text parsed as such (as
        llama-server tokenizes embedding inputs), ids as given. Raises ValueError naming the
        input when one is empty or longer than max_tokens."""
        out = []
        for i, item in enumerate(inputs):
            tokens = (list(self.tokenizer.encode(item, True, not self.is_encoder))
                      if isinstance(item, str) else [int(t) for t in item])
            if not tokens:
                raise ValueError(f"input {i} is empty (it has no tokens)")
            if len(tokens) > self.max_tokens:
                raise ValueError(f"input {i} has {len(tokens)} tokens, more than the model's "
                                 f"{self.max_tokens}")
            out.append(tokens)
        return out

    def embed_tokens(self, token_lists: Sequence[Sequence[int]], normalize: bool = True
                     ) -> np.ndarray:
        """float32 [len(token_lists), n_embd]; ValueError for a token id outside the vocabulary,
        and with pooling none (which gives no one vector per input: token_embeddings)."""
        if self.pooling == "none":
            raise ValueError(f"{self.path.name} pools none (every token's vector, "
                             "token_embeddings); pooled embeddings need pooling mean, cls, last "
                             "or rank (the file's pooling_type, or the pooling option)")
        return self._core.embed([list(t) for t in token_lists], normalize)

    def embed(self, inputs: Sequence[EmbeddingInput], normalize: bool = True) -> np.ndarray:
        """float32 [len(inputs), n_embd]: one embedding per input, of unit Euclidean length
        unless normalize=False."""
        return self.embed_tokens(self.tokenize(inputs), normalize)

    def token_embeddings(self, token_lists: Sequence[Sequence[int]], normalize: bool = False
                         ) -> list[np.ndarray]:
        """Every token's final state, float32 [len(tokens), n_embd] per input, unnormalized
        unless normalize (llama-server's pooling none); ValueError unless the pooling is none."""
        if self.pooling != "none":
            raise ValueError(f"{self.path.name} pools {self.pooling}: per-token vectors need "
                             "pooling none")
        rows = self._core.embed([list(t) for t in token_lists], normalize)
        ends = np.cumsum([len(t) for t in token_lists])
        return np.split(rows, ends[:-1]) if len(token_lists) else []

    @property
    def is_reranker(self) -> bool:
        """Does the file hold a classification head (a cross-encoder) that rerank() needs?"""
        return self.head is not None

    def pair_tokens(self, query: str, documents: Sequence[str]
                    ) -> tuple[list[list[int]], list[list[int]]]:
        """Each (query, document) pair's tokens and token types: an encoder's [CLS] query [SEP]
        document [SEP] (types 0 for the query's part, 1 for the document's, where the model has
        two), a decoder's as the module doc says (types all 0). ValueError naming the document
        when a pair is longer than max_tokens."""
        if not self.is_encoder:
            tokens = [self._decoder_pair(query, d) for d in documents]
            for i, t in enumerate(tokens):
                if len(t) > self.max_tokens:
                    raise ValueError(f"document {i} with the query has {len(t)} tokens, more "
                                     f"than the model's {self.max_tokens}")
            return tokens, [[0] * len(t) for t in tokens]
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

    def _decoder_pair(self, query: str, document: str) -> list[int]:
        tok = self.tokenizer
        if self._rerank_template is not None:
            text = self._rerank_template.replace("{query}", query).replace("{document}", document)
            return list(tok.encode(text, False, True))
        eos = tok.eos
        out = [tok.bos] if tok.add_bos and tok.bos >= 0 else []
        out += list(tok.encode(query, False, False))
        if tok.add_eos and eos >= 0:
            out.append(eos)
        out += list(tok.encode(document, False, False))
        if tok.add_eos and eos >= 0:
            out.append(eos)
        return out

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
        wanted = ("cls", "rank") if self.is_encoder else ("rank",)
        if self.pooling not in wanted:
            row = "[CLS]" if self.is_encoder else "last token's"
            raise ValueError(f"{self.path.name}: a reranker reads the {row} state (pooling "
                             f"{' or '.join(wanted)}), but it pools {self.pooling}")
        states = self._core.embed([list(t) for t in tokens], False,
                                  [list(t) for t in token_types])
        logits = self.head.logits(states)
        if not self.is_encoder and self.head.n_labels > 1:  # yes/no: P(yes), as llama.cpp's qwen3
            logits = np.exp(logits - logits.max(axis=1, keepdims=True))
            logits /= logits.sum(axis=1, keepdims=True)
        return logits[:, 0].astype(np.float32)
