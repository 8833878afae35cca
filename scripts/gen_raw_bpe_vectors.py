#!/usr/bin/env python3
"""Writes tests/data/pre_tokenizers/raw_bpe/: two small BPE vocabularies over raw UTF-8 (not
GPT-2's byte map), with <0xXX> byte-fallback tokens, and what llama.cpp makes of every text of
tests/data/pre_tokenizers/inputs.inp with them under the pre-tokenizers that need such a vocabulary.

- spm-bpe.gguf: SentencePiece-style, spaces spelled "▁" (the shape of Gemma 4, Granite Embedding
  311M and Sarvam MoE). Trained here with Hugging Face `tokenizers` on inputs.inp and
  ../design_excerpt.txt: normalizer Replace(" ", "▁"), words split at newline runs
  ([^\n]+|[\n]+, what llama.cpp's GEMMA4 pre-tokenizer does), 700 tokens, 120 characters at most
  (so CJK, emoji and most accents need the byte fallback).
- whitespace-bpe.gguf: words are the runs between whitespace (WhitespaceSplit, llama.cpp's
  "whitespace" \S+), same corpus and sizes.

Training is not deterministic from run to run (ties between equally frequent pairs), so the
vocabularies and the ids are always written together.

llama.cpp.json records, per variant (tokenizer.ggml.model, tokenizer.ggml.pre, vocabulary), the ids
llama.cpp's llama_tokenize gives each text, with add_special off and on (parse_special off).

Usage: python scripts/gen_raw_bpe_vectors.py [--llama-cpp ~/.cache/ember-peer/llama.cpp]
       (run from the repository root)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from gen_pre_tokenizer_vectors import PROGRAM, build_program, llama_cpp_version  # noqa: E402

DATA = ROOT / "tests/data/pre_tokenizers"
OUT = DATA / "raw_bpe"
SEPARATOR = "\n__ggml_vocab_test__\n"
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]  # ids 0..3; then the 256 byte tokens
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]

# (tokenizer.ggml.model, tokenizer.ggml.pre or None, vocabulary file). Not "whitespace" under
# "gpt2": llama.cpp asserts there that no BPE word holds a space, and aborts on "a  b".
VARIANTS = [
    ("gpt2", "gemma4", "spm-bpe.gguf"),
    ("gpt2", "granite-embed-multi-311m", "spm-bpe.gguf"),
    ("gpt2", "sarvam-moe", "spm-bpe.gguf"),
    ("gemma4", None, "spm-bpe.gguf"),
    ("whitespace", "whitespace", "whitespace-bpe.gguf"),
]



def corpus() -> list[str]:
    texts = (DATA / "inputs.inp").read_bytes().decode().split(SEPARATOR)[:-1]
    return texts + (ROOT / "tests/data/design_excerpt.txt").read_text().splitlines(keepends=True)


def train(spm_style: bool) -> tuple[list[str], list[str]]:
    """(tokens, merges) of a trained BPE, ids laid out as SPECIALS, BYTE_TOKENS, the rest."""
    tok = Tokenizer(models.BPE())
    if spm_style:
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated")
    else:
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=700, limit_alphabet=120, show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    state = json.loads(tok.to_str())["model"]
    trained = sorted(state["vocab"], key=state["vocab"].get)
    merges = [" ".join(m) if isinstance(m, list) else m for m in state["merges"]]
    return SPECIALS + BYTE_TOKENS + [t for t in trained if t not in SPECIALS + BYTE_TOKENS], merges


def write_vocab(path: Path, tokens: list[str], merges: list[str]) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(path.stem)
    # llama.cpp loads a vocabulary-only file only with its architecture's hyper-parameters.
    w.add_block_count(1)
    w.add_context_length(512)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    types = [gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.BYTE] * len(BYTE_TOKENS)
    w.add_token_types(types + [gguf.TokenType.NORMAL] * (len(tokens) - len(types)))
    w.add_token_merges(merges)
    w.add_bos_token_id(SPECIALS.index("<bos>"))
    w.add_eos_token_id(SPECIALS.index("<eos>"))
    w.add_unk_token_id(SPECIALS.index("<unk>"))
    w.add_pad_token_id(SPECIALS.index("<pad>"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def relabel(src: Path, dst: Path, model: str, pre: str | None) -> None:
    """A copy of `src` with another tokenizer.ggml.model and .pre (None: no pre key)."""
    reader = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "llama")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if key == "tokenizer.ggml.model":
            value = model
        elif key == "tokenizer.ggml.pre":
            if pre is None:
                continue
            value = pre
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, vtype, sub_type=sub_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", type=Path, default=Path.home() / ".cache/ember-peer/llama.cpp")
    args = ap.parse_args()
    commit = llama_cpp_version(args.llama_cpp)
    OUT.mkdir(exist_ok=True)
    write_vocab(OUT / "spm-bpe.gguf", *train(spm_style=True))
    write_vocab(OUT / "whitespace-bpe.gguf", *train(spm_style=False))
    variants = []
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        tokenize = build_program(args.llama_cpp, work, PROGRAM, "raw_vectors.c", "cc")
        for model, pre, vocab in VARIANTS:
            path = work / "vocab.gguf"
            relabel(OUT / vocab, path, model, pre)
            ids = {}
            for add_special in (0, 1):
                run = subprocess.run([tokenize, path, DATA / "inputs.inp", str(add_special)],
                                     capture_output=True, text=True, check=True)
                ids["ids_special" if add_special else "ids"] = [
                    [int(x) for x in line.split()] for line in run.stdout.splitlines()
                ]
            variants.append({"model": model, "pre": pre, "vocab": vocab, **ids})
    out = {"made_by": "scripts/gen_raw_bpe_vectors.py", "llama_cpp_commit": commit, "variants": variants}
    (OUT / "llama.cpp.json").write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"{len(variants)} variants written to {OUT}")


if __name__ == "__main__":
    main()
