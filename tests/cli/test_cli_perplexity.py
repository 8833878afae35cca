"""`ember perplexity`, run as a real subprocess on stories260K (vocab 512, SentencePiece, adds
BOS): the PPL against one computed here from ember.Model logits over llama-perplexity's scored
positions, the KL-divergence base file in llama-perplexity's layout (read back by hand, written
by hand with struct.pack), and one-line errors."""

from __future__ import annotations

import re
import struct
import subprocess
import sys

import numpy as np
import pytest

import ember

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
         "park with her friend Tom. One day, they saw a big red ball under a tree. Tom said, "
         "\"Let us play with the ball!\" Lily was happy and they played all day. When the sun "
         "went down, their mom called them home for dinner. They ate soup and bread, and then "
         "they went to bed. ")
TEXT = STORY * 3 + "\n"  # ~410 tokens; the trailing newline is dropped, as llama-perplexity does
N_CTX = 64
N_CHUNK = 4  # 4 * 31 scored tokens: past llama-perplexity's 100-token floor for the statistics


def ember_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ember.cli", "perplexity", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("ppl") / "text.txt"
    path.write_text(TEXT)
    return path


@pytest.fixture(scope="module")
def reference(stories_path):
    """Per chunk, as evaluated: (logits [n_ctx, n_vocab], tokens [n_ctx] before BOS goes in)."""
    tokenizer = ember.Tokenizer(str(stories_path))
    tokens = tokenizer.encode(TEXT[:-1])
    assert tokens[0] == tokenizer.bos and len(tokens) >= N_CHUNK * N_CTX
    model = ember.Model(str(stories_path), n_ctx=N_CTX)
    chunks = []
    for i in range(N_CHUNK):
        chunk = tokens[i * N_CTX:(i + 1) * N_CTX]
        chunks.append((model.eval([tokenizer.bos] + chunk[1:]), np.array(chunk)))
    return chunks


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def scored_nll(reference, n_chunk: int) -> list[np.ndarray]:
    """Per chunk, the NLL of tokens 33..63 given positions 32..62 (first = 64 // 2)."""
    out = []
    for logits, tokens in reference[:n_chunk]:
        lp = log_softmax(logits[32:63])
        out.append(-lp[np.arange(31), tokens[33:64]])
    return out


def test_ppl_is_exp_mean_nll_of_the_second_halves(stories_path, text_file, reference):
    result = ember_cli(str(stories_path), "-f", str(text_file), "-c", str(N_CTX), "--chunks", "3")
    assert result.returncode == 0, result.stderr
    running = re.findall(r"\[(\d+)\]([\d.]+),", result.stdout)
    assert [int(i) for i, _ in running] == [1, 2, 3]
    nll = scored_nll(reference, 3)
    expected = [np.exp(np.concatenate(nll[:k]).mean()) for k in (1, 2, 3)]
    np.testing.assert_allclose([float(v) for _, v in running], expected, rtol=2e-4)  # printed with 4 decimals
    ppl, err = map(float, re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)",
                                    result.stdout).groups())
    all_nll = np.concatenate(nll)
    assert ppl == pytest.approx(expected[-1], rel=2e-4)
    assert err == pytest.approx(expected[-1] * all_nll.std() / np.sqrt(all_nll.size - 1), rel=1e-3)
    assert "seconds per pass - ETA" in result.stderr


def read_base_file(path):
    """The file by its documented layout, read with struct: header, tokens, per-row floats."""
    raw = path.read_bytes()
    magic, n_ctx, n_vocab, n_chunk = struct.unpack_from("<8siii", raw, 0)
    tokens = struct.unpack_from(f"<{n_ctx * n_chunk}i", raw, 20)
    offset, stride = 20 + 4 * n_ctx * n_chunk, 2 * ((n_vocab + 1) // 2) + 4
    rows = []
    while offset < len(raw):
        scale, min_log_prob = struct.unpack_from("<ff", raw, offset)
        codes = np.frombuffer(raw, "<u2", n_vocab, offset + 8)
        rows.append(np.float32(scale) * codes.astype(np.float32) + np.float32(min_log_prob))
        offset += 2 * stride
    assert offset == len(raw)
    return magic, n_ctx, n_vocab, n_chunk, np.array(tokens), np.array(rows)


def test_kl_base_file_layout_and_round_trip(stories_path, text_file, reference, tmp_path):
    base = tmp_path / "base.kld"
    written = ember_cli(str(stories_path), "-f", str(text_file), "-c", str(N_CTX),
                        "--chunks", str(N_CHUNK), "--kl-divergence-base", str(base))
    assert written.returncode == 0, written.stderr
    magic, n_ctx, n_vocab, n_chunk, tokens, rows = read_base_file(base)
    assert (magic, n_ctx, n_vocab, n_chunk) == (b"_logits_", N_CTX, 512, N_CHUNK)
    np.testing.assert_array_equal(tokens, np.concatenate([t for _, t in reference]))
    assert rows.shape == (N_CHUNK * 31, 512)
    lp = np.concatenate([log_softmax(logits[32:63]) for logits, _ in reference])
    kept = lp > lp.max(axis=1, keepdims=True) - 16  # what a row resolves
    step = 16 / 65535  # the quantization step of a row that spans the whole 16 nats
    assert np.abs(rows - lp)[kept].max() < step
    assert np.all(rows[~kept] <= lp.max(axis=1, keepdims=True).repeat(512, 1)[~kept] - 16 + step)

    compared = ember_cli(str(stories_path), "--kl-divergence", "--kl-divergence-base", str(base))
    assert compared.returncode == 0, compared.stderr
    out = compared.stdout
    # KL(file ‖ model) is the rounding's alone: ~1e-6, what the rows above give it
    kld = np.where(rows > -16, np.exp(rows) * (rows - lp), 0).sum(axis=1).mean()
    assert abs(kld) < 1e-5
    assert float(re.search(r"Mean    KLD:\s+(-?[\d.]+)", out).group(1)) == pytest.approx(kld, abs=2e-6)
    assert "Same top p: 100.000 ±" in out
    ppl_q, ppl_base = (float(re.search(rf"Mean PPL\({w}\)\s+:\s+([\d.]+)", out).group(1))
                       for w in ("Q", "base"))
    expected = np.exp(np.concatenate(scored_nll(reference, N_CHUNK)).mean())
    assert ppl_q == pytest.approx(expected, rel=1e-5)
    assert ppl_base == pytest.approx(expected, rel=1e-3)  # the file's log-probs, rounded
    assert len(re.findall(r"^\s+\d+\s+[\d.]+ ±", out, re.M)) == N_CHUNK  # one row per chunk


def test_reads_a_base_file_packed_by_hand(stories_path, reference, tmp_path):
    """Each row puts code 65535 on the token that follows and 0 elsewhere: log p = m + 16 for
    it and m (just under -16: left out of the KL) for the rest, m normalizing the row."""
    n_vocab, n_scored = 512, 31
    m = np.float32(-np.log(np.exp(16.0) + n_vocab - 1))
    scale = np.float32(16 / 65535)
    tokens = np.concatenate([t for _, t in reference])
    parts = [struct.pack("<8siii", b"_logits_", N_CTX, n_vocab, N_CHUNK),
             struct.pack(f"<{tokens.size}i", *tokens)]
    for _, chunk in reference:
        for target in chunk[33:64]:
            codes = [0] * n_vocab
            codes[target] = 65535
            parts.append(struct.pack(f"<ff{n_vocab}H", scale, m, *codes))
    base = tmp_path / "by_hand.kld"
    base.write_bytes(b"".join(parts))

    result = ember_cli(str(stories_path), "--kl-divergence", "--kl-divergence-base", str(base))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    log_p_top = float(scale * np.float32(65535) + m)
    assert float(re.search(r"Mean PPL\(base\)\s+:\s+([\d.]+)", out).group(1)) == \
        pytest.approx(np.exp(-log_p_top), rel=1e-5)
    lp = np.concatenate([log_softmax(logits[32:63]) for logits, _ in reference])
    targets = np.concatenate([chunk[33:64] for _, chunk in reference])
    kld = np.exp(log_p_top) * (log_p_top - lp[np.arange(N_CHUNK * n_scored), targets])
    assert float(re.search(r"Mean    KLD:\s+([\d.]+)", out).group(1)) == \
        pytest.approx(kld.mean(), abs=2e-6)
    same_top = np.mean(lp.argmax(axis=1) == targets)
    assert float(re.search(r"Same top p:\s+([\d.]+)", out).group(1)) == \
        pytest.approx(100 * same_top, abs=1e-3)


def test_odd_vocabulary_rows_are_padded():
    from ember.perplexity import dequantize_rows, quantize_rows, row_stride

    logits = np.random.default_rng(0).normal(0, 4, (3, 7)).astype(np.float32)
    rows = quantize_rows(logits)
    assert rows.shape == (3, row_stride(7)) == (3, 12) and not rows[:, 11].any()
    lp = log_softmax(logits)
    kept = lp > lp.max(axis=1, keepdims=True) - 16
    np.testing.assert_allclose(dequantize_rows(rows, 7)[kept], lp[kept], atol=16 / 65535)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()  # progress lines (tokenizing ..) may come first
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == lines[-1:] and "Traceback" not in result.stderr, result.stderr
    return errors[0]


def test_bad_inputs_are_one_line_errors(stories_path, text_file, tmp_path):
    model = str(stories_path)
    missing = one_line_error(ember_cli(model, "-f", str(tmp_path / "nope.txt")))
    assert "cannot read the text file" in missing and "nope.txt" in missing
    short = one_line_error(ember_cli(model, "-f", str(text_file), "-c", "256"))
    assert "needs at least 512 (2 chunks)" in short
    assert "-f FILE" in one_line_error(ember_cli(model))
    assert "--kl-divergence-base" in one_line_error(ember_cli(model, "--kl-divergence"))
    assert "leave -f out" in one_line_error(ember_cli(model, "--kl-divergence", "-f", str(text_file),
                                                      "--kl-divergence-base", "x.kld"))

    other_vocab = tmp_path / "other_vocab.kld"
    other_vocab.write_bytes(struct.pack("<8siii", b"_logits_", N_CTX, 1000, 1)
                            + struct.pack(f"<{N_CTX}i", *range(N_CTX)))
    assert "vocabulary of 1000 tokens, the model's has 512" in one_line_error(
        ember_cli(model, "--kl-divergence", "--kl-divergence-base", str(other_vocab)))
    assert "n_ctx 64, not the 128 of -c" in one_line_error(
        ember_cli(model, "--kl-divergence", "--kl-divergence-base", str(other_vocab), "-c", "128"))
    not_base = tmp_path / "text.kld"
    not_base.write_text(TEXT)
    assert "is no KL-divergence base file" in one_line_error(
        ember_cli(model, "--kl-divergence", "--kl-divergence-base", str(not_base)))
    truncated = tmp_path / "truncated.kld"
    truncated.write_bytes(struct.pack("<8siii", b"_logits_", N_CTX, 512, 1)
                          + struct.pack(f"<{N_CTX}i", *range(N_CTX)))
    assert "truncated: chunk 1 of 1 ends early" in one_line_error(
        ember_cli(model, "--kl-divergence", "--kl-divergence-base", str(truncated)))


def test_help_explains_the_flags():
    result = ember_cli("--help")
    assert result.returncode == 0, result.stderr
    for flag in ("--file", "--ctx-size", "--chunks", "--batch-size", "--threads",
                 "--kl-divergence-base", "--kl-divergence"):
        assert flag in result.stdout
    assert "llama-perplexity" in result.stdout
