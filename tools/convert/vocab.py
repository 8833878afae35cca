"""Tokenizer metadata: tokenizer.model (SentencePiece) or tokenizer.json (byte-level BPE, WordPiece) to the
tokenizer.ggml.* keys, the way llama.cpp's convert_hf_to_gguf.py writes them.

Special token ids, add_bos/add_eos, merges and the chat template come from gguf.SpecialVocab
(gguf-py's reader of tokenizer.json / tokenizer_config.json / config.json), as in llama.cpp.
llama.cpp names the BPE pre-tokenizer by hashing the encoding of a probe text, which needs the
`tokenizers` package and a table of known hashes; here it is recognised from the pre-tokenizer
regexes in tokenizer.json and the config's model_type instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import gguf
from gguf import GGUFWriter, TokenType

from .errors import ConvertError

# The split regexes of the known byte-level BPE pre-tokenizers (tokenizer.json "Split" patterns).
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass
class Vocab:
    """What tokenizer.ggml.* gets: model, pre-tokenizer, tokens with scores and types."""

    model: str                      # "llama" (SentencePiece), "gpt2" (byte-level BPE), "bert"
    pre: str                        # tokenizer.ggml.pre
    tokens: list[bytes]
    token_types: list[int]          # gguf.TokenType values
    scores: list[float] | None = None
    special: gguf.SpecialVocab | None = None
    defaults: dict[str, int] = field(default_factory=dict)  # ids to use when SpecialVocab has none

    def add_to(self, writer: GGUFWriter) -> None:
        writer.add_tokenizer_model(self.model)
        writer.add_tokenizer_pre(self.pre)
        writer.add_token_list(self.tokens)
        if self.scores is not None:
            writer.add_token_scores(self.scores)
        writer.add_token_types(self.token_types)
        if self.special is not None:
            for kind, token_id in self.defaults.items():
                self.special.special_token_ids.setdefault(kind, token_id)
            self.special.add_to_gguf(writer, quiet=True)


def _looks_special(text: str) -> bool:
    """convert_hf_to_gguf.py's does_token_look_special: added tokens that act as control tokens
    even when tokenizer.json does not mark them special."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>"))
            or (text.startswith("<unused") and text.endswith(">")))


def _sentencepiece_vocab(path: Path, n_vocab: int | None, folder: Path) -> Vocab:
    """convert_hf_to_gguf.py's _create_vocab_sentencepiece."""
    from sentencepiece import SentencePieceProcessor

    sp = SentencePieceProcessor()
    try:
        sp.LoadFromFile(str(path))
    except (OSError, RuntimeError) as err:
        raise ConvertError(f"{path}: not a SentencePiece model ({err})") from None
    n = n_vocab or sp.vocab_size()
    tokens = [f"[PAD{i}]".encode() for i in range(n)]
    scores = [-10000.0] * n
    types = [TokenType.UNUSED] * n
    for i in range(min(sp.vocab_size(), n)):
        tokens[i] = sp.IdToPiece(i).encode("utf-8")
        scores[i] = sp.GetScore(i)
        if sp.IsUnknown(i):
            types[i] = TokenType.UNKNOWN
        elif sp.IsControl(i):
            types[i] = TokenType.CONTROL
        elif sp.IsUnused(i):
            types[i] = TokenType.UNUSED
        elif sp.IsByte(i):
            types[i] = TokenType.BYTE
        else:
            types[i] = TokenType.NORMAL

    def set_added(token_id: int, text: str, control: bool) -> None:
        if token_id >= n:
            return
        if not control:
            text = text.replace("\u2581", " ")  # llama.cpp pre-normalizes user-defined spaces
        tokens[token_id] = text.encode("utf-8")
        scores[token_id] = -1000.0
        types[token_id] = TokenType.CONTROL if control else TokenType.USER_DEFINED

    added = folder / "added_tokens.json"
    if added.is_file():
        for text, token_id in _read_json(added).items():
            if token_id < n:
                tokens[token_id] = text.encode("utf-8")
                scores[token_id] = -1000.0
                types[token_id] = TokenType.USER_DEFINED
    config = folder / "tokenizer_config.json"
    if config.is_file():
        for key, data in _read_json(config).get("added_tokens_decoder", {}).items():
            text = data["content"]
            set_added(int(key), text, bool(data.get("special")) or _looks_special(text))
    defaults = {kind: token_id for kind, token_id in
                (("unk", sp.unk_id()), ("bos", sp.bos_id()), ("eos", sp.eos_id()))
                if 0 <= token_id < n}
    return Vocab("llama", "default", tokens, [int(t) for t in types], scores,
                 gguf.SpecialVocab(folder, n_vocab=n), defaults)


def _pre_tokenizer_name(tokenizer: dict, model_type: str) -> str:
    """tokenizer.ggml.pre for a byte-level BPE tokenizer.json."""
    pre = tokenizer.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    regexes = [s.get("pattern", {}).get("Regex") for s in steps if s.get("type") == "Split"]
    kinds = [s.get("type") for s in steps]
    if LLAMA3_REGEX in regexes:
        return "llama-bpe"
    if QWEN2_REGEX in regexes:
        return "qwen2"
    byte_level = [s for s in steps if s.get("type") == "ByteLevel"]
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") \
            and byte_level[0].get("use_regex", True):
        return "smollm"
    if kinds == ["ByteLevel"] and byte_level[0].get("use_regex", True):
        return "gpt-2"  # llama.cpp's spelling; it refuses "gpt2"
    if model_type in ("qwen2", "qwen3"):
        return "qwen2"
    return "default"


def _token_table(by_id: dict[int, str], n: int, spell: Callable[[int, str], tuple[str, TokenType]]
                 ) -> tuple[list[bytes], list[int]]:
    """The token list and token types of ids 0..n-1: spell(id, text) gives a known token's text
    as stored and its type; an id the tokenizer lacks is llama.cpp's "[PAD<id>]", unused."""
    tokens: list[bytes] = []
    types: list[int] = []
    for i in range(n):
        text = by_id.get(i)
        text, kind = (f"[PAD{i}]", TokenType.UNUSED) if text is None else spell(i, text)
        tokens.append(text.encode("utf-8"))
        types.append(int(kind))
    return tokens, types


def _bpe_vocab(path: Path, n_vocab: int | None, folder: Path, model_type: str) -> Vocab:
    """convert_hf_to_gguf.py's get_vocab_base + _set_vocab_gpt2, read from tokenizer.json."""
    tokenizer = _read_json(path)
    model = tokenizer.get("model") or {}
    if model.get("type") == "WordPiece":
        return _wordpiece_vocab(tokenizer, n_vocab, folder)
    if model.get("type") != "BPE":
        raise ConvertError(f"{path}: tokenizer model type {model.get('type')!r} is not supported "
                           f"(byte-level BPE, or SentencePiece via tokenizer.model)")
    pre = tokenizer.get("pre_tokenizer") or {}
    if "Metaspace" in json.dumps(pre) or model.get("byte_fallback"):
        raise ConvertError(f"{path}: a SentencePiece-style BPE tokenizer (Metaspace / "
                           f"byte_fallback) needs its tokenizer.model, which {folder} lacks")
    by_id: dict[int, str] = {i: t for t, i in model.get("vocab", {}).items()}
    added = {a["id"]: a for a in tokenizer.get("added_tokens", [])}
    for token_id, a in added.items():
        by_id[token_id] = a["content"]
    n = n_vocab or (max(by_id) + 1)
    if by_id and max(by_id) >= n:
        raise ConvertError(f"{path}: token id {max(by_id)} is past config.json's vocab_size {n}")

    def spell(token_id: int, text: str) -> tuple[str, TokenType]:
        if token_id not in added:
            return text, TokenType.NORMAL
        if added[token_id].get("special") or _looks_special(text):
            return text, TokenType.CONTROL
        return text.replace("\u2581", " "), TokenType.USER_DEFINED

    tokens, types = _token_table(by_id, n, spell)
    special = gguf.SpecialVocab(folder, load_merges=True)
    if not special.merges:
        raise ConvertError(f"{path}: BPE tokenizer without merges")
    return Vocab("gpt2", _pre_tokenizer_name(tokenizer, model_type), tokens, types, None, special)


def _wordpiece_vocab(tokenizer: dict, n_vocab: int | None, folder: Path) -> Vocab:
    """convert_hf_to_gguf.py's BertModel.set_vocab: the WordPiece vocabulary in llama.cpp's
    "phantom space" spelling — control tokens as they are, continuations with their "##"
    removed, word-initial pieces with a leading "\u2581"."""
    model = tokenizer["model"]
    by_id: dict[int, str] = {i: t for t, i in model.get("vocab", {}).items()}
    special = {a["id"] for a in tokenizer.get("added_tokens", []) if a.get("special")}
    n = n_vocab or (max(by_id) + 1)
    prefix = model.get("continuing_subword_prefix", "##")

    def spell(token_id: int, text: str) -> tuple[str, TokenType]:
        if token_id in special:
            return text, TokenType.CONTROL
        return (text[len(prefix):] if text.startswith(prefix) else "\u2581" + text), TokenType.NORMAL

    tokens, types = _token_table(by_id, n, spell)
    special_vocab = gguf.SpecialVocab(folder, n_vocab=n)
    # gguf-py writes no cls id any more: [CLS] opens every input as the BOS token (llama.cpp's
    # reading of BERT vocabularies).
    cls = special_vocab.special_token_ids.pop("cls", None)
    defaults = {"bos": cls} if cls is not None else {}
    return Vocab("bert", "default", tokens, types, None, special_vocab, defaults)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConvertError(f"{path}: cannot read JSON ({err})") from None


def load_vocab(folder: Path, n_vocab: int | None, model_type: str) -> Vocab:
    """The checkpoint's tokenizer: tokenizer.model first (as llama.cpp), else tokenizer.json."""
    if (folder / "tokenizer.model").is_file():
        return _sentencepiece_vocab(folder / "tokenizer.model", n_vocab, folder)
    if (folder / "tokenizer.json").is_file():
        return _bpe_vocab(folder / "tokenizer.json", n_vocab, folder, model_type)
    raise ConvertError(f"{folder}: no tokenizer.model or tokenizer.json; the GGUF file needs the "
                       f"tokenizer")
