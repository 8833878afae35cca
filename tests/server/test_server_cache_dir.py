"""The prefix cache's disk tier (--cache-dir) and slot files (--slot-save-path) through a real
`ember serve` process: a restarted server serves a long prompt it saw before from its cache
files (the same tokens at temperature 0, reported as cached), ignores — with a warning in its
log — cache files that are corrupt, truncated or another model's, keeps the directory within
--cache-disk-size, and saves and restores a slot's prompt state with llama-server's
/slots/{id}?action=save|restore|erase. LLM.save_state / load_state take the same files."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from server_support import serve_process

from ember.llm import LLM

# 40 blocks of 16 tokens and 5 more: what the tiny model (stories260K, 2048 context) prefills.
PROMPT = [(i * 37) % 500 + 3 for i in range(645)]
SERVE_ARGS = ["--device", "cpu", "--threads", "1", "--parallel", "1", "--ctx-size", "1024"]


def complete(url: str, prompt: list[int]) -> dict:
    response = httpx.post(url + "/completion", json={
        "prompt": prompt, "n_predict": 6, "temperature": 0, "return_tokens": True,
        "cache_prompt": True}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def block_files(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.kvb"))


def test_a_restarted_server_serves_a_long_prompt_from_its_cache_dir(
        stories_path: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    args = [*SERVE_ARGS, "--cache-dir", str(cache)]
    with serve_process(stories_path, args, tmp_path) as (url, _):
        cold = complete(url, PROMPT)
    assert cold["tokens_cached"] == 0
    # Every full block of the prompt (40) written, each a file named by its hash.
    assert len(block_files(cache)) == 40
    with serve_process(stories_path, args, tmp_path) as (url, _):
        warm = complete(url, PROMPT)
        metrics = httpx.get(url + "/metrics").text.splitlines()
    assert "ember_disk_cache_files 40.0" in metrics
    assert f"ember_disk_cache_bytes {sum(f.stat().st_size for f in block_files(cache))}.0" in metrics
    # All 40 blocks came from disk (the 5 tokens after them are computed), same greedy output.
    assert warm["tokens_cached"] == 640
    assert warm["timings"]["cache_n"] == 640
    assert warm["tokens"] == cold["tokens"] and warm["content"] == cold["content"]
    assert len(block_files(cache)) == 40  # nothing written twice


# Offsets in a block file's header (cpp/kv/disk_cache.h, DiskBlockHeader).
KV_TYPE, MODEL_ID = slice(12, 16), slice(16, 24)
HASH, PARENT, TOKENS = slice(48, 56), slice(56, 64), 72
ROOT_HASH = (0x2545F4914F6CDD1D).to_bytes(8, "little")


def chains(cache: Path) -> dict[int, list[Path]]:
    """Each prompt's block files in order, by the first token of the prompt."""
    files = block_files(cache)
    by_parent = {f.read_bytes()[PARENT]: f for f in files}
    out = {}
    for head in (f for f in files if f.read_bytes()[PARENT] == ROOT_HASH):
        chain = [head]
        while chain[-1].read_bytes()[HASH] in by_parent:
            chain.append(by_parent[chain[-1].read_bytes()[HASH]])
        out[int.from_bytes(head.read_bytes()[TOKENS:TOKENS + 4], "little")] = chain
    return out


def rewrite(path: Path, offset: slice, value: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[offset] = value
    path.write_bytes(bytes(data))


def test_bad_cache_files_are_ignored_with_a_warning(stories_path: Path, tmp_path: Path) -> None:
    """Four prompts of 3 blocks and a token; the second block file of each is made bad in one
    way. The restarted server reads each prompt's first block, warns about the second, never
    loads it, recomputes the rest and answers exactly as before."""
    cache = tmp_path / "cache"
    args = [*SERVE_ARGS, "--cache-dir", str(cache)]
    prompts = {first: [first] + [(first * 11 + i * 5) % 500 + 3 for i in range(48)]
               for first in (401, 402, 403, 404)}
    with serve_process(stories_path, args, tmp_path) as (url, _):
        cold = {first: complete(url, p)["tokens"] for first, p in prompts.items()}
    files = chains(cache)
    assert sorted(files) == sorted(prompts) and all(len(c) == 3 for c in files.values())
    rewrite(files[401][1], MODEL_ID, (12345).to_bytes(8, "little"))  # another model's
    rewrite(files[402][1], KV_TYPE, (8).to_bytes(4, "little"))  # another KV type's
    corrupt = files[403][1]
    rewrite(corrupt, slice(-9, -8), bytes([corrupt.read_bytes()[-9] ^ 0xFF]))
    files[404][1].write_bytes(files[404][1].read_bytes()[:-100])  # truncated
    with serve_process(stories_path, args, tmp_path) as (url, _):
        warm = {first: complete(url, p) for first, p in prompts.items()}
    log = (tmp_path / "stderr.log").read_text()
    for first, answer in warm.items():
        assert answer["tokens_cached"] == 16, (first, answer["tokens_cached"])
        assert answer["tokens"] == cold[first]
    for why in ("written for another model", "KV type 8", "checksum does not match (corrupt)",
                "truncated"):
        assert why in log, (why, log[-3000:])
    assert log.count("; ignored") == 4, log[-3000:]


def test_the_cache_dir_stays_within_its_disk_size(stories_path: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # A stories260K block file: 72-byte header, 16 token ids, 5 layers x K, V x 16 x 32 f16.
    file_bytes = 72 + 16 * 4 + 5 * 2 * 16 * 32 * 2
    args = [*SERVE_ARGS, "--cache-dir", str(cache), "--cache-disk-size", str(10 * file_bytes)]
    with serve_process(stories_path, args, tmp_path) as (url, _):
        complete(url, PROMPT)
    files = block_files(cache)
    assert len(files) == 10
    assert sum(f.stat().st_size for f in files) <= 10 * file_bytes


def test_slots_save_restore_and_erase(stories_path: Path, tmp_path: Path) -> None:
    slots = tmp_path / "slots"
    args = [*SERVE_ARGS, "--slot-save-path", str(slots)]
    with serve_process(stories_path, args, tmp_path) as (url, _):
        cold = complete(url, PROMPT)
        saved = httpx.post(url + "/slots/0?action=save", json={"filename": "s0.bin"}).json()
        assert saved["id_slot"] == 0 and saved["filename"] == "s0.bin"
        # The prompt's 40 full blocks and the 6 output tokens' tail: 651 tokens, 40 blocks.
        assert saved["n_saved"] == 640
        assert saved["n_written"] == (slots / "s0.bin").stat().st_size
        assert saved["timings"]["save_ms"] >= 0
        bad = httpx.post(url + "/slots/0?action=save", json={"filename": "../x.bin"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "filename"
        bad = httpx.post(url + "/slots/0?action=save", json={"filename": "a/b"})
        assert bad.status_code == 400
        bad = httpx.post(url + "/slots/0?action=save", json={"filename": "x", "id": 3})
        assert bad.status_code == 400 and "id" in bad.text
        bad = httpx.post(url + "/slots/5?action=save", json={"filename": "x"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "id_slot"
        bad = httpx.post(url + "/slots/0?action=fly", json={"filename": "x"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "action"
        missing = httpx.post(url + "/slots/0?action=restore", json={"filename": "none.bin"})
        assert missing.status_code == 404
        erased = httpx.post(url + "/slots/0?action=erase").json()
        assert erased == {"id_slot": 0, "n_erased": len(PROMPT) + len(cold["tokens"])}
    (slots / "junk.bin").write_bytes(b"not a state file at all" * 10)
    with serve_process(stories_path, args, tmp_path) as (url, _):
        restored = httpx.post(url + "/slots/0?action=restore", json={"filename": "s0.bin"}).json()
        assert restored["id_slot"] == 0 and restored["n_restored"] == 640
        assert restored["n_read"] == (slots / "s0.bin").stat().st_size
        warm = complete(url, PROMPT)
        assert warm["tokens_cached"] == 640 and warm["tokens"] == cold["tokens"]
        junk = httpx.post(url + "/slots/0?action=restore", json={"filename": "junk.bin"})
        assert junk.status_code == 400 and "not an ember state file" in junk.text
    with serve_process(stories_path, SERVE_ARGS, tmp_path) as (url, _):
        off = httpx.post(url + "/slots/0?action=save", json={"filename": "s0.bin"})
        assert off.status_code == 501 and "--slot-save-path" in off.text


def test_llm_save_state_and_load_state(stories_path: Path, tmp_path: Path) -> None:
    state = tmp_path / "state.bin"
    llm = LLM(stories_path, n_threads=1, n_ctx=1024, device="cpu")
    try:
        cold = llm.generate(PROMPT, max_tokens=6, temperature=0)
        assert llm.save_state(state) == 640
    finally:
        llm.close()
    llm = LLM(stories_path, n_threads=1, n_ctx=1024, device="cpu")
    try:
        assert llm.load_state(state) == [*PROMPT, *cold.tokens]
        warm = llm.generate(PROMPT, max_tokens=6, temperature=0)
        assert warm.usage.cached_tokens == 640
        assert warm.tokens == cold.tokens
        bad = tmp_path / "bad.bin"
        bad.write_bytes(b"x" * 500)
        with pytest.raises(ValueError, match="not an ember state file"):
            llm.load_state(bad)
    finally:
        llm.close()
    # An engine with other KV blocks refuses the file.
    llm = LLM(stories_path, n_threads=1, n_ctx=1024, device="cpu", block_size=8)
    try:
        with pytest.raises(ValueError, match="another KV shape"):
            llm.load_state(state)
    finally:
        llm.close()


def test_cache_disk_size_reads_units_and_refuses_nonsense() -> None:
    import typer

    from ember.commands.serve import _bytes

    assert _bytes("2G", "--cache-disk-size") == 2 << 30
    assert _bytes("512M", "--cache-disk-size") == 512 << 20
    assert _bytes("4096", "--cache-disk-size") == 4096
    for bad in ("2X", "-1G", "0"):
        with pytest.raises(typer.BadParameter) as err:
            _bytes(bad, "--cache-disk-size")
        assert err.value.param_hint == "--cache-disk-size"
