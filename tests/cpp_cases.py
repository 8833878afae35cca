"""Runs a C++ test program built on tests/cpp/harness.h and checks its report: every case it is
expected to run printed "ok NAME", no case printed "FAIL", the summary line agrees and the exit
status is 0. A case that disappears from the program, or a new one missing from the list, fails."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path


def run_cases(program: Path, expected: list[str], *args: str, timeout: float = 600) -> str:
    """Runs `program args...`, asserts that exactly the cases in `expected` ran and passed, and
    returns its stdout (for checks of what else it printed)."""
    proc = subprocess.run([str(program), *args], check=False, capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout
    report = (f"{program.name} {' '.join(args)} (exit status {proc.returncode}):\n"
              f"{out[-6000:]}\n{proc.stderr[-2000:]}")
    failed = re.findall(r"^FAIL\s+(\S+): ", out, re.MULTILINE)
    assert not failed, f"cases that failed: {failed}\n{report}"
    summary = re.search(r"^(\d+) passed, (\d+) failed$", out, re.MULTILINE)
    assert summary, f"no summary line (did the program crash?)\n{report}"
    ok = re.findall(r"^ok\s+(\S+)$", out, re.MULTILINE)
    missing = [case for case in expected if case not in ok]
    assert not missing, f"cases that did not report ok: {missing}\n{report}"
    unlisted = [case for case in ok if case not in expected]
    assert not unlisted, f"cases the test does not list (add them): {unlisted}\n{report}"
    assert len(ok) == len(set(ok)) == int(summary.group(1)) and int(summary.group(2)) == 0, report
    assert proc.returncode == 0, report
    return out
