"""`ember pull USER/REPO[:QUANT]` and `hf://...` model arguments, against a Hugging Face Hub
served on loopback (tests/fake_hub.py): huggingface_hub itself lists, downloads (progress bar,
resume after a broken transfer) and fills a real cache in tmp, which the offline tests then use.
No network is needed."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import socket
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_hub import FakeHub
from gguf_builder import split_gguf

from ember.hub.errors import ModelNotFound
from ember.hub.hf import HubRef, available, choose, parse_ref, pick_file, quant_tag
from ember.hub.models import resolve_model

STORY = (", there was a little girl named Lily. She loved to play outside in the park. "
         "One day, she saw a big, red ball.")


# --- which file a reference names (no Hub needed) ------------------------------------------------

QUANTS = ["README.md", "model-Q2_K.gguf", "model-Q4_K_M.gguf", "model-Q8_0.gguf",
          "model-F16.gguf", "model-BF16.gguf", "mmproj-model-F16.gguf", "imatrix.gguf"]


def test_parse_ref() -> None:
    assert parse_ref("hf://a/b") == HubRef("a/b")
    assert parse_ref("a/b:q4_k_m") == HubRef("a/b", quant="q4_k_m")
    assert parse_ref("hf://org/Some.Model-GGUF/sub/dir/x-Q8_0.gguf") == \
        HubRef("org/Some.Model-GGUF", file="sub/dir/x-Q8_0.gguf")
    assert str(parse_ref("a/b:Q8_0")) == "hf://a/b:Q8_0"
    for bad in ("hf://a", "a/b/c", "a/b:", "hf://a/b/../x.gguf", "a/b/c.txt", "/a/b"):
        with pytest.raises(ModelNotFound, match="not a Hub model reference"):
            parse_ref(bad)


def test_pick_by_quant_is_case_insensitive_and_skips_sidecars() -> None:
    assert pick_file(QUANTS, "q8_0") == "model-Q8_0.gguf"
    assert pick_file(QUANTS, "Q2_K") == "model-Q2_K.gguf"
    assert pick_file(QUANTS, "F16") == "model-F16.gguf"  # not BF16, not the mmproj
    assert pick_file(QUANTS, "BF16") == "model-BF16.gguf"
    assert pick_file(QUANTS, "Q5_K_M") is None
    assert pick_file(["only-mmproj-F16.gguf"], None) is None


def test_default_pick_q4_k_m_then_q8_0_then_the_smallest_sensible() -> None:
    assert pick_file(QUANTS, None) == "model-Q4_K_M.gguf"
    assert pick_file([f for f in QUANTS if "Q4_K_M" not in f], None) == "model-Q8_0.gguf"
    # neither: the fewest bits from 4 up (IQ4_XS before Q5, F16), below 4 only as a last resort
    assert pick_file(["m-Q2_K.gguf", "m-Q5_K_S.gguf", "m-F16.gguf", "m-IQ4_XS.gguf"],
                     None) == "m-IQ4_XS.gguf"
    assert pick_file(["m-Q2_K.gguf", "m-IQ1_S.gguf", "m-F32.gguf"], None) == "m-F32.gguf"
    assert pick_file(["m-Q2_K.gguf", "m-IQ1_S.gguf"], None) == "m-Q2_K.gguf"
    assert pick_file(["stories260K.gguf"], None) == "stories260K.gguf"


def test_split_files_pick_the_first_part_and_bring_all_parts() -> None:
    files = ["Q8_0/big-Q8_0-00002-of-00003.gguf", "Q8_0/big-Q8_0-00001-of-00003.gguf",
             "Q8_0/big-Q8_0-00003-of-00003.gguf", "big-Q2_K.gguf"]
    assert choose(HubRef("a/b"), files) == [f"Q8_0/big-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert quant_tag(files[0]) == "Q8_0"
    with pytest.raises(ModelNotFound, match="only 2 of them are there"):
        choose(HubRef("a/b", quant="q8_0"), files[:2])


def test_choose_errors_name_what_is_there() -> None:
    with pytest.raises(ModelNotFound) as err:
        choose(HubRef("a/b", quant="Q5_K_M"), QUANTS)
    assert str(err.value) == ("hf://a/b:Q5_K_M: no Q5_K_M file in the repo; it has Q2_K, Q4_K_M, "
                              "Q8_0, BF16, F16 (ask for one with hf://a/b:QUANT)")
    with pytest.raises(ModelNotFound, match=r"hf://a/b has no GGUF model file \(it holds 2 files: "
                                            r"config.json, model.safetensors\); `ember convert a/b"):
        choose(HubRef("a/b"), ["config.json", "model.safetensors"])
    with pytest.raises(ModelNotFound, match="the repo has no file x.gguf"):
        choose(HubRef("a/b", file="x.gguf"), QUANTS)
    assert available(["m.gguf", "m-Q4_0.gguf"]) == "Q4_0, m.gguf"


# --- the CLI against a Hub on loopback -----------------------------------------------------------

def _fake_gguf(name: str, n_bytes: int = 4096) -> bytes:
    """Distinct bytes per file, so a test can tell which one arrived (`pull` does not parse)."""
    seed = name.encode()
    return (b"GGUF" + seed * (n_bytes // len(seed) + 1))[:n_bytes]


BIG = 12 << 20  # past huggingface_hub's 10 MiB download chunk, so a cut transfer keeps a part


@pytest.fixture(scope="module")
def stories_shards(stories_path: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """stories260K cut as llama-gguf-split --split-max-tensors 20 does: 3 files."""
    return split_gguf(stories_path, tmp_path_factory.mktemp("split") / "stories260K-F32", 20)


@pytest.fixture(scope="module")
def hub(stories_path: Path, stories_shards: list[Path]) -> Iterator[FakeHub]:
    repos = {
        "ember-test/quants-GGUF": {f: _fake_gguf(f) for f in QUANTS},
        "ember-test/split-GGUF": {p.name: p.read_bytes() for p in stories_shards},
        "ember-test/safetensors": {"config.json": b"{}", "model.safetensors": b"\0" * 16},
        "ember-test/stories260K-GGUF": {"stories260K-F32.gguf": stories_path.read_bytes()},
        "ember-test/big-GGUF": {"big-Q4_K_M.gguf": os.urandom(BIG)},
    }
    with FakeHub(repos) as server:
        yield server


@pytest.fixture
def closed_port() -> Iterator[str]:
    """An endpoint where nothing listens: connections are refused, like a machine offline."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def ember(*args: str, hf_home: Path, endpoint: str, offline: bool = False,
          timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ember.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env(hf_home, endpoint, offline),
                          check=False)


def _env(hf_home: Path, endpoint: str, offline: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGINGFACE_")) and k != "TRANSFORMERS_OFFLINE"}
    env.update(HF_HOME=str(hf_home), HF_ENDPOINT=endpoint, HF_HUB_DISABLE_TELEMETRY="1",
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def ember_on_a_terminal(*args: str, hf_home: Path, endpoint: str) -> tuple[int, str, str]:
    """(status, stdout, what the terminal showed): stderr is a pseudo-terminal, where progress
    bars are drawn (huggingface_hub draws none into a pipe)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # rows, columns
    proc = subprocess.Popen([sys.executable, "-m", "ember.cli", *args], stdout=subprocess.PIPE,
                            stderr=slave, env=_env(hf_home, endpoint, False))
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    stdout = proc.communicate(timeout=120)[0]
    return proc.returncode, stdout.decode(), shown.decode(errors="replace")


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def _pulled(proc: subprocess.CompletedProcess) -> list[Path]:
    assert proc.returncode == 0, proc.stderr
    return [Path(line) for line in proc.stdout.splitlines()]


def test_pull_default_and_by_quant_into_the_hf_cache(hub: FakeHub, tmp_path: Path) -> None:
    files = hub.repos["ember-test/quants-GGUF"]
    commit = hub.commit("ember-test/quants-GGUF")
    snapshot = tmp_path / "hub" / "models--ember-test--quants-GGUF" / "snapshots" / commit
    status, stdout, shown = ember_on_a_terminal("pull", "ember-test/quants-GGUF",
                                                hf_home=tmp_path, endpoint=hub.endpoint)
    assert status == 0, shown
    path = Path(stdout.strip())
    assert path == snapshot / "model-Q4_K_M.gguf"
    assert path.read_bytes() == files["model-Q4_K_M.gguf"]
    assert re.search(r"\rmodel-Q4_K_M\.gguf: 100%\|█+\| 4\.10k/4\.10k", shown), shown  # its bar
    assert (tmp_path / "hub" / "models--ember-test--quants-GGUF" / "refs" / "main").read_text() \
        == commit
    [path] = _pulled(ember("pull", "hf://ember-test/quants-GGUF:q8_0", hf_home=tmp_path,
                           endpoint=hub.endpoint))
    assert path == snapshot / "model-Q8_0.gguf" and path.read_bytes() == files["model-Q8_0.gguf"]
    [path] = _pulled(ember("pull", "ember-test/quants-GGUF/model-F16.gguf", hf_home=tmp_path,
                           endpoint=hub.endpoint))
    assert path.read_bytes() == files["model-F16.gguf"]


def test_pull_errors_are_one_line(hub: FakeHub, tmp_path: Path) -> None:
    def error(ref: str) -> str:
        return one_error_line(ember("pull", ref, hf_home=tmp_path, endpoint=hub.endpoint))

    assert error("ember-test/quants-GGUF:Q5_K_M") == (
        "error: hf://ember-test/quants-GGUF:Q5_K_M: no Q5_K_M file in the repo; it has Q2_K, "
        "Q4_K_M, Q8_0, BF16, F16 (ask for one with hf://ember-test/quants-GGUF:QUANT)")
    assert error("ember-test/nothing-here") == (
        "error: hf://ember-test/nothing-here: no such model repo on the Hugging Face Hub (a "
        "private one needs `hf auth login` or HF_TOKEN)")
    assert not (tmp_path / "hub" / "models--ember-test--quants-GGUF" / "blobs").exists()


def test_split_gguf_pull_brings_all_parts_and_runs(hub: FakeHub, tmp_path: Path,
                                                   stories_shards: list[Path]) -> None:
    proc = ember("pull", "ember-test/split-GGUF", hf_home=tmp_path, endpoint=hub.endpoint)
    paths = _pulled(proc)
    assert [p.name for p in paths] == [f"stories260K-F32-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in stories_shards]
    assert proc.stderr == ""  # no "merge them first" note any more
    args = ("-p", "Once upon a time", "--temp", "0", "-n", "40", "-t", "1")
    proc = ember("run", "hf://ember-test/split-GGUF", *args, hf_home=tmp_path, endpoint=hub.endpoint,
                 offline=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == STORY + "\n"  # what the single file gives (test_run_hf_end_to_end)
    proc = ember("info", "hf://ember-test/split-GGUF", "--json", hf_home=tmp_path, endpoint=hub.endpoint,
                 offline=True)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert [Path(p) for p in info["shards"]] == paths
    assert (info["n_tensors"], info["file_bytes"]) == (48, sum(p.stat().st_size for p in paths))


def test_offline_from_the_cache_and_not_cached(hub: FakeHub, tmp_path: Path,
                                               closed_port: str) -> None:
    ref = "ember-test/quants-GGUF:Q8_0"
    [online] = _pulled(ember("pull", ref, hf_home=tmp_path, endpoint=hub.endpoint))
    n_seen = len(hub.seen)
    # HF_HUB_OFFLINE=1: no request at all, and the default pick is made among the cached files
    assert _pulled(ember("pull", "ember-test/quants-GGUF", hf_home=tmp_path, endpoint=hub.endpoint,
                         offline=True)) == [online]
    assert len(hub.seen) == n_seen
    # without it, a refused connection falls back to the cache too
    assert _pulled(ember("pull", ref, hf_home=tmp_path, endpoint=closed_port)) == [online]
    cache = tmp_path / "hub"
    line = one_error_line(ember("pull", "ember-test/quants-GGUF:Q4_K_M", hf_home=tmp_path,
                                endpoint=hub.endpoint, offline=True))
    assert line == (f"error: hf://ember-test/quants-GGUF:Q4_K_M is not in the Hugging Face cache "
                    f"({cache}) and offline mode is on (HF_HUB_OFFLINE=1): unset HF_HUB_OFFLINE "
                    "to download it; cached from this repo: Q8_0")
    line = one_error_line(ember("pull", "ember-test/stories260K-GGUF", hf_home=tmp_path,
                                endpoint=closed_port))
    assert line.startswith(f"error: hf://ember-test/stories260K-GGUF is not in the Hugging Face "
                           f"cache ({cache}) and the Hub cannot be reached (")
    assert line.endswith("check the network (and HF_ENDPOINT or proxy settings) and try again")
    assert len(hub.seen) == n_seen


def test_a_broken_transfer_resumes_with_a_range_request(hub: FakeHub, tmp_path: Path) -> None:
    data = hub.repos["ember-test/big-GGUF"]["big-Q4_K_M.gguf"]
    cut = 11 << 20
    hub.cut_once["big-Q4_K_M.gguf"] = cut
    n_seen = len(hub.seen)
    proc = ember("pull", "ember-test/big-GGUF", hf_home=tmp_path, endpoint=hub.endpoint)
    if proc.returncode != 0:
        # huggingface_hub before 1.0 does not retry a broken body within the call; it keeps the
        # part in the cache (blobs/ETAG.incomplete) and the next run resumes from there
        assert one_error_line(proc).startswith(
            "error: downloading big-Q4_K_M.gguf from hf://ember-test/big-GGUF failed (")
        proc = ember("pull", "ember-test/big-GGUF", hf_home=tmp_path, endpoint=hub.endpoint)
    [path] = _pulled(proc)
    assert path.read_bytes() == data
    gets = [s for s in hub.seen[n_seen:] if s.method == "GET" and "resolve" in s.path]
    assert len(gets) == 2 and gets[0].range is None, gets
    # the second GET asks only for what had not arrived: at most the bytes sent before the cut
    start = int(gets[1].range.removeprefix("bytes=").removesuffix("-"))
    assert 0 < start <= cut, gets[1].range


def test_run_hf_end_to_end(hub: FakeHub, tmp_path: Path, closed_port: str) -> None:
    args = ("-p", "Once upon a time", "--temp", "0", "-n", "40", "-t", "1")
    proc = ember("run", "hf://ember-test/stories260K-GGUF", *args, hf_home=tmp_path,
                 endpoint=hub.endpoint)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == STORY + "\n"
    # ember.LLM resolves the same way: here from the cache, with the Hub gone
    code = ("import ember; llm = ember.LLM('hf://ember-test/stories260K-GGUF:f32', n_threads=1); "
            "print(llm.generate('Once upon a time', max_tokens=40, temperature=0).text)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=_env(tmp_path, closed_port, offline=False), check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == STORY + "\n"
    # and so does `info`
    proc = ember("info", "hf://ember-test/stories260K-GGUF", "--json", hf_home=tmp_path,
                 endpoint=hub.endpoint, offline=True)
    assert proc.returncode == 0, proc.stderr
    assert '"architecture": "llama"' in proc.stdout


def test_a_missing_file_that_looks_like_a_repo_gets_a_hint() -> None:
    with pytest.raises(ModelNotFound) as err:
        resolve_model("someone/model-GGUF")
    assert str(err.value) == ("model file not found: someone/model-GGUF (a Hugging Face Hub "
                              "repo? write hf://someone/model-GGUF)")
    for path in ("nothing.gguf", "models/nothing.gguf", "models/sub/nothing.gguf"):
        with pytest.raises(ModelNotFound) as err:
            resolve_model(path)
        assert str(err.value) == f"model file not found: {path}"
