#!/usr/bin/env python3
"""Writes tests/data/pre_tokenizers/llama.cpp.json.xz: what llama.cpp makes of every text of
tests/data/pre_tokenizers/inputs.inp under every tokenizer.ggml.pre name ember knows.

- "ids": each name is set into a copy of the Qwen2 vocabulary (tests/data/vocab/
  ggml-vocab-qwen2.gguf.xz: byte-level BPE, 151k tokens) and the texts are tokenized by
  llama.cpp's vocabulary code (llama_tokenize, add_special and parse_special off).
- "splits": the words llama.cpp's pre-tokenizer cuts each text into (byte lengths), from its
  exported unicode_regex_split() called with the regex list src/llama-vocab.cpp gives that
  name's group; this sees every difference in splitting, which the ids can hide.
- "llama_cpp_aborts": names llama.cpp knows whose tokenizer aborts on this vocabulary ("whitespace"
  under tokenizer.ggml.model "gpt2" asserts that no BPE word holds a space); only their splits
  are recorded.

Both come from small programs built against the llama.cpp checkout. Names that give the same
result on every text are stored as one group; names llama.cpp does not know are listed apart.

Usage: python scripts/gen_pre_tokenizer_vectors.py [--llama-cpp ~/.cache/ember-peer/llama.cpp]
       (run from the repository root with ember built: PYTHONPATH=build/dev/pkg)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from gguf_builder import replace_string  # noqa: E402

import ember._core as core  # noqa: E402

DATA = ROOT / "tests/data/pre_tokenizers"

PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"
static void quiet(enum ggml_log_level l, const char * t, void * u) { (void)l; (void)t; (void)u; }
int main(int argc, char ** argv) {
    llama_log_set(quiet, NULL);
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 3;
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    const int add_special = argc > 3 && atoi(argv[3]);  /* optional third argument */
    FILE * f = fopen(argv[2], "rb");
    fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
    char * buf = malloc(n + 1); if (fread(buf, 1, n, f) != (size_t)n) return 4; buf[n] = 0;
    const char * sep = "\n__ggml_vocab_test__\n";
    int32_t * toks = malloc(sizeof(int32_t) * 1000000);
    for (char * p = buf, * q; (q = strstr(p, sep)); p = q + strlen(sep)) {
        int k = llama_tokenize(vocab, p, (int)(q - p), toks, 1000000, add_special, false);
        for (int i = 0; i < k; ++i) printf(i ? " %d" : "%d", toks[i]);
        printf("\n");
    }
    return 0;
}
"""


SPLIT_PROGRAM = r"""
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
std::vector<std::string> unicode_regex_split(const std::string & text,
                                             const std::vector<std::string> & regex_exprs, bool byte_encode);
static std::vector<std::string> parts(const char * path, const std::string & sep) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss; ss << f.rdbuf();
    std::string all = ss.str();
    std::vector<std::string> out;
    for (size_t p = 0, q; (q = all.find(sep, p)) != std::string::npos; p = q + sep.size())
        out.push_back(all.substr(p, q - p));
    return out;
}
int main(int argc, char ** argv) {
    const std::string sep = "\n__ggml_vocab_test__\n";
    const std::vector<std::string> regexes = parts(argv[1], sep), texts = parts(argv[2], sep);
    for (const std::string & text : texts) {
        // llama_tokenize never splits an empty text (and the AFMoE splitter fails on one)
        const std::vector<std::string> words =
            text.empty() ? std::vector<std::string>{} : unicode_regex_split(text, regexes, false);
        for (size_t i = 0; i < words.size(); ++i) std::printf(i ? " %zu" : "%zu", words[i].size());
        std::printf("\n");
    }
}
"""


def build_program(llama_cpp: Path, work: Path, source: str, name: str, compiler: str) -> Path:
    src, exe = work / name, work / name.split(".")[0]
    src.write_text(source)
    lib = llama_cpp / "build/bin"
    subprocess.run(
        [compiler, "-O1", "-o", exe, src, f"-I{llama_cpp}/include", f"-I{llama_cpp}/ggml/include",
         f"-L{lib}", "-lllama", f"-Wl,-rpath,{lib}"],
        check=True,
    )
    return exe


def c_string(literal: str) -> str:
    """The value of a C string literal's body."""
    escapes = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "'": "'"}
    return re.sub(r"\\(.)", lambda m: escapes[m.group(1)], literal)


def llama_cpp_names(llama_cpp: Path) -> dict[str, tuple[str, dict[str, bool]]]:
    """tokenizer.ggml.pre name -> (llama.cpp's pre-tokenizer type, the defaults it sets true)."""
    src = (llama_cpp / "src/llama-vocab.cpp").read_text(encoding="utf-8")
    chain = src[src.index('tokenizer_pre == "default"') :]
    chain = chain[: chain.index("unknown pre-tokenizer type")]
    names = {"default": ("DEFAULT", {})}
    for block in re.split(r"\}\s*else if\s*\(", chain):
        m = re.search(r"pre_type = LLAMA_VOCAB_PRE_TYPE_(\w+);", block)
        flags = {f: f"{f} = true;" in block for f in ("ignore_merges", "add_bos", "add_sep")}
        for name in re.findall(r'tokenizer_pre == "([^"]+)"', block):
            if m:
                names.setdefault(name, (m.group(1), {f: v for f, v in flags.items() if v}))
    return names


def llama_cpp_regexes(llama_cpp: Path) -> dict[str, list[str]]:
    """tokenizer.ggml.pre name -> the regex list llama-vocab.cpp gives its group."""
    src = (llama_cpp / "src/llama-vocab.cpp").read_text(encoding="utf-8")
    body = src[src.index("llm_tokenizer_bpe(const llama_vocab & vocab) {") :]
    body = body[: body.index("std::vector<std::string> regex_exprs;")]
    by_type: dict[str, list[str]] = {}
    pending: list[str] = []
    for chunk in re.split(r"(case LLAMA_VOCAB_PRE_TYPE_\w+:|default:)", body)[1:]:
        if chunk.startswith(("case", "default")):
            is_case = chunk.startswith("case")
            pending.append(chunk[len("case LLAMA_VOCAB_PRE_TYPE_") : -1] if is_case else "DEFAULT")
            continue
        m = re.search(r"regex_exprs = \{(.*?)\n\s*\};", chunk, re.S)
        if not m:
            continue
        code = "\n".join(line for line in m.group(1).splitlines() if not line.strip().startswith("//"))
        code = re.sub(r"//[^\n\"]*$", "", code, flags=re.M)
        regexes = [c_string(lit) for lit in re.findall(r'"((?:[^"\\]|\\.)*)"', code)]
        for t in pending:
            by_type[t] = regexes
        pending = []
    return {name: by_type[t] for name, (t, _) in llama_cpp_names(llama_cpp).items()}


def llama_cpp_version(llama_cpp: Path) -> str:
    """The checkout's commit, or for a copied checkout the hashes of its tokenizer sources."""
    commit = subprocess.run(["git", "-C", llama_cpp, "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return commit or "unknown; sha256 " + ", ".join(
        f"{f}={hashlib.sha256((llama_cpp / f).read_bytes()).hexdigest()[:16]}"
        for f in ("src/llama-vocab.cpp", "src/unicode.cpp")
    )


def base_vocab() -> bytes:
    return lzma.decompress((ROOT / "tests/data/vocab/ggml-vocab-qwen2.gguf.xz").read_bytes())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", type=Path, default=Path.home() / ".cache/ember-peer/llama.cpp")
    args = ap.parse_args()
    commit = llama_cpp_version(args.llama_cpp)
    base = base_vocab()
    regexes = llama_cpp_regexes(args.llama_cpp)
    ids: dict[str, list[str]] = {}
    splits: dict[str, list[str]] = {}
    unknown, aborts = [], []
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        tokenize = build_program(args.llama_cpp, work, PROGRAM, "tok_vectors.c", "cc")
        split = build_program(args.llama_cpp, work, SPLIT_PROGRAM, "split_vectors.cpp", "c++")
        for name in core.pre_tokenizer_names():
            vocab = work / "vocab.gguf"
            vocab.write_bytes(replace_string(base, "tokenizer.ggml.pre", name))
            run = subprocess.run([tokenize, vocab, DATA / "inputs.inp"], capture_output=True, text=True)
            if name not in regexes:
                unknown.append(name)
                continue
            if run.returncode != 0:  # a known name whose tokenizer fails on this vocabulary
                aborts.append(name)
            else:
                ids.setdefault(run.stdout, []).append(name)
            regex_file = work / "regexes.txt"
            regex_file.write_bytes("".join(r + "\n__ggml_vocab_test__\n" for r in regexes[name]).encode())
            run = subprocess.run([split, regex_file, DATA / "inputs.inp"], capture_output=True, text=True)
            if run.returncode != 0:
                raise SystemExit(f"{name}: llama.cpp's splitter failed: {run.stderr.strip()}")
            splits.setdefault(run.stdout, []).append(name)

    def groups(results: dict[str, list[str]], key: str) -> list[dict]:
        return [
            {"names": names, key: [[int(x) for x in line.split()] for line in out.splitlines()]}
            for out, names in results.items()
        ]

    out = {
        "made_by": "scripts/gen_pre_tokenizer_vectors.py",
        "llama_cpp_commit": commit,
        "base_vocab": "ggml-vocab-qwen2.gguf",
        "unknown_to_llama_cpp": unknown,
        "llama_cpp_aborts": aborts,
        "llama_cpp_names": {name: flags for name, (_, flags) in llama_cpp_names(args.llama_cpp).items()},
        "ids": groups(ids, "ids"),
        "splits": groups(splits, "byte_lengths"),
    }
    text = json.dumps(out, ensure_ascii=False, separators=(",", ":"))
    (DATA / "llama.cpp.json.xz").write_bytes(lzma.compress(text.encode()))
    print(f"{len(ids)} id groups, {len(splits)} split groups, unknown to llama.cpp: {unknown}, "
          f"aborted: {aborts}")


if __name__ == "__main__":
    main()
