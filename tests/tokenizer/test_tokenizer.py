"""Tokenizers against references: llama.cpp's vocabulary test vectors (tests/data/vocab, made with
Hugging Face tokenizers), sentencepiece on stories260K, and Hugging Face `tokenizers` built from
the same GGUF data on random text. Plus round trips, special tokens, streaming and errors.
"""

from __future__ import annotations

import lzma
import random
import shutil
import threading
import time
import unicodedata
from pathlib import Path

import gguf
import pytest
import sentencepiece as spm
import tokenizers

import ember._core as core

DATA = Path(__file__).parent.parent / "data"
VOCAB_DIR = DATA / "vocab"
SEPARATOR = "\n__ggml_vocab_test__\n"

# name: tokenizer.ggml.model — every vocabulary of llama.cpp's tokenizer tests that ember has.
VOCABS = {
    "bert-bge": "bert",
    "deepseek-coder": "gpt2",
    "gpt-2": "gpt2",
    "llama-bpe": "gpt2",
    "llama-spm": "llama",
    "phi-3": "llama",
    "qwen2": "gpt2",
    "starcoder": "gpt2",
}
# Byte-level BPE and byte-fallback SentencePiece give back exactly the text they encoded.
LOSSLESS = [name for name in VOCABS if name != "bert-bge"]


@pytest.fixture(scope="session")
def vocab_path(tmp_path_factory):
    """Path of ggml-vocab-<name>.gguf; the two over 5 MB are stored xz-compressed."""
    unpacked = tmp_path_factory.mktemp("vocab")

    def get(name: str) -> Path:
        plain = VOCAB_DIR / f"ggml-vocab-{name}.gguf"
        if plain.exists():
            return plain
        target = unpacked / plain.name
        if not target.exists():
            with lzma.open(VOCAB_DIR / f"{plain.name}.xz") as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
        return target

    return get


@pytest.fixture(scope="session")
def tokenizer(vocab_path):
    cache: dict[str, core.Tokenizer] = {}

    def get(name: str) -> core.Tokenizer:
        if name not in cache:
            cache[name] = core.Tokenizer(str(vocab_path(name)))
        return cache[name]

    return get


def load_vectors(name: str) -> list[tuple[str, list[int]]]:
    """The .inp texts (each followed by the separator line) and the .out ids (one line each)."""
    inp = (VOCAB_DIR / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8")
    out = (VOCAB_DIR / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8")
    texts = inp.split(SEPARATOR)
    lines = out.split("\n")
    assert texts[-1] == "" and lines[-1] == "", "both files end with a terminator"
    texts, lines = texts[:-1], lines[:-1]
    assert len(texts) == len(lines)
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]


# --- llama.cpp's vectors -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VOCABS))
def test_vocab_vectors(tokenizer, name):
    """Every vector reproduces exactly. The .out files hold Hugging Face's
    encode(text, add_special_tokens=False): no BOS, and these texts hold no control tokens."""
    tok = tokenizer(name)
    assert tok.model == VOCABS[name]
    vectors = load_vectors(name)
    assert len(vectors) == 46
    failures = []
    for text, expected in vectors:
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != expected:
            failures.append(f"{text[:40]!r}: expected {expected[:20]}, got {got[:20]}")
    assert not failures, f"{len(failures)}/{len(vectors)} vectors differ:\n" + "\n".join(failures)


@pytest.mark.parametrize("name", LOSSLESS)
def test_round_trip(tokenizer, name):
    tok = tokenizer(name)
    for text, _ in load_vectors(name):
        assert tok.decode(tok.encode(text, add_special=False)) == text
        assert tok.decode(tok.encode(text, add_special=True)) == text  # BOS is skipped


def test_bert_decodes_normalized_text(tokenizer):
    tok = tokenizer("bert-bge")
    ids = tok.encode("Hello World, Ünïcödé!")
    assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP]
    assert tok.decode(ids) == "hello world , unicode !"


# --- special tokens and framing ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "bos", "eos", "eot", "add_bos", "hello", "empty"),
    [
        ("llama-spm", 1, 2, -1, True, [1, 15043, 3186], [1]),
        ("phi-3", 1, 32000, 32007, True, [1, 15043, 3186], [1]),
        ("llama-bpe", 128000, 128001, 128009, True, [128000, 9906, 1917], [128000]),
        ("qwen2", 151643, 151643, 151645, False, [9707, 1879], []),
        ("gpt-2", 50256, 50256, 50256, False, [15496, 995], []),
        ("starcoder", 0, 0, 0, False, [8302, 5810], []),
        ("deepseek-coder", 32013, 32014, 32014, True, [32013, 17535, 1835], [32013]),
        ("bert-bge", 101, -1, -1, True, [101, 7592, 2088, 102], [101, 102]),  # [CLS] ... [SEP]
    ],
)
def test_special_ids_and_bos(tokenizer, name, bos, eos, eot, add_bos, hello, empty):
    tok = tokenizer(name)
    assert (tok.bos, tok.eos, tok.eot, tok.add_bos) == (bos, eos, eot, add_bos)
    assert tok.encode("Hello world") == hello
    assert tok.encode("") == empty
    for token in (eos, eot):
        if token >= 0:
            assert tok.is_eog(token)
    assert not tok.is_eog(hello[-1])
    assert not tok.is_eog(-1) and not tok.is_eog(10**9)


def test_parse_special_qwen2(tokenizer):
    tok = tokenizer("qwen2")
    text = "<|im_start|>user\nhi there<|im_end|>\n"
    ids = tok.encode(text, add_special=False, parse_special=True)
    assert ids == [151644, 872, 198, 6023, 1052, 151645, 198]
    plain = tok.encode(text, add_special=False, parse_special=False)
    assert 151644 not in plain and 151645 not in plain
    assert plain[:6] == [27, 91, 318, 4906, 91, 29]  # "<", "|", "im", "_start", "|", ">"
    assert tok.decode(plain) == text
    assert tok.decode(ids) == "user\nhi there\n"
    assert tok.decode(ids, skip_special=False) == text
    assert tok.token_to_piece(151644) == b"<|im_start|>"
    assert tok.token_to_piece(151644, render_special=False) == b""


def test_parse_special_llama3(tokenizer):
    tok = tokenizer("llama-bpe")
    text = "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    ids = tok.encode(text, add_special=True, parse_special=True)
    assert ids == [128000, 128006, 882, 128007, 271, 13347, 128009]
    assert tok.is_eog(ids[-1])
    assert tok.decode(ids, skip_special=False) == "<|begin_of_text|>" + text


def test_user_defined_tokens_are_always_split(tokenizer):
    """deepseek-coder's added tokens (user-defined, e.g. 'õ') are cut out even without
    parse_special, as Hugging Face does with added tokens."""
    tok = tokenizer("deepseek-coder")
    assert tok.encode("aõb", add_special=False, parse_special=False)[1] == 32000
    assert tok.decode(tok.encode("aõb", add_special=False)) == "aõb"


def test_spm_space_prefix_after_special(tokenizer):
    """SentencePiece puts a space before the text and before the text after a special token."""
    tok = tokenizer("llama-spm")
    assert tok.encode("<s>Hello", add_special=False, parse_special=True) == [1, 15043]
    assert tok.encode("Hello</s>Hello", add_special=False, parse_special=True) == [15043, 2, 15043]


# --- decoding and streaming ----------------------------------------------------------------------


def test_spm_byte_fallback_emoji_streams_whole(tokenizer):
    tok = tokenizer("llama-spm")
    ids = tok.encode("😀", add_special=False)
    assert ids == [29871, 243, 162, 155, 131]  # "▁" then <0xF0> <0x9F> <0x98> <0x80>
    assert [tok.token_to_piece(i) for i in ids[1:]] == [b"\xf0", b"\x9f", b"\x98", b"\x80"]
    stream = core.StreamDecoder(tok)
    assert [stream.push(i) for i in ids] == [" ", "", "", "", "😀"]
    assert stream.flush() == ""


def test_bpe_stream_multibyte_across_tokens(tokenizer):
    tok = tokenizer("gpt-2")
    ids = tok.encode("🚀 x", add_special=False)
    assert ids == [8582, 248, 222, 2124]  # the rocket's 4 bytes span three tokens
    stream = core.StreamDecoder(tok)
    assert [stream.push(i) for i in ids] == ["", "", "🚀", " x"]


@pytest.mark.parametrize("name", ["gpt-2", "llama-bpe", "llama-spm", "qwen2"])
def test_stream_equals_decode(tokenizer, name):
    tok = tokenizer(name)
    for text, _ in load_vectors(name):
        ids = tok.encode(text, add_special=True)
        stream = core.StreamDecoder(tok)
        parts = [stream.push(i) for i in ids] + [stream.flush()]
        for part in parts:
            part.encode("utf-8")  # never a lone surrogate or broken sequence
        # SentencePiece's leading space is only dropped by decode(), not by the stream.
        prefix = " " if VOCABS[name] == "llama" and text else ""
        assert "".join(parts) == prefix + text


def test_stream_invalid_and_truncated_bytes(tokenizer):
    tok = tokenizer("llama-spm")

    def byte(b: int) -> int:  # llama-spm's <0x00>..<0xFF> are ids 3..258
        return 3 + b

    assert tok.token_to_piece(byte(0xFF)) == b"\xff"
    stream = core.StreamDecoder(tok)
    assert stream.push(byte(0xFF)) == "\ufffd"  # can never become valid: replaced at once
    assert stream.push(byte(0xE2)) == ""  # first byte of a 3-byte sequence: held
    assert stream.push(byte(0x82)) == ""
    assert stream.push(byte(ord("A"))) == "\ufffdA"  # interrupted: one U+FFFD for the held part
    assert stream.push(byte(0xF0)) == ""
    assert stream.flush() == "\ufffd"  # truncated at the end
    assert stream.flush() == ""
    # decode() follows Python's errors="replace" exactly.
    raw = b"\xe2\x82A\xff\xf0\x9f\x98\xed\xa0\x80\xc0\xaf"
    assert tok.decode([byte(b) for b in raw]) == raw.decode("utf-8", errors="replace")


def test_control_tokens_hidden_unless_asked(tokenizer):
    tok = tokenizer("llama-bpe")
    stream = core.StreamDecoder(tok)
    assert stream.push(128000) == ""
    shown = core.StreamDecoder(tok, skip_special=False)
    assert shown.push(128000) == "<|begin_of_text|>"


# --- sentencepiece and Hugging Face references ---------------------------------------------------


def random_texts(seed: int, n: int) -> list[str]:
    pieces = list("abcxyzABCXYZ0123456789 .,;:!?'\"-_()[]{}<>|$+=^~`@#%&*/\\\n\r\t") + [
        "'s", "'S", "'re", "'RE", "'ll", "  ", "   ", "\r\n", "\n\n", " \n", "\u00a0", "\u3000", "\u2003",
        "é", "e\u0301", "ß", "Ä", "ñ", "Ω", "Привет", "你好", "한국어", "日本語", "١٢٣", "Ⅻ", "½", "²",
        "😀", "👍🏽", "\u200d", "\ufeff", "…", "。", "，", "ก", "ា", "€", "°", "õ", "Á", "\u0301", "〄",
    ]  # fmt: skip
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 30))) for _ in range(n)]


def test_stories260k_matches_sentencepiece(stories_path, stories_hf_path):
    sp = spm.SentencePieceProcessor(model_file=str(stories_hf_path / "tokenizer.model"))
    tok = core.Tokenizer(str(stories_path))
    assert tok.n_vocab == 512 and tok.bos == 1 and tok.eos == 2
    assert tok.encode("Once upon a time") == [1, 403, 407, 261, 378]
    assert sp.encode("Once upon a time", add_bos=True) == [1, 403, 407, 261, 378]
    for text in random_texts(7, 500) + ["Once upon a time, there was a little girl named Lily."]:
        ids = tok.encode(text, add_special=False)
        assert ids == sp.encode(text), text
        assert tok.decode(ids) == sp.decode(ids), text


# The pre-tokenizer regexes of each BPE vocabulary, as Hugging Face runs them.
GPT2_RE = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_RE = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
HF_SPLITS = {
    "gpt-2": [GPT2_RE],
    "llama-bpe": [LLAMA3_RE],
    "qwen2": [LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")],
    "starcoder": [r"\p{N}", GPT2_RE],
    "smollm": [r"\p{N}", GPT2_RE],
    "deepseek-coder": [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
}


def hf_bpe_from_gguf(path: Path):
    """A Hugging Face tokenizer assembled from a GGUF's vocabulary, merges and pre-tokenizer."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

    meta = core.GGUFFile(str(path)).metadata
    tokens, types, pre = (
        meta["tokenizer.ggml.tokens"],
        meta["tokenizer.ggml.token_type"],
        meta["tokenizer.ggml.pre"],
    )
    merges = [
        (m[: m.index(" ", 1)], m[m.index(" ", 1) + 1 :]) for m in meta["tokenizer.ggml.merges"]
    ]
    hf = tokenizers.Tokenizer(
        models.BPE({t: i for i, t in enumerate(tokens)}, merges, ignore_merges=pre == "llama-bpe")
    )
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in HF_SPLITS[pre]]
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    hf.decoder = decoders.ByteLevel()
    user_defined = [AddedToken(tokens[i], normalized=False) for i, t in enumerate(types) if t == 4]
    if user_defined:
        hf.add_tokens(user_defined)
    return hf


@pytest.mark.parametrize("name", ["gpt-2", "llama-bpe", "qwen2", "starcoder", "deepseek-coder"])
def test_bpe_matches_hf_tokenizers_on_random_text(tokenizer, vocab_path, name):
    hf = hf_bpe_from_gguf(vocab_path(name))
    tok = tokenizer(name)
    for text in random_texts(11, 400):
        ids = tok.encode(text, add_special=False)
        assert ids == hf.encode(text, add_special_tokens=False).ids, repr(text)
        assert tok.decode(ids) == text


def test_wordpiece_matches_hf_tokenizers_on_random_text(tokenizer, vocab_path):
    from tokenizers import models, normalizers, pre_tokenizers

    vocab = {}
    for i, t in enumerate(
        core.GGUFFile(str(vocab_path("bert-bge"))).metadata["tokenizer.ggml.tokens"]
    ):
        # The GGUF spells word starts "▁x" and continuations "x"; Hugging Face: "x" and "##x".
        key = (
            t[1:]
            if t.startswith("\u2581")
            else t
            if t.startswith("[") and t.endswith("]")
            else "##" + t
        )
        vocab[key] = i
    hf = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    hf.normalizer = normalizers.BertNormalizer(lowercase=True)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok = tokenizer("bert-bge")
    for text in random_texts(13, 400) + ["İstanbul ǅ ﬁ ᾈ 각 ഔ \u0344", "x" * 120, "Straße ÉCOLE"]:
        assert (
            tok.encode(text, add_special=False) == hf.encode(text, add_special_tokens=False).ids
        ), repr(text)


def test_smollm2(smollm2_path):
    tok = core.Tokenizer(str(smollm2_path))
    assert (tok.model, tok.pre, tok.n_vocab) == ("gpt2", "smollm", 49152)
    assert (tok.bos, tok.eos, tok.eot, tok.add_bos) == (1, 2, 2, False)
    assert tok.is_eog(2) and tok.is_eog(0)  # <|im_end|> and <|endoftext|>
    chat = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(chat, add_special=True, parse_special=True)
    assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1
    assert tok.decode(ids, skip_special=False) == chat
    assert tok.encode("Paris", add_special=True) == tok.encode("Paris", add_special=False)  # no BOS
    hf = hf_bpe_from_gguf(smollm2_path)
    for text in random_texts(17, 300):
        assert (
            tok.encode(text, add_special=False) == hf.encode(text, add_special_tokens=False).ids
        ), repr(text)


# --- speed and threads ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama-bpe", "llama-spm", "qwen2"])
def test_long_text_is_fast(tokenizer, name):
    tok = tokenizer(name)
    base = (
        (VOCAB_DIR / f"ggml-vocab-{name}.gguf.inp")
        .read_text(encoding="utf-8")
        .replace(SEPARATOR, " ")
    )
    text = (base * (100_000 // len(base) + 1))[:100_000]
    for sample in (text, "1234567890" * 10_000, " " * 100_000):
        start = time.perf_counter()
        ids = tok.encode(sample, add_special=False)
        elapsed = time.perf_counter() - start
        assert elapsed < 1.0, f"{len(sample)} chars took {elapsed:.2f}s"
        assert tok.decode(ids) == sample


def test_encode_from_threads(tokenizer):
    tok = tokenizer("llama-bpe")
    text = (VOCAB_DIR / "ggml-vocab-llama-bpe.gguf.inp").read_text(encoding="utf-8") * 20
    expected = tok.encode(text)
    results: list[list[int]] = []

    def work():
        results.append(tok.encode(text))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 4


# --- errors --------------------------------------------------------------------------------------


def write_gguf(path: Path, kv: dict) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in kv.items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_array(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_no_tokenizer_metadata(tmp_path):
    path = write_gguf(tmp_path / "bare.gguf", {"general.name": "bare"})
    with pytest.raises(
        ValueError,
        match=r"bare\.gguf: no tokenizer in this file: metadata 'tokenizer\.ggml\.tokens'",
    ):
        core.Tokenizer(str(path))


def test_missing_file():
    with pytest.raises(ValueError, match="cannot open"):
        core.Tokenizer("/nonexistent/model.gguf")


@pytest.mark.parametrize(
    ("kv", "error", "message"),
    [
        (
            {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": ["a"]},
            NotImplementedError,
            r"tokenizer\.ggml\.model 't5' is not supported",
        ),
        (
            {
                "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.pre": "mystery",
                "tokenizer.ggml.tokens": ["a", "b", "ab"],
                "tokenizer.ggml.merges": ["a b"],
            },
            NotImplementedError,
            r"pre-tokenizer 'mystery'.*known: llama3",
        ),
        (
            {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"]},
            ValueError,
            r"'tokenizer\.ggml\.merges' is missing",
        ),
        (
            {
                "tokenizer.ggml.model": "llama",
                "tokenizer.ggml.tokens": ["a", "b"],
                "tokenizer.ggml.scores": [0.0],
            },
            ValueError,
            r"'tokenizer\.ggml\.scores' has 1 entries, expected one per token \(2\)",
        ),
        ({"tokenizer.ggml.tokens": ["a"]}, ValueError, r"'tokenizer\.ggml\.model' is missing"),
    ],
)
def test_bad_vocabularies(tmp_path, kv, error, message):
    path = write_gguf(tmp_path / "bad.gguf", kv)
    with pytest.raises(error, match=message):
        core.Tokenizer(str(path))


def test_token_id_out_of_range(tokenizer):
    tok = tokenizer("gpt-2")
    for bad in (-1, tok.n_vocab, 2**40):
        with pytest.raises(
            ValueError, match=rf"token id {bad} is out of range \(expected 0 <= id < 50257\)"
        ):
            tok.decode([15496, bad])
        with pytest.raises(ValueError, match="out of range"):
            tok.token_to_piece(bad)
        with pytest.raises(ValueError, match="out of range"):
            core.StreamDecoder(tok).push(bad)


def test_tiny_bpe_vocab_from_scratch(tmp_path):
    """A hand-made vocabulary: merges apply by rank, unknown pre-tokenizer names are not needed."""
    tokens = ["a", "b", "c", "ab", "abc", "Ġ"]
    path = write_gguf(
        tmp_path / "tiny.gguf",
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": "gpt-2",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": ["a b", "ab c"],
        },
    )
    tok = core.Tokenizer(str(path))
    assert tok.encode("abc ab", add_special=False) == [4, 5, 3]
    assert tok.decode([4, 5, 3]) == "abc ab"
    assert tok.bos == -1 and tok.eos == -1 and tok.eot == -1


# --- the generated Unicode tables ----------------------------------------------------------------


def test_unicode_tables_are_generated_from_this_unicode():
    """The committed table is the generator's output (checked when this Python has the same
    Unicode version the file was generated from)."""
    import importlib.util

    root = Path(__file__).parents[2]
    committed = (root / "cpp/tokenizer/unicode_tables.cpp").read_text(encoding="utf-8")
    if f"Unicode {unicodedata.unidata_version}." not in committed.splitlines()[1]:
        pytest.skip(
            f"tables are from another Unicode version than this Python's {unicodedata.unidata_version}"
        )
    spec = importlib.util.spec_from_file_location("gen", root / "scripts/gen_unicode_tables.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    regenerated = gen.render()
    # The first line names the Python version, which may differ.
    assert regenerated.splitlines()[1:] == committed.splitlines()[1:]
