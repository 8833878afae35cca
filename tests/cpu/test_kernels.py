"""The CPU matmul kernels: runs tests/cpp/test_matmul (built with CMake into tests/.cache/build-cpp) once per
ISA level, and the NEON kernels under qemu-user via scripts/test_neon.sh. The CPU store_kv and
attention ops over f16 and q8_0 KV caches: tests/cpp/test_attention, every ops level in one run.

test_matmul compares every kernel against the scalar int8 reference and a float64 dot of the
dequantized weights, on fresh random data each run, and prints "N passed, M failed".
test_attention compares store_kv's bytes with the reference quantizers and attention with a
float64 softmax attention over the same cached bytes, dequantized.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cpp_cases import build_cpp_test

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def test_matmul_exe() -> Path:
    """The test_matmul program, built into the shared C++ test build (tests/.cache/build-cpp)."""
    return build_cpp_test("test_matmul")


MATMUL_CASES = ["kernels_scalar", "kernels_avx2", "kernels_avx512", "kernels_amx", "kernels_neon",
                "matmul_runs_the_active_level"]


def run_test_matmul(exe: Path, isa: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, EMBER_CPU_ISA=isa)
    return subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=900)


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512", "amx", "neon"])
def test_matmul_kernels(test_matmul_exe: Path, isa: str) -> None:
    result = run_test_matmul(test_matmul_exe, isa)
    out = result.stdout + result.stderr
    active = re.search(r"active isa (\w+)", out)
    assert active, out[-4000:]
    if active.group(1) != isa and isa != "scalar":
        pytest.skip(f"this CPU cannot run {isa} kernels (best level: {active.group(1)})")
    assert result.returncode == 0, out[-4000:]
    level = re.search(rf"^isa {isa}: (\d+) passed, (\d+) failed$", out, re.MULTILINE)
    assert level, out[-4000:]
    assert int(level.group(1)) > 1000 and int(level.group(2)) == 0, out[-4000:]
    total = re.search(r"^(\d+) passed, (\d+) failed$", out, re.MULTILINE)
    assert total and int(total.group(2)) == 0, out[-4000:]
    # Every case of the program ran and passed (a case that silently disappears fails here).
    assert re.findall(r"^ok\s+(\S+)$", out, re.MULTILINE) == MATMUL_CASES, out[-4000:]
    if isa == "amx":
        same = re.search(r"^amx == avx512 bit for bit: (\d+) passed, (\d+) failed$", out, re.MULTILINE)
        assert same and int(same.group(1)) > 0 and int(same.group(2)) == 0, out[-4000:]


def test_isa_cap_is_respected(test_matmul_exe: Path) -> None:
    """EMBER_CPU_ISA=scalar must keep every SIMD table out of the run."""
    out = run_test_matmul(test_matmul_exe, "scalar").stdout
    assert "active isa scalar" in out
    assert re.findall(r"^isa (\w+):", out, re.MULTILINE) == ["scalar"]


def test_avx512_cap_excludes_amx(test_matmul_exe: Path) -> None:
    """EMBER_CPU_ISA=avx512 must keep the AMX GEMMs out of the run, even on a CPU with AMX."""
    out = run_test_matmul(test_matmul_exe, "avx512").stdout
    if "active isa avx512" not in out:
        pytest.skip("this CPU cannot run avx512 kernels")
    assert "amx" not in re.findall(r"^isa (\w+):", out, re.MULTILINE)
    assert "bit for bit" not in out


def test_neon_kernels_under_qemu() -> None:
    missing = [t for t in ("aarch64-linux-gnu-g++", "qemu-aarch64") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (Debian: apt-get install g++-aarch64-linux-gnu qemu-user)")
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "test_neon.sh")],
        capture_output=True, text=True, timeout=1800,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    level = re.search(r"^isa neon: (\d+) passed, 0 failed$", out, re.MULTILINE)
    assert level and int(level.group(1)) > 0, out[-4000:]


@pytest.fixture(scope="session")
def test_attention_exe() -> Path:
    return build_cpp_test("test_attention")


def test_attention_kernels_f16_and_q8_0(test_attention_exe: Path) -> None:
    """Decode and prefill attention, GQA, paged tables, head_dim 32/64/128/96, f16 and q8_0
    caches, at the scalar level and (where the CPU has them) the AVX2 and AVX-512 ones."""
    result = subprocess.run([str(test_attention_exe)], check=False, capture_output=True, text=True,
                            timeout=600)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert re.findall(r"^ok\s+(\S+)$", out, re.MULTILINE) == [
        "store_kv_and_attention_scalar", "store_kv_and_attention_avx2", "store_kv_and_attention_avx512",
        "cpu_backend_supports_f16_and_q8_0_kv", "paged_kv_cache_checks_types_and_sizes"], out[-4000:]
    levels = {name: (int(ok), int(bad)) for name, ok, bad in
              re.findall(r"^isa (\w+): (\d+) passed, (\d+) failed", out, re.MULTILINE)}
    expected = ["scalar"]
    if "avx2=1 fma=1 f16c=1" in out and "active isa scalar" not in out:
        expected.append("avx2")
    if "avx512=1" in out and re.search(r"active isa (avx512|amx)$", out, re.MULTILINE):
        expected.append("avx512")
    assert sorted(levels) == sorted(expected), out[-4000:]
    for name in expected:
        assert levels[name][0] > 100 and levels[name][1] == 0, (name, out[-4000:])
    total = re.search(r"^(\d+) passed, (\d+) failed$", out, re.MULTILINE)
    assert total and int(total.group(2)) == 0, out[-4000:]


def test_attention_kernels_respect_the_isa_cap(test_attention_exe: Path) -> None:
    env = dict(os.environ, EMBER_CPU_ISA="scalar")
    out = subprocess.run([str(test_attention_exe)], check=False, capture_output=True, text=True, env=env,
                         timeout=600).stdout
    assert re.findall(r"^isa (\w+):", out, re.MULTILINE) == ["scalar"], out[-4000:]
