"""Batched forward passes over several sequences of a paged KV cache (what the engine runs).

The test is C++ (tests/cpp/test_model_batch.cpp): this builds it with CMake into the same
incremental build directory as the engine-core tests, runs it on stories260K and checks every
case reported "ok".
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import build_cpp_test

ROOT = Path(__file__).resolve().parent.parent
TARGET = "test_model_batch"
EXPECTED_CASES = ["batched_sequences_match_separate_contexts", "invalid_batches_are_refused",
                  "runner_rows_do_not_depend_on_the_batch", "runner_steps_never_allocate_matmul_scratch"]


@pytest.fixture(scope="module")
def binary() -> Path:
    return build_cpp_test(TARGET)


def test_model_batch_cases_pass(binary: Path, stories_path: Path) -> None:
    proc = subprocess.run([str(binary), str(stories_path)], check=False, capture_output=True,
                          text=True, timeout=600)
    out = proc.stdout
    assert re.search(r"^\d+ passed, 0 failed$", out, re.MULTILINE) and proc.returncode == 0, out + proc.stderr
    ok = set(re.findall(r"^ok\s+(\S+)$", out, re.MULTILINE))
    assert ok == set(EXPECTED_CASES), out
