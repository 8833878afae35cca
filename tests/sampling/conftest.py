"""The grammar tests' tokenizer (stories260K's) and the GrammarCompiler over it."""

from pathlib import Path

import pytest

from ember import _core
from ember.grammar import GrammarCompiler


@pytest.fixture(scope="module")
def tokenizer(stories_path: Path) -> _core.Tokenizer:
    return _core.Tokenizer(str(stories_path))


@pytest.fixture(scope="module")
def compiler(tokenizer: _core.Tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer)
