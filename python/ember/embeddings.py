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
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Union

import numpy as np

from ember import _core
from ember.engine import resolve_device

EmbeddingInput = Union[str, Sequence[int]]  # a text, or token ids used as they are

# The GGUF architectures that are embedding models (model/config.h: ModelConfig::is_encoder).
ENCODER_ARCHITECTURES = frozenset({"bert"})


def is_embedding_model(path: str | os.PathLike[str]) -> bool:
    return _core.GGUFFile(str(path)).get("general.architecture") in ENCODER_ARCHITECTURES


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

    @property
    def device(self) -> str:
        """The device the model runs on ("cpu")."""
        return self._core.device

    @property
    def n_embd(self) -> int:
        return self._core.n_embd

    @property
    def max_tokens(self) -> int:
        """The longest input, in tokens (the model's position table)."""
        return self._core.max_tokens

    @property
    def pooling(self) -> str:
        return self._core.pooling

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
