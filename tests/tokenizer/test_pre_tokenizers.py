"""Every tokenizer.ggml.pre value llama.cpp knows, against two references.

- llama.cpp (tests/data/pre_tokenizers/llama.cpp.json.xz, made by
  scripts/gen_pre_tokenizer_vectors.py from llama.cpp's own code): the words its pre-tokenizer cuts
  each text of inputs.inp into, and its token ids with each name set into the Qwen2 vocabulary.
- the regexes themselves, as the models' tokenizer.json files spell them, run by Hugging Face
  `tokenizers` (Oniguruma) as a Sequence of Split(..., "isolated").

- for the names whose vocabularies are BPE over raw UTF-8 (gemma4, granite-embed-multi-311m,
  sarvam-moe, whitespace): llama.cpp's ids on two small vocabularies of that kind
  (tests/data/pre_tokenizers/raw_bpe, scripts/gen_raw_bpe_vectors.py), Hugging Face's BPE with
  byte fallback where it can state the rule, and decoding back to the text.

Where the two disagree, llama.cpp emulates a regex with std::regex over text in which every
non-ASCII letter counts as both cases and marks as no letter, or blanks non-ASCII whitespace out of
a range; ember follows the regex, and LLAMA_CPP_DIFFERS names each such text.
"""

from __future__ import annotations

import functools
import json
import lzma
import time
from pathlib import Path

import gguf
import pytest
import tokenizers
from gguf_builder import replace_string
from test_tokenizer import GPT2_RE, HF_SPLITS, LLAMA3_RE, random_texts, write_gguf
from tokenizers import Regex, pre_tokenizers

import ember._core as core

DATA = Path(__file__).parent.parent / "data"
SEPARATOR = "\n__ggml_vocab_test__\n"
TEXTS = (DATA / "pre_tokenizers/inputs.inp").read_bytes().decode().split(SEPARATOR)[:-1]  # keeps \r
LLAMA_CPP = json.loads(lzma.decompress((DATA / "pre_tokenizers/llama.cpp.json.xz").read_bytes()))

# Names whose vocabularies are BPE over raw UTF-8 rather than GPT-2's byte map ("▁" for spaces,
# <0xXX> byte tokens): besides the Qwen2 vocabulary, their ids are checked on vocabularies of
# that kind (RAW_BPE).
# llama-vocab.cpp turns BOS on for its GEMMA4 type even where the file says not ("workaround for
# Gemma 4"), which its per-name flags do not show.
FORCED_BOS = {"gemma4", "granite-embed-multi-311m"}
RAW_BPE = DATA / "pre_tokenizers/raw_bpe"

QWEN2_RE = LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")
O200K_RE = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
KIMI_WORD_U = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
KIMI_WORD_L = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
DEEPSEEK3_RE = (
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
    r"""| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
CJK_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
BLOOM_RE = r" ?[^(\s|.,!?…。，、।۔،)]+"
# llama.cpp's \p{AFMoE_digits} (numbers in threes from the right), as a regex.
DIGIT_GROUPS_RE = r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))"

# The regexes of each name's tokenizer.json (the originals llama-vocab.cpp quotes beside its
# adaptations), first name of each group.
HF_REGEXES = {
    "llama3": HF_SPLITS["llama-bpe"],
    "qwen2": [QWEN2_RE],
    "bailingmoe": [
        r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]"
        r"|\s+(?!\S)|\s+"
    ],
    "qwen35": [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    ],
    "ufakzeka": [r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "seed-coder": [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+"
    ],
    "minicpm5": [r"\p{N}{1,3}", LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}+")],
    "jais-2": [
        LLAMA3_RE.replace(
            r"\s+(?!\S)|\s+",
            r"\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)"
            r"|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",
        )
    ],
    "laguna": [r"[^\n]+|[\n]+", QWEN2_RE],
    "exaone-moe": [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"
    ],
    "gpt-2": [GPT2_RE],
    "starcoder": [r"\p{N}", GPT2_RE],
    "deepseek-coder": HF_SPLITS["deepseek-coder"],
    "deepseek-llm": [
        r"[\r\n]",
        "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",  # noqa: E501
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+$",
        "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
        r"\p{N}+",
    ],
    "deepseek-v3": [r"\p{N}{1,3}", CJK_KANA, DEEPSEEK3_RE],
    "spark2_5": [
        r"\p{N}{1,3}",
        CJK_KANA,
        r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
        r"""| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+""",
        r"\p{N}",
    ],
    "afmoe": [
        DIGIT_GROUPS_RE,
        "[\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af\u1100-\u11ff]+",  # noqa: E501
        DEEPSEEK3_RE,
    ],
    "youtu": [
        "[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",  # noqa: E501
        O200K_RE.replace(r"\p{N}{1,3}", r"\p{N}"),
    ],
    "gpt-4o": [O200K_RE],
    "granite-embed-multi-97m": [O200K_RE],
    "tiny_aya": [r"\d{1,3}(?=(?:\d{3})*\b)", O200K_RE],
    "tekken": [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ],
    "kimi-k2": [
        rf"[\p{{Han}}]+|[^\r\n\p{{L}}\p{{N}}]?{KIMI_WORD_U}*{KIMI_WORD_L}+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
        rf"|[^\r\n\p{{L}}\p{{N}}]?{KIMI_WORD_U}+{KIMI_WORD_L}*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
        r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ],
    "superbpe": [r"\p{N}+", r"(?=(\d{3})+(?!\d))"],
    "chameleon": [
        r"<sentinel:[0-9]+>",
        r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        r"([\t\n]|    |  )",
        r"\p{N}",
        r"[\p{P}!-/:-@\[-`{-~]",
        GPT2_RE,
    ],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", GPT2_RE, r"[0-9][0-9][0-9]"],
    "bloom": [BLOOM_RE],
    "viking": [BLOOM_RE, r"\p{N}"],
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2_RE, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "gemma4": [r"[^\n]+|[\n]+"],
    "whitespace": [r"\S+"],
}

# (first name of a llama.cpp split group, index into TEXTS): where llama.cpp's split is not the
# regex's. Each one is checked to differ from llama.cpp and to equal Hugging Face's.
LLAMA_CPP_DIFFERS = {
    # U+2003 and U+3000 lie in [一-龥ࠀ-一가-퟿]; llama.cpp blanks whitespace before std::wregex.
    "deepseek-llm": {72},
    "deepseek-coder": {72},
    # Non-ASCII letters count as both cases in llama.cpp ("ПриветМир" stays whole), and its
    # GPT4O/Tekken copies leave \p{M} out, so combining marks split Khmer, Devanagari, Tamil.
    "youtu": {46, 47},
    "gpt-4o": {21, 45, 47, 50, 51, 73},
    "granite-embed-multi-97m": {47},
    "tekken": {21, 45, 47, 50, 51, 73},
    # llama.cpp's Kimi K2 splitter has no case classes and takes only the ideograph blocks for Han.
    "kimi-k2": {21, 45, 46, 47, 50, 51, 73},
    # Tiny Aya's \d{1,3}(?=(?:\d{3})*\b) needs a word boundary after the digits ("工作1314151天"
    # has none); llama.cpp groups every digit run.
    "tiny_aya": {32, 45, 46, 47, 57, 70},
    # \d is ASCII for llama.cpp's std::wregex, Unicode Nd for the regex: "١٢٣٤٥" splits.
    "superbpe": {56},
}


@functools.cache
def hf_pre_tokenizer(regexes: tuple[str, ...]) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes])


def hf_split(regexes: list[str], text: str) -> list[str]:
    return [w for w, _ in hf_pre_tokenizer(tuple(regexes)).pre_tokenize_str(text) if w]


def llama_cpp_words(text: str, byte_lengths: list[int]) -> list[str]:
    """llama.cpp's words (its zero-width matches leave empty words, which encode to nothing)."""
    data, words, pos = text.encode(), [], 0
    for n in byte_lengths:
        if n:
            words.append(data[pos : pos + n].decode())
        pos += n
    assert pos == len(data)
    return words


def test_every_llama_cpp_name_is_known():
    names = core.pre_tokenizer_names()
    assert len(names) == len(set(names)), "a name in two rows"
    llama_cpp = set(LLAMA_CPP["llama_cpp_names"])
    assert len(llama_cpp) == 91
    assert llama_cpp <= set(names)
    assert set(names) - llama_cpp == {"gpt2"}  # what ember's converter once wrote for "gpt-2"
    covered = {n for g in LLAMA_CPP["splits"] for n in g["names"]}
    assert covered == llama_cpp
    # llama.cpp aborts on "whitespace" words that hold a space under tokenizer.ggml.model "gpt2"
    assert LLAMA_CPP["llama_cpp_aborts"] == ["whitespace"]


def test_unknown_name_fails_clearly():
    message = r"pre-tokenizer 'no-such-pre' is not supported; known: llama3, "
    with pytest.raises(NotImplementedError, match=message):
        core.pre_tokenize("no-such-pre", "x")


@pytest.mark.parametrize("group", LLAMA_CPP["splits"], ids=lambda g: g["names"][0])
def test_splits_match_llama_cpp(group):
    first = group["names"][0]
    differs = LLAMA_CPP_DIFFERS.get(first, set())
    for name in group["names"]:
        for i, (text, lengths) in enumerate(zip(TEXTS, group["byte_lengths"], strict=True)):
            got = core.pre_tokenize(name, text)
            assert "".join(got) == text
            if i in differs:
                assert got != llama_cpp_words(text, lengths), f"{name} #{i} now agrees with llama.cpp"
                assert got == hf_split(HF_REGEXES[first], text), f"{name} #{i} {text!r}"
            else:
                assert got == llama_cpp_words(text, lengths), f"{name} #{i} {text!r}"


@pytest.mark.parametrize("first", sorted(HF_REGEXES))
def test_splits_match_the_regexes(first):
    """Word for word what Hugging Face's Split makes of each regex, on the inputs and random text."""
    for text in TEXTS + random_texts(23, 300):
        assert core.pre_tokenize(first, text) == hf_split(HF_REGEXES[first], text), repr(text)


@pytest.fixture(scope="module")
def qwen2_vocab() -> bytes:
    return lzma.decompress((DATA / "vocab/ggml-vocab-qwen2.gguf.xz").read_bytes())


@pytest.mark.parametrize("group", LLAMA_CPP["ids"], ids=lambda g: g["names"][0])
def test_ids_match_llama_cpp(group, qwen2_vocab, tmp_path):
    """End to end through BPE, for the first name of each group of names llama.cpp gives the
    same ids (a 151k vocabulary loads in a fraction of a second; the splits test covers every name)."""
    name = group["names"][0]
    path = tmp_path / "vocab.gguf"
    path.write_bytes(replace_string(qwen2_vocab, "tokenizer.ggml.pre", name))
    tok = core.Tokenizer(str(path))
    differs = set().union(
        *(LLAMA_CPP_DIFFERS.get(g["names"][0], set()) for g in LLAMA_CPP["splits"] if name in g["names"])
    )
    for i, (text, expected) in enumerate(zip(TEXTS, group["ids"], strict=True)):
        if i not in differs:
            assert tok.encode(text, add_special=False) == expected, f"{name} #{i} {text!r}"


@pytest.mark.parametrize("name", sorted(LLAMA_CPP["llama_cpp_names"]))
def test_defaults_match_llama_cpp(tmp_path, name):
    """BOS and SEP by default, and whole-word tokens kept (ignore_merges), as llama-vocab.cpp sets
    them per name. "abc" is a token, but the only merge gives "a" + "bc"."""
    flags = LLAMA_CPP["llama_cpp_names"][name]
    tokens = ["a", "b", "c", "bc", "abc", "<s>", "</s>"]
    path = write_gguf(
        tmp_path / "tiny.gguf",
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": name,
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": ["b c"],
            "tokenizer.ggml.bos_token_id": 5,
            "tokenizer.ggml.seperator_token_id": 6,
        },
    )
    tok = core.Tokenizer(str(path))
    assert tok.add_bos == (flags.get("add_bos", False) or name in FORCED_BOS)
    body = [4] if flags.get("ignore_merges") else [0, 3]
    expected = [5] * tok.add_bos + body + [6] * flags.get("add_sep", False)
    assert tok.encode("abc", add_special=True) == expected


def test_long_runs_split_in_linear_time():
    """100k-code-point runs of what the regexes treat specially: a matcher that rescans a run from
    each of its positions takes seconds here (2.5-4 s measured before the digit splitters were made
    linear); the slowest name took 0.03 s of CPU, so 1 s leaves a wide margin for a slow machine."""
    n = 100_000
    samples = ["1" * n + "x", " " * n + "x", "A" * n + "!", "a" + "\u0301" * n, "中" * n]
    for name in sorted(HF_REGEXES):  # a name for each list of regexes
        for text in samples:
            start = time.process_time()
            words = core.pre_tokenize(name, text)
            elapsed = time.process_time() - start
            assert "".join(words) == text
            assert elapsed < 1.0, f"{name}: {text[:3]!r}... took {elapsed:.2f} s"


# --- BPE over raw UTF-8: gemma4, granite-embed-multi-311m, sarvam-moe, whitespace ----------------
# RAW_BPE holds two small vocabularies trained by scripts/gen_raw_bpe_vectors.py (SentencePiece-style
# with "▁" for spaces; words between whitespace) and llama.cpp's ids for each text of inputs.inp
# under each (tokenizer.ggml.model, tokenizer.ggml.pre) pair that needs one.
RAW_BPE_VECTORS = json.loads((RAW_BPE / "llama.cpp.json").read_text())["variants"]


def raw_bpe_tokenizer(tmp_path: Path, variant: dict) -> core.Tokenizer:
    data = (RAW_BPE / variant["vocab"]).read_bytes()
    data = replace_string(data, "tokenizer.ggml.model", variant["model"])
    # llama.cpp ran "gemma4" files without the key; the model implies the name, so "default" stays
    data = replace_string(data, "tokenizer.ggml.pre", variant["pre"] or "default")
    path = tmp_path / "vocab.gguf"
    path.write_bytes(data)
    return core.Tokenizer(str(path))


def variant_id(v: dict) -> str:
    return f"{v['model']}-{v['pre']}"


def hf_raw_bpe(variant: dict) -> tokenizers.Tokenizer:
    """The same vocabulary and rule in Hugging Face `tokenizers`: BPE with byte fallback, spaces
    replaced by "▁" and words cut at newline runs, or words cut at whitespace."""
    reader = gguf.GGUFReader(str(RAW_BPE / variant["vocab"]))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    merges = [tuple(m.split(" ", 1)) for m in reader.fields["tokenizer.ggml.merges"].contents()]
    tok = tokenizers.Tokenizer(
        tokenizers.models.BPE({t: i for i, t in enumerate(tokens)}, merges, byte_fallback=True)
    )
    if variant["pre"] == "whitespace":
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    else:
        tok.normalizer = tokenizers.normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated")
    return tok


@pytest.mark.parametrize("variant", RAW_BPE_VECTORS, ids=variant_id)
def test_raw_bpe_ids_match_llama_cpp(tmp_path, variant):
    tok = raw_bpe_tokenizer(tmp_path, variant)
    for i, text in enumerate(TEXTS):
        assert tok.encode(text, add_special=False) == variant["ids"][i], f"#{i} {text!r}"
        assert tok.encode(text, add_special=True) == variant["ids_special"][i], f"#{i} {text!r}"
    byte_tokens = [t for ids in variant["ids"] for t in ids if 4 <= t < 260]
    assert len(byte_tokens) > 100  # the vectors exercise the <0xXX> fallback


HF_STATES = [v for v in RAW_BPE_VECTORS if v["pre"] in ("sarvam-moe", "whitespace")]


@pytest.mark.parametrize("variant", HF_STATES, ids=variant_id)  # one per vocabulary
def test_raw_bpe_matches_hugging_face(tmp_path, variant):
    """Where Hugging Face can state the rule, it gives the same ids, also on random texts. (Gemma 4
    differs from Sarvam only in its whole newline words and BOS, test_raw_bpe_rules.)"""
    tok, hf = raw_bpe_tokenizer(tmp_path, variant), hf_raw_bpe(variant)
    for text in TEXTS + random_texts(29, 300):
        expected = hf.encode(text, add_special_tokens=False).ids
        assert tok.encode(text, add_special=False) == expected, repr(text)


@pytest.mark.parametrize("variant", RAW_BPE_VECTORS, ids=variant_id)
def test_raw_bpe_decodes_back(tmp_path, variant):
    """decode and the stream give the text back (the vocabularies have all 256 byte tokens);
    "whitespace" drops the whitespace between words."""
    tok = raw_bpe_tokenizer(tmp_path, variant)
    split = pre_tokenizers.WhitespaceSplit()
    for text in TEXTS + random_texts(31, 200):
        ids = tok.encode(text, add_special=True)
        kept = "".join(w for w, _ in split.pre_tokenize_str(text)) if variant["pre"] == "whitespace" else text
        assert tok.decode(ids) == kept, repr(text)
        stream = core.StreamDecoder(tok)
        assert "".join(stream.push(i) for i in ids) + stream.flush() == kept, repr(text)


# (model, pre, text, add_special) -> ids, as llama.cpp's llama_tokenize gives them for the
# vocabulary of test_raw_bpe_rules (checked with llama.cpp at the commit llama.cpp.json names).
RAW_BPE_RULES = [
    # Gemma 4 keeps a word of newlines whole when it is a token, and adds BOS though the file says not
    ("gpt2", "gemma4", "a\n\na a", False, [4, 3, 4, 6]),
    ("gpt2", "gemma4", "a\n\na a", True, [0, 4, 3, 4, 6]),
    ("gpt2", "granite-embed-multi-311m", "a\n\na a", True, [0, 4, 3, 4, 6]),
    ("gemma4", "default", "a\n\na a", True, [0, 4, 3, 4, 6]),
    # Sarvam merges it (there is no "\n \n" merge) and honours add_bos_token = false
    ("gpt2", "sarvam-moe", "a\n\na a", True, [4, 2, 2, 4, 6]),
    # "▁▁a": "▁" + "▁a"; "\t" has neither a token nor a byte token, so it is dropped
    ("gpt2", "gemma4", " a\n\n\nb\tA  a", False, [6, 2, 2, 2, 9, 10, 5, 6]),
    ("gpt2", "sarvam-moe", " a\n\n\nb\tA  a", False, [6, 2, 2, 2, 9, 10, 5, 6]),
    # "whitespace" drops all whitespace (U+3000 too) and lower-cases with normalizer.lowercase
    ("whitespace", "whitespace", " a\n\n\nb\tA  a", True, [4, 9, 10, 4]),
    ("whitespace-lowercase", "whitespace", "A b\u3000\u00c4", True, [4, 9, 11]),
]


RULES_TOKENS = ["<bos>", "<eos>", "\n", "\n\n", "a", "▁", "▁a", "<0x20>", "<0x0A>", "b", "A", "ä"]


@pytest.mark.parametrize("model, pre, text, add_special, expected", RAW_BPE_RULES)
def test_raw_bpe_rules(tmp_path, model, pre, text, add_special, expected):
    kv = {
        "tokenizer.ggml.model": model.removesuffix("-lowercase"),
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": RULES_TOKENS,
        "tokenizer.ggml.token_type": [3, 3, 1, 1, 1, 1, 1, 6, 6, 1, 1, 1],
        "tokenizer.ggml.merges": ["\u2581 a"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.add_bos_token": False,
    }
    if model.endswith("-lowercase"):
        kv["tokenizer.ggml.normalizer.lowercase"] = True
    tok = core.Tokenizer(str(write_gguf(tmp_path / "rules.gguf", kv)))
    assert tok.encode(text, add_special=add_special) == expected


def test_gemma4_turn_tokens_end_generation(tmp_path):
    """llama.cpp ends generation on Gemma 4's <eos>, <turn|> and <|tool_response>, whatever their
    type in the file (its convert marks <|tool_response> user-defined so that it prints)."""
    kv = {
        "tokenizer.ggml.model": "gemma4",
        "tokenizer.ggml.tokens": ["<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|tool_response>", "a"],
        "tokenizer.ggml.token_type": [3, 3, 3, 3, 3, 4, 1],
        "tokenizer.ggml.merges": ["a a"],
        "tokenizer.ggml.bos_token_id": 2,
    }
    tok = core.Tokenizer(str(write_gguf(tmp_path / "gemma4.gguf", kv)))
    assert [tok.is_eog(i) for i in range(7)] == [False, True, False, False, True, True, False]
    assert tok.encode("a<turn|>", add_special=True, parse_special=True) == [2, 6, 4]
