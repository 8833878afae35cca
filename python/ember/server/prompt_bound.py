"""The bounded-cost context check: a text certainly longer than the context in tokens, found
without tokenizing it (a 7.9 MB prompt is refused in microseconds, not after 1.3 M tokens).

Why the bound holds: every token of ember's SPM and BPE vocabularies stands for exactly the
bytes of its piece (Tokenizer.token_to_piece: SPM's "▁" as a space, byte-level BPE's raw bytes,
a byte-fallback token one byte, a control token its text), and encoding only adds tokens (BOS,
SPM's space prefix), never lets one token cover more text than its piece. So a text of B UTF-8
bytes has at least ceil(B / max_token_bytes) tokens, and B > n_ctx * max_token_bytes means
more than n_ctx tokens for certain. (WordPiece vocabularies drop whitespace and would break
this; they serve embedding models, which the generation endpoints do not run.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ember.server.errors import context_exceeded


@dataclass(frozen=True)
class PromptBound:
    n_ctx: int              # tokens one request may reach
    max_token_bytes: int    # the longest piece of the vocabulary, in bytes

    @classmethod
    def of(cls, engine: Any) -> PromptBound:
        """Reads the vocabulary once (at load: ~50 ms for 150K tokens)."""
        piece = engine.tokenizer.token_to_piece
        longest = max((len(piece(t)) for t in range(engine.n_vocab)), default=1)
        return cls(engine.n_ctx, max(1, longest))

    @property
    def max_bytes(self) -> int:
        """Texts longer than this (in UTF-8 bytes, or in characters: each is >= 1 byte) have
        more than n_ctx tokens."""
        return self.n_ctx * self.max_token_bytes

    def check(self, text: str, param: str) -> None:
        """A 400 (context_length_exceeded) when `text` is certainly over the context; cost O(1)
        for short and for very long texts, one UTF-8 encode in between."""
        if len(text) * 4 <= self.max_bytes:  # a character is at most 4 bytes
            return
        n_bytes = len(text) if len(text) > self.max_bytes else len(text.encode("utf-8"))
        if n_bytes > self.max_bytes:
            raise self.too_long(param, f"{n_bytes}+ bytes of text", n_bytes)

    def too_long(self, param: str, what: str, n_bytes: int) -> Exception:
        """The error for a text of at least `n_bytes` bytes; its n_prompt_tokens is the least
        number of tokens those bytes can be (the text was never tokenized)."""
        return context_exceeded(
            f"the prompt has {what}, certainly more than the model's context of {self.n_ctx} "
            f"tokens (no token of this model stands for more than {self.max_token_bytes} bytes, "
            f"so at most {self.max_bytes} bytes fit); shorten the prompt", param,
            -(-n_bytes // self.max_token_bytes), self.n_ctx)
