"""SmolLM2-135M-Instruct Q4_1 (the demo model): greedy continuation of a factual prompt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ember import _core

PROMPT = "The capital of France is"
# The prompt's GPT-2 style BPE pieces ('Ġ' marks a leading space), for builds without
# ember's tokenizer: every piece is one token in SmolLM2's vocabulary.
PROMPT_PIECES = ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]


@pytest.fixture(scope="module")
def model(smollm2_path: Path) -> _core.Model:
    return _core.Model(str(smollm2_path), n_ctx=512)


def _prompt_ids(path: Path) -> tuple[list[int], int]:
    """Token ids of PROMPT and of ' Paris'."""
    if hasattr(_core, "Tokenizer"):
        tok = _core.Tokenizer(str(path))
        paris = list(tok.encode(" Paris", add_special=False))
        assert len(paris) == 1
        return list(tok.encode(PROMPT, add_special=True)), paris[0]
    from ember import GGUFFile

    vocab = GGUFFile(str(path)).metadata["tokenizer.ggml.tokens"]
    index = {piece: i for i, piece in enumerate(vocab)}
    return [index[p] for p in PROMPT_PIECES], index["ĠParis"]


def test_hparams(model: _core.Model) -> None:
    assert model.architecture == "llama"
    assert (model.n_vocab, model.n_embd, model.n_layer) == (49152, 576, 30)
    assert model.n_ctx_train == 8192 and model.n_ctx == 512


def test_capital_of_france(model: _core.Model, smollm2_path: Path) -> None:
    prompt, paris = _prompt_ids(smollm2_path)
    logits = model.eval_last(prompt)
    assert int(np.argmax(logits)) == paris
    # The full-rows path agrees with the last-row path.
    all_rows = model.eval(prompt)
    assert all_rows.shape == (len(prompt), 49152)
    np.testing.assert_allclose(all_rows[-1], logits, rtol=0, atol=1e-3)
    # Decoding continues from the cache: " Paris" is followed by ".".
    logits = model.eval_last([paris], reset=False)
    assert model.n_past == len(prompt) + 1
    from ember import GGUFFile

    vocab = GGUFFile(str(smollm2_path)).metadata["tokenizer.ggml.tokens"]
    assert vocab[int(np.argmax(logits))] == "."
