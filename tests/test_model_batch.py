"""Batched forward passes over several sequences of a paged KV cache (what the engine runs).

The test is C++ (tests/cpp/test_model_batch.cpp): this builds it with CMake into the same
incremental build directory as the engine-core tests, runs it on stories260K and checks every
case reported "ok".
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = Path(__file__).resolve().parent / ".cache" / "build-engine"
TARGET = "test_model_batch"
EXPECTED_CASES = ["batched_sequences_match_separate_contexts", "invalid_batches_are_refused"]


def _run(cmd: list[str], timeout: float) -> None:
    proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")


@pytest.fixture(scope="module")
def binary() -> Path:
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    if not (BUILD / "CMakeCache.txt").exists():
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        _run(["cmake", "-S", str(ROOT), "-B", str(BUILD), *generator, "-DCMAKE_BUILD_TYPE=Release",
              "-DEMBER_BUILD_TESTS=ON"], timeout=600)
    jobs = os.environ.get("EMBER_BUILD_JOBS", "2")
    _run(["cmake", "--build", str(BUILD), "--target", TARGET, "-j", jobs], timeout=3600)
    path = BUILD / TARGET
    assert path.exists(), f"{path} was not built"
    return path


def test_model_batch_cases_pass(binary: Path, stories_path: Path) -> None:
    proc = subprocess.run([str(binary), str(stories_path)], check=False, capture_output=True,
                          text=True, timeout=600)
    out = proc.stdout
    assert re.search(r"^\d+ passed, 0 failed$", out, re.MULTILINE) and proc.returncode == 0, out + proc.stderr
    ok = set(re.findall(r"^ok\s+(\S+)$", out, re.MULTILINE))
    assert ok == set(EXPECTED_CASES), out
