"""SmolLM2-135M-Instruct Q4_1 (the demo model): greedy continuation of a factual prompt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ember import _core

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def model(smollm2_path: Path) -> _core.Model:
    return _core.Model(str(smollm2_path), n_ctx=512)


@pytest.fixture(scope="module")
def tokenizer(smollm2_path: Path) -> _core.Tokenizer:
    return _core.Tokenizer(str(smollm2_path))


def test_hparams(model: _core.Model) -> None:
    assert model.architecture == "llama"
    assert (model.n_vocab, model.n_embd, model.n_layer) == (49152, 576, 30)
    assert model.n_ctx_train == 8192 and model.n_ctx == 512


def test_capital_of_france(model: _core.Model, tokenizer: _core.Tokenizer) -> None:
    prompt = list(tokenizer.encode(PROMPT, add_special=True))
    logits = model.eval_last(prompt)
    paris = int(np.argmax(logits))
    assert tokenizer.decode([paris]) == " Paris"
    # The full-rows path agrees with the last-row path.
    all_rows = model.eval(prompt)
    assert all_rows.shape == (len(prompt), 49152)
    np.testing.assert_allclose(all_rows[-1], logits, rtol=0, atol=1e-3)
    # Decoding continues from the cache: " Paris" is followed by ".".
    logits = model.eval_last([paris], reset=False)
    assert model.n_past == len(prompt) + 1
    assert tokenizer.decode([int(np.argmax(logits))]) == "."
