"""`ember info` and `ember --help`, run as real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import numpy as np


def ember(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ember.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_help_lists_commands():
    result = ember("--help")
    assert result.returncode == 0
    for command in ("info", "pull"):
        assert command in result.stdout


def test_info_json_matches_gguf_py(stories_path):
    result = ember("info", str(stories_path), "--json")
    assert result.returncode == 0, result.stderr
    d = json.loads(result.stdout)
    ref = gguf.GGUFReader(stories_path)
    assert d["architecture"] == "llama"
    assert d["n_params"] == sum(int(np.prod(t.shape)) for t in ref.tensors)
    assert d["context_length"] == 2048 and d["n_layers"] == 5 and d["embedding_length"] == 64
    assert d["vocab_size"] == 512 and d["tokenizer_model"] == "llama"
    assert d["has_chat_template"] is False
    assert d["file_type"] == "F32 (guessed)"  # the file has no general.file_type
    assert d["tensor_types"] == {"f32": {"count": 48, "n_bytes": sum(int(t.n_bytes) for t in ref.tensors),
                                         "n_elements": d["n_params"]}}


def test_info_table(smollm2_path):
    result = ember("info", str(smollm2_path))
    assert result.returncode == 0, result.stderr
    lines = {line.split("  ")[0]: line.split("  ", 1)[1].strip()
             for line in result.stdout.splitlines() if "  " in line and not line.startswith(" ")}
    assert lines["architecture"] == "llama"
    assert lines["file type"] == "Q4_1"
    assert lines["parameters"] == "134.52M"
    assert lines["vocabulary"] == "49152"
    assert lines["context length"] == "8192"
    assert lines["tokenizer"] == "gpt2 / smollm"
    assert lines["chat template"] == "yes"
    type_rows = [line.split() for line in result.stdout.splitlines()
                 if line.startswith(("q4_1", "q8_0", "f32 "))]
    assert [(r[0], r[1]) for r in type_rows] == [("q4_1", "210"), ("q8_0", "1"), ("f32", "61")]


def test_info_bad_file_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    result = ember("info", str(bad))
    assert result.returncode == 1
    assert result.stderr.startswith("error: [gguf] ")
    assert str(bad) in result.stderr and "Traceback" not in result.stderr
    result = ember("info", str(tmp_path / "missing.gguf"))  # resolved like run's MODEL
    assert result.returncode == 1
    assert result.stderr == f"error: model file not found: {tmp_path / 'missing.gguf'}\n"
