"""Split GGUFs (llama.cpp's gguf-split shards, PREFIX-0000i-of-0000n.gguf): any shard opens the
whole model, which computes exactly what the single file does; broken sets fail with one clear
message naming the file.

The shards come from gguf_builder.split_gguf, which writes what `llama-gguf-split --split
--split-max-tensors N` writes byte for byte (checked on stories260K and SmolLM2 Q4_1 against the
tool built from llama.cpp; llama.cpp's llama-simple also gives the single file's text from them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf_builder import STRING, U32, Tensor, split_gguf, write_split

from ember import _core

SPLIT_KEYS = {"split.no", "split.count", "split.tensors.count"}


@pytest.fixture(scope="module")
def stories_shards(stories_path: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return split_gguf(stories_path, tmp_path_factory.mktemp("split") / "stories", 20)


def greedy(path: Path, prompt: str, n: int) -> tuple[list[int], np.ndarray]:
    """Greedy ids after `prompt`, and the logits of the prompt's last position."""
    tok, model = _core.Tokenizer(str(path)), _core.Model(str(path), n_threads=2)
    ids = list(tok.encode(prompt, add_special=True))
    logits = model.eval_last(ids)
    first = np.array(logits, copy=True)
    for _ in range(n):
        ids.append(int(np.argmax(logits)))
        logits = model.eval_last([ids[-1]], reset=False)
    return ids, first


def test_any_shard_opens_the_whole_model(stories_path: Path, stories_shards: list[Path]) -> None:
    single = _core.GGUFFile(str(stories_path))
    assert [p.name for p in stories_shards] == [f"stories-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for shard in stories_shards:
        f = _core.GGUFFile(str(shard))
        assert f.path == str(stories_shards[0])
        assert f.shard_paths == [str(p) for p in stories_shards]
        assert f.file_bytes == sum(p.stat().st_size for p in stories_shards)
        md = f.metadata
        assert {k: md[k] for k in SPLIT_KEYS} == {"split.no": 0, "split.count": 3, "split.tensors.count": 48}
        assert {k: v for k, v in md.items() if k not in SPLIT_KEYS} == single.metadata
        assert [t.name for t in f.tensors] == [t.name for t in single.tensors]
        assert [t.shard for t in f.tensors] == [0] * 20 + [1] * 20 + [2] * 8
        for t in f.tensors:
            assert np.array_equal(f.raw(t.name), single.raw(t.name)), t.name


def test_split_model_computes_what_the_single_file_does(stories_path: Path,
                                                        stories_shards: list[Path]) -> None:
    ids, logits = greedy(stories_path, "Once upon a time", 24)
    for shard in (stories_shards[0], stories_shards[2]):
        got_ids, got_logits = greedy(shard, "Once upon a time", 24)
        assert got_ids == ids
        assert np.array_equal(got_logits, logits)  # the same bytes through the same kernels


def test_split_quantized_model(smollm2_path: Path, tmp_path: Path) -> None:
    """SmolLM2 Q4_1 (Q4_1, Q6_K, F32 tensors) in 3 shards: the same greedy text."""
    shards = split_gguf(smollm2_path, tmp_path / "smollm2", 100)
    assert len(shards) == 3
    ids, logits = greedy(smollm2_path, "The capital of France is", 8)
    got_ids, got_logits = greedy(shards[1], "The capital of France is", 8)
    assert got_ids == ids
    assert np.array_equal(got_logits, logits)


# --- broken sets ---------------------------------------------------------------------------------


def write_shards(prefix: Path, groups: list[list[Tensor]], **counts: int) -> list[Path]:
    """A little model in shards: its metadata in the first, `groups` of tensors."""
    kv = [("general.architecture", STRING, "llama"), ("general.alignment", U32, 32)]
    return write_split(prefix, kv, groups, **counts)


def tensors(names: str) -> list[Tensor]:
    return [Tensor(n, [8], 0, np.full(8, i, dtype=np.float32).tobytes()) for i, n in enumerate(names)]


def open_error(path: Path) -> str:
    with pytest.raises(ValueError) as err:
        _core.GGUFFile(str(path))
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_missing_shard_is_named(tmp_path: Path) -> None:
    paths = write_shards(tmp_path / "m", [tensors("ab"), tensors("cd"), tensors("e")])
    paths[2].unlink()
    for shard in paths[:2]:
        assert open_error(shard) == (f"[gguf] {paths[0]}: shard 3 of 3 of this split model is missing "
                                     f"(expected {paths[2]})")
    paths[0].unlink()
    assert open_error(paths[1]) == (f"[gguf] {paths[1]}: shard 2 of 3 of a split model; its first shard is "
                                    f"missing (expected {paths[0]})")


def test_a_shard_of_another_model_or_a_wrong_count_is_refused(tmp_path: Path) -> None:
    ours = write_shards(tmp_path / "m", [tensors("ab"), tensors("cd")])
    theirs = write_shards(tmp_path / "t", [tensors("pq"), tensors("r")])  # 3 tensors in all
    ours[1].write_bytes(theirs[1].read_bytes())
    assert open_error(ours[0]) == (
        f"[gguf] {ours[1]}: split.no 1, split.count 2, split.tensors.count 3; expected 1, 2, 4 as shard 2 "
        f"of {ours[0]} (a shard of another model, or a wrong count?)")
    # the same counts, but not the missing tensors: two shards hold 'b'
    ours[1].write_bytes(write_shards(tmp_path / "d", [tensors("ab"), tensors("bx")])[1].read_bytes())
    assert open_error(ours[0]) == f"[gguf] {ours[1]}: tensor 'b' is also in shard 1 of {ours[0]}"


def test_wrong_counts_are_refused(tmp_path: Path) -> None:
    paths = write_shards(tmp_path / "m", [tensors("ab"), tensors("c")], n_tensors=5)
    assert open_error(paths[0]) == (f"[gguf] {paths[0]}: the 2 shards of this split model hold 3 tensors, "
                                    "but split.tensors.count is 5")
    # split.count 3 in a set named -of-00002: the third shard's name is not one of theirs
    paths = write_shards(tmp_path / "c", [tensors("ab"), tensors("c")], count=3)
    assert open_error(paths[1]) == (
        f"[gguf] {paths[1]}: shard 2 of a model split into 3 files (split.no = 1), but its name does not "
        "end in '-00002-of-00003.gguf', so the other shards cannot be found")
    renamed = tmp_path / "renamed.gguf"
    paths[0].rename(renamed)
    assert open_error(renamed) == (
        f"[gguf] {renamed}: shard 1 of a model split into 3 files (split.no = 0), but its name does not "
        "end in '-00001-of-00003.gguf', so the other shards cannot be found")


def test_run_on_a_broken_split_is_one_line(tmp_path: Path, stories_shards: list[Path]) -> None:
    for shard in stories_shards[:2]:
        (tmp_path / shard.name).write_bytes(shard.read_bytes())
    first = tmp_path / stories_shards[0].name
    proc = subprocess.run([sys.executable, "-m", "ember.cli", "run", str(first), "-p", "x", "-n", "2"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: [gguf] {first}: shard 3 of 3 of this split model is missing "
        f"(expected {tmp_path / stories_shards[2].name})"]


def test_info_shows_the_whole_model(stories_shards: list[Path]) -> None:
    proc = subprocess.run([sys.executable, "-m", "ember.cli", "info", str(stories_shards[1])],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["file", str(stories_shards[1])]
    assert lines[1].split() == ["split", "into", "3", "files:", *(f"{p.name}," for p in stories_shards[:2]),
                                stories_shards[2].name]
    assert "tensors           48" in lines
