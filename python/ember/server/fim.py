"""Fill-in-the-middle prompts (/infill, /v1/completions' `suffix`): a model trained for code
infilling has prefix/suffix/middle control tokens, named in its GGUF metadata
(tokenizer.ggml.fim_pre_token_id, ...) or, in older files, found by their text as llama.cpp
finds them. A model without them cannot infill: the request is a 400 saying so.

The prompt is llama-server's: [extra context] FIM_PRE prefix prompt FIM_SUF suffix FIM_MID,
with BOS first where the vocabulary adds it; with FIM_REP and FIM_SEP tokens the extra
context is the repo-level pattern (FIM_REP project, FIM_SEP filename, text, ...).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ember.server.errors import bad_request

_KEYS = {
    "pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "rep": ("tokenizer.ggml.fim_rep_token_id",),
    "sep": ("tokenizer.ggml.fim_sep_token_id",),
}
# The token texts llama.cpp recognizes when the metadata names none (llama-vocab.cpp).
_TEXTS = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "▁<PRE>",
            "<｜fim▁begin｜>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "▁<SUF>",
            "<｜fim▁hole｜>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "▁<MID>",
            "<｜fim▁end｜>"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<repo_name>", "<reponame>"),
    "sep": ("<|file_sep|>", "<file_sep>"),
}


@dataclass(frozen=True)
class FimTokens:
    """A model's infill tokens: prefix, suffix and middle, and for repo-level prompts the
    repository and file-separator tokens."""

    pre: int  # FIM_PRE, FIM_SUF, FIM_MID: every infill model has these three
    suf: int
    mid: int
    rep: int | None = None
    sep: int | None = None

    @classmethod
    def of(cls, metadata: Mapping[str, Any]) -> FimTokens | None:
        """The FIM tokens of a GGUF file's metadata; None when prefix, suffix or middle is
        missing."""
        vocab = metadata.get("tokenizer.ggml.tokens")
        n_vocab = len(vocab) if isinstance(vocab, list) else 0
        index = {text: i for i, text in enumerate(vocab)} if n_vocab else {}
        found: dict[str, int | None] = {}
        for role, keys in _KEYS.items():
            ids = [metadata.get(k) for k in keys]
            token = next((t for t in ids if isinstance(t, int) and 0 <= t < n_vocab), None)
            if token is None:
                token = next((index[t] for t in _TEXTS[role] if t in index), None)
            found[role] = token
        pre, suf, mid = found["pre"], found["suf"], found["mid"]
        if pre is None or suf is None or mid is None:
            return None
        return cls(pre, suf, mid, found["rep"], found["sep"])


def require(fim: FimTokens | None, param: str) -> FimTokens:
    if fim is None:
        raise bad_request(f"'{param}': this model cannot fill in the middle (its vocabulary has "
                          "no FIM prefix/suffix/middle tokens); use a code model trained for "
                          "infilling", param=param, code="unsupported_parameter")
    return fim


def infill_prompt(fim: FimTokens, tokenize: Any, prefix: str, suffix: str, prompt: str = "",
                  extra: Sequence[tuple[str, str]] = (), bos: Sequence[int] = ()) -> list[int]:
    """The token ids of an infill request. `tokenize(text)` gives a text's ids without special
    tokens; `bos` is [BOS] when the vocabulary adds it; `extra` holds (filename, text) chunks."""
    head: list[int] = []
    if extra and fim.rep is not None and fim.sep is not None:
        head = [fim.rep, *tokenize("myproject\n")]
        for filename, text in extra:
            head += [fim.sep, *tokenize(filename + "\n"), *tokenize(text)]
        head += [fim.sep, *tokenize("filename\n")]
    else:
        for _, text in extra:
            head += tokenize(text)
    return [*head, *bos, fim.pre, *tokenize(prefix), *tokenize(prompt), fim.suf,
            *tokenize(suffix), fim.mid]
