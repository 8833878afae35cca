"""The C++ test programs of tests/cpp: build_cpp_test builds one, run_cases runs one built on
tests/cpp/harness.h and checks its report: every case it is expected to run printed "ok NAME",
no case printed "FAIL", the summary line agrees and the exit status is 0. A case that disappears
from the program, or a new one missing from the list, fails."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest


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


ROOT = Path(__file__).resolve().parent.parent
CPP_BUILD = Path(__file__).resolve().parent / ".cache" / "build-cpp"

CPP_BUILD_VULKAN = Path(__file__).resolve().parent / ".cache" / "build-cpp-vulkan"
CPP_BUILD_CUDA = Path(__file__).resolve().parent / ".cache" / "build-cpp-cuda"


def build_cpp_test(target: str, vulkan: bool = False, cuda: bool = False) -> Path:
    """Builds tests/cpp/<target>.cpp (with the core library) into one shared CMake build folder,
    configured once and rebuilt incrementally, and returns the program's path. vulkan: in a
    second folder, with the Vulkan backend built in (EMBER_VULKAN=ON: needs glslc and the
    Vulkan headers); cuda: in a third, with the CUDA backend (EMBER_CUDA=ON: needs nvcc, see
    cuda/CMakeLists.txt)."""
    if shutil.which("cmake") is None:
        pytest.fail("cmake is needed to build the C++ tests (pip install cmake)")
    build_dir = CPP_BUILD_CUDA if cuda else CPP_BUILD_VULKAN if vulkan else CPP_BUILD
    if not (build_dir / "CMakeCache.txt").exists():
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        configure = subprocess.run(
            ["cmake", "-S", str(ROOT), "-B", str(build_dir), *generator,
             "-DCMAKE_BUILD_TYPE=Release", "-DEMBER_BUILD_TESTS=ON",
             "-DEMBER_BUILD_PYTHON=OFF", f"-DEMBER_VULKAN={'ON' if vulkan else 'OFF'}",
             f"-DEMBER_CUDA={'ON' if cuda else 'OFF'}"],
            capture_output=True, text=True, timeout=600)
        assert configure.returncode == 0, configure.stdout[-4000:] + configure.stderr[-4000:]
    jobs = os.environ.get("EMBER_BUILD_JOBS", "2")
    build = subprocess.run(["cmake", "--build", str(build_dir), "--target", target, "-j", jobs],
                           capture_output=True, text=True, timeout=3600)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    program = build_dir / target
    assert program.exists(), f"{program} was not built"
    return program
