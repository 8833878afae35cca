"""Gemma 3 270M (the real Q4_K_M file) against llama.cpp on the same file.

llama.cpp's figures below were taken from llama-simple (greedy text), llama-server /completion
with n_probs (log-probabilities of a freshly evaluated prompt) and llama-perplexity (-c 1024 over
tests/data/design_excerpt.txt), built by shared/bench/build_llamacpp.sh. llama.cpp's own output
depends on how a prompt is split into batches (its kernels round differently by shape), so text
is compared only where the greedy choices have clear margins, and the rest by log-probabilities
and perplexity, with tolerances set by the int8 activation rounding both engines do.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ember import _core
from ember.llm import LLM

# llama-simple -m gemma-3-270m-q4_k_m.gguf -n 24 PROMPT
LLAMA_CPP_GREEDY = {
    "The best way to learn programming is":
        " to learn how to program.\n\nI have been a programmer for over 20 years. I have been working in",
    "Water boils at": " 100 degrees Celsius.\n\nWater boils at 100 degrees Celsius.\n\nWater boils at 1",
    "def fibonacci(n):": "\n    if n == 0:\n        return 0\n    elif n == 1:\n        return",
}
# llama-server: the prompt's ids [2, 902, 236743, ..., 1171, 236743] ("In 1969, the first "),
# cache_prompt off: the three most likely next tokens and their log-probabilities.
LLAMA_CPP_TOP3 = [("1", -1.818), ("<em>", -1.974), ("2", -2.002)]
LLAMA_CPP_PPL_1024 = 63.8634  # llama-perplexity -c 1024 -f tests/data/design_excerpt.txt


@pytest.fixture(scope="module")
def llm(gemma3_path: Path) -> LLM:
    return LLM(gemma3_path, n_threads=2, n_ctx=1024, parallel=2)


def test_config_of_the_real_file(llm: LLM) -> None:
    assert llm.metadata["general.architecture"] == "gemma3"
    assert llm.n_vocab == 262144
    assert llm.tokenize("In 1969, the first") == [2, 902, 236743, 236770, 236819, 236825, 236819,
                                                  236764, 506, 1171]


@pytest.mark.parametrize("prompt", sorted(LLAMA_CPP_GREEDY))
def test_greedy_text_equals_llama_cpp(llm: LLM, prompt: str) -> None:
    r = llm.generate(prompt, max_tokens=24, temperature=0)
    assert r.text == LLAMA_CPP_GREEDY[prompt]


def test_logprobs_match_llama_cpp(gemma3_path: Path) -> None:
    model = _core.Model(str(gemma3_path), n_threads=2)
    tokenizer = _core.Tokenizer(str(gemma3_path))
    ids = tokenizer.encode("In 1969, the first", True, False) + [236743]
    logits = model.eval_last(ids).astype(np.float64)
    logprobs = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
    top = np.argsort(-logprobs)[:3]
    assert [tokenizer.decode([int(t)], skip_special=False) for t in top] == [t for t, _ in LLAMA_CPP_TOP3]
    # Both engines quantize activations to int8 per block; their logprobs differ by ~0.05.
    assert logprobs[top] == pytest.approx([lp for _, lp in LLAMA_CPP_TOP3], abs=0.1)


def test_perplexity_with_sliding_windows_matches_llama_cpp(gemma3_path: Path) -> None:
    """1024-token chunks: the local layers see 512 positions, so a wrong window or local RoPE
    base moves the perplexity far (all layers global gives ~560 here, instead of ~64)."""
    n_ctx = 1024
    model = _core.Model(str(gemma3_path), n_threads=2, n_ctx=n_ctx)
    tokenizer = _core.Tokenizer(str(gemma3_path))
    text = (Path(__file__).parent.parent / "data" / "design_excerpt.txt").read_text()
    ids = tokenizer.encode(text, True, False)
    nll, count = 0.0, 0
    for c in range(len(ids) // n_ctx):  # llama-perplexity's scheme: BOS first, score the 2nd half
        chunk = [tokenizer.bos, *ids[c * n_ctx + 1:(c + 1) * n_ctx]]
        logits = model.eval(chunk).astype(np.float64)[n_ctx // 2:n_ctx - 1]
        top = logits.max(axis=1, keepdims=True)
        lse = (top + np.log(np.exp(logits - top).sum(axis=1, keepdims=True)))[:, 0]
        nll += float((lse - logits[np.arange(len(logits)), chunk[n_ctx // 2 + 1:]]).sum())
        count += len(logits)
    assert count == 3 * 511
    assert np.exp(nll / count) == pytest.approx(LLAMA_CPP_PPL_1024, rel=0.02)


def test_ember_chat_answers_through_the_gemma_turns(gemma3_path: Path) -> None:
    """The file has no tokenizer.chat_template: ember chat takes the gemma3 architecture's
    built-in (Gemma's turns), as llama.cpp's --chat-template gemma does. The prompt ember renders
    and tokenizes is pinned, and the greedy answer to it: llama-server /completion on these
    same prompt ids (temperature 0) gives the same text. (This 270M model is the base one, not
    instruction-tuned: it answers by repeating the question.)"""
    question = [{"role": "user", "content": "What is the capital of France?"}]
    llm = LLM(gemma3_path, n_threads=2, n_ctx=256, parallel=1)
    assert llm.chat_template.is_default
    assert llm.apply_chat_template(question) == (
        "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n")
    assert llm.chat_template.encode(llm.tokenizer, question) == [
        2, 105, 2364, 107, 3689, 563, 506, 5279, 529, 7001, 236881, 106, 107, 105, 4368, 107]
    proc = subprocess.run([sys.executable, "-m", "ember.cli", "chat", str(gemma3_path), "--temp", "0",
                           "-n", "12", "-t", "2"], input="What is the capital of France?\n",
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "What is the capital of France? mendatang\nWhat is the\n"
