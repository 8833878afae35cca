"""Byte-level BPE tokenizers (tokenizer.json) through the converter: tokens, types, merges,
special ids, chat template, the pre-tokenizer name, and ember's tokenizer on the result against
the `tokenizers` library that wrote them."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import tokenizers
import torch
import transformers

from ember import _core
from ember.convert import ConvertError, convert
from ember.convert.vocab import LLAMA3_REGEX, QWEN2_REGEX

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside.",
    "The year 2024 had 366 days; 12345 + 678 = 13023. Don't stop, we're here, they'll come!",
    "Héllo wörld, ünïcode façade — naïve café. 日本語のテキスト。 Ελληνικά. Русский текст.",
    "    indented code:\n\tdef f(x):\n\t\treturn x * 2  # comment\n\n\nmany   spaces",
] * 20
PROBES = [
    "Hello world! 12345 don't  stop\n\nnew line   spaces",
    "Lily's 3 cats ate 1234567 fish in 2024... Wow!!! (really?)",
    "naïve café — 日本語 テスト ünïcode\t\ttabs\r\nCRLF",
    "<|im_start|>user\nhi<|im_end|>",
]


def _pre_tokenizer(kind: str):
    pt = tokenizers.pre_tokenizers
    if kind == "gpt-2":
        return pt.ByteLevel(add_prefix_space=False, use_regex=True)
    if kind == "smollm":
        return pt.Sequence([pt.Digits(individual_digits=True),
                            pt.ByteLevel(add_prefix_space=False, use_regex=True)])
    regex = {"qwen2": QWEN2_REGEX, "llama-bpe": LLAMA3_REGEX}[kind]
    return pt.Sequence([pt.Split(tokenizers.Regex(regex), behavior="isolated", invert=False),
                        pt.ByteLevel(add_prefix_space=False, use_regex=False)])


def _make_folder(folder: Path, kind: str, n_pad: int = 4) -> tuple[Path, object]:
    """A tiny Qwen2 checkpoint whose tokenizer.json is a byte-level BPE trained here."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = _pre_tokenizer(kind)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=420, special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
        "add_bos_token": False, "chat_template": TEMPLATE}))
    n_vocab = tok.get_vocab_size() + n_pad  # a padded embedding, as real models have
    config = transformers.Qwen2Config(vocab_size=n_vocab, hidden_size=64, intermediate_size=96,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(folder)
    return folder, tok


@pytest.mark.parametrize("kind", ["gpt-2", "smollm", "qwen2", "llama-bpe"])
def test_bpe_vocabulary(kind: str, tmp_path: Path) -> None:
    folder, tok = _make_folder(tmp_path / "hf", kind)
    out = tmp_path / "m.gguf"
    convert(folder, out, "f32", progress=False)
    r = gguf.GGUFReader(out)

    def field(key: str):
        return r.fields[key].contents() if key in r.fields else None

    vocab = tok.get_vocab()
    n_real = len(vocab)
    tokens = field("tokenizer.ggml.tokens")
    assert field("tokenizer.ggml.model") == "gpt2"
    assert field("tokenizer.ggml.pre") == kind
    assert len(tokens) == n_real + 4
    assert tokens[:n_real] == sorted(vocab, key=vocab.get)
    assert tokens[n_real:] == [f"[PAD{i}]" for i in range(n_real, n_real + 4)]
    types = field("tokenizer.ggml.token_type")
    special_ids = {vocab[s] for s in SPECIAL}
    for i, t in enumerate(types):
        want = (gguf.TokenType.CONTROL if i in special_ids else gguf.TokenType.UNUSED
                if i >= n_real else gguf.TokenType.NORMAL)
        assert t == want, (i, tokens[i])
    merges = json.loads((folder / "tokenizer.json").read_text())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    assert field("tokenizer.ggml.merges") == merges
    assert field("tokenizer.ggml.eos_token_id") == vocab["<|im_end|>"]
    assert field("tokenizer.ggml.padding_token_id") == vocab["<|endoftext|>"]
    assert field("tokenizer.ggml.add_bos_token") is False
    assert field("tokenizer.chat_template") == TEMPLATE
    assert "tokenizer.ggml.scores" not in r.fields

    ours = _core.Tokenizer(str(out))
    assert ours.model == "gpt2" and ours.pre == kind
    for text in PROBES:
        assert ours.encode(text, add_special=False, parse_special=True) == tok.encode(text).ids, text
        assert ours.decode(tok.encode(text).ids, skip_special=False) == text


def test_tokenizer_json_that_needs_tokenizer_model(tmp_path: Path) -> None:
    folder, _ = _make_folder(tmp_path / "hf", "gpt-2")
    data = json.loads((folder / "tokenizer.json").read_text())
    data["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581"}
    (folder / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ConvertError, match="SentencePiece-style BPE .* needs its tokenizer.model"):
        convert(folder, tmp_path / "m.gguf", "f32")


def test_unknown_pre_tokenizer_falls_back_by_model_type(tmp_path: Path) -> None:
    folder, _ = _make_folder(tmp_path / "hf", "gpt-2")
    data = json.loads((folder / "tokenizer.json").read_text())
    data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\s+|\w+"}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}
    (folder / "tokenizer.json").write_text(json.dumps(data))
    convert(folder, tmp_path / "m.gguf", "f32", progress=False)
    r = gguf.GGUFReader(tmp_path / "m.gguf")
    assert r.fields["tokenizer.ggml.pre"].contents() == "qwen2"  # config.json model_type qwen2
