"""Perplexity and KL divergence with llama-perplexity's protocol and base-file format, so the
numbers (and the files) of both engines compare directly.

The protocol: the text is tokenized whole (BOS added as the vocabulary asks, control-token texts
left as text) and cut into n_chunk chunks of n_ctx tokens (the tail that fills no chunk is
dropped). Each chunk runs alone from an empty cache, its first token replaced by BOS where the
vocabulary adds one; only the second half is scored: with first = n_ctx // 2, the logits of
positions first .. n_ctx - 2 predict tokens first + 1 .. n_ctx - 1 (n_ctx - 1 - first per chunk).
PPL = exp(mean NLL) over every scored token, ± PPL · sqrt(var(NLL) / (count - 1)).

The KL-divergence base file (llama-perplexity --kl-divergence-base; native byte order, which
is little-endian everywhere ember runs):

    char    magic[8]                   "_logits_"
    int32   n_ctx
    int32   n_vocab
    int32   n_chunk
    int32   tokens[n_chunk * n_ctx]    the text's tokens as tokenized (BOS not substituted)
    then per chunk, n_ctx - 1 - n_ctx // 2 rows (the scored positions), each of
    row_stride(n_vocab) uint16:
        float32 scale, float32 min_log_prob   (in the first 4 uint16)
        uint16  q[n_vocab]                     log p[i] ≈ scale · q[i] + min_log_prob
        uint16  0                              where n_vocab is odd (rows stay 4-byte aligned)

A row keeps the log-softmax of the 16 nats below the top logit: min_logit = max(min, max - 16),
scale = (max_logit - min_logit) / 65535, q[i] = round((logit[i] - min_logit) / scale) (to even,
in float32) for logits above min_logit, else 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

MAGIC = b"_logits_"
HEADER = np.dtype([("magic", "S8"), ("n_ctx", "<i4"), ("n_vocab", "<i4"), ("n_chunk", "<i4")])
KEPT_NATS = 16.0  # a row resolves log-probabilities down to this far below the top one


class PerplexityError(ValueError):
    """Bad input for perplexity: too short a text, a base file that does not fit the model."""


def row_stride(n_vocab: int) -> int:
    """uint16 per stored row: 2 float32 (scale, min_log_prob), n_vocab codes, padded to even."""
    return 2 * ((n_vocab + 1) // 2) + 4


def n_scored(n_ctx: int) -> int:
    """Tokens scored per chunk: the second half's, but the last position predicts nothing."""
    return n_ctx - 1 - n_ctx // 2


def chunk_tokens(tokens: np.ndarray, i: int, n_ctx: int, bos: int | None) -> list[int]:
    """The i-th chunk as it is evaluated: its first token replaced by BOS where bos is set."""
    chunk = tokens[i * n_ctx:(i + 1) * n_ctx].tolist()
    if bos is not None:
        chunk[0] = bos
    return chunk


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """[n, n_vocab] float32 logits -> float64 log-probabilities."""
    x = logits.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def quantize_rows(logits: np.ndarray) -> np.ndarray:
    """[n, n_vocab] float32 logits -> [n, row_stride(n_vocab)] uint16 rows of the base file."""
    x = np.ascontiguousarray(logits, dtype=np.float32)
    n, n_vocab = x.shape
    max_logit = x.max(axis=1)
    min_logit = np.maximum(x.min(axis=1), max_logit - np.float32(KEPT_NATS))
    log_sum_exp = np.log(np.exp(x - max_logit[:, None]).sum(axis=1, dtype=np.float64))
    min_log_prob = min_logit - max_logit - log_sum_exp.astype(np.float32)
    scale = (max_logit - min_logit) / np.float32(65535)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(scale > 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
    codes = np.rint(inv_scale[:, None] * (x - min_logit[:, None]))
    codes = np.where(x > min_logit[:, None], np.clip(codes, 0, 65535), 0)
    rows = np.zeros((n, row_stride(n_vocab)), dtype=np.uint16)
    rows[:, :4] = np.stack([scale, min_log_prob], axis=1).astype("<f4").view(np.uint16)
    rows[:, 4:4 + n_vocab] = codes
    return rows


def dequantize_rows(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """[n, row_stride(n_vocab)] uint16 rows -> [n, n_vocab] float32 base log-probabilities."""
    header = np.ascontiguousarray(rows[:, :4]).view("<f4")  # [n, 2]: scale, min_log_prob
    return (header[:, :1] * rows[:, 4:4 + n_vocab].astype(np.float32) + header[:, 1:2])


@dataclass
class BaseFile:
    """A KL-divergence base file opened for reading: its header and tokens, then one chunk's
    rows at a time."""

    path: Path
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray  # [n_chunk * n_ctx] int32
    stream: BinaryIO

    @classmethod
    def open(cls, path: Path) -> BaseFile:
        try:
            stream = open(path, "rb")
        except OSError as err:
            raise PerplexityError(f"cannot open the KL-divergence base file {path}: "
                                  f"{err.strerror}") from None
        raw = stream.read(HEADER.itemsize)
        if len(raw) < HEADER.itemsize or not raw.startswith(MAGIC):
            stream.close()
            raise PerplexityError(f"{path} is no KL-divergence base file (it does not start "
                                  f"with {MAGIC.decode()!r} and its header)")
        header = np.frombuffer(raw, HEADER)[0]
        n_ctx, n_vocab, n_chunk = int(header["n_ctx"]), int(header["n_vocab"]), int(header["n_chunk"])
        if n_ctx < 2 or n_vocab < 1 or n_chunk < 1:
            stream.close()
            raise PerplexityError(f"{path}: bad header (n_ctx {n_ctx}, n_vocab {n_vocab}, "
                                  f"n_chunk {n_chunk})")
        tokens = np.frombuffer(stream.read(4 * n_ctx * n_chunk), "<i4")
        if tokens.size != n_ctx * n_chunk:
            stream.close()
            raise PerplexityError(f"{path} is truncated: its tokens end early")
        return cls(path, n_ctx, n_vocab, n_chunk, tokens, stream)

    def read_chunk(self, i: int) -> np.ndarray:
        """Chunk i's rows [n_scored(n_ctx), row_stride(n_vocab)] uint16 (chunks read in order)."""
        shape = (n_scored(self.n_ctx), row_stride(self.n_vocab))
        raw = self.stream.read(2 * shape[0] * shape[1])
        if len(raw) != 2 * shape[0] * shape[1]:
            raise PerplexityError(f"{self.path} is truncated: chunk {i + 1} of {self.n_chunk} "
                                  "ends early")
        return np.frombuffer(raw, "<u2").reshape(shape)

    def close(self) -> None:
        self.stream.close()


def write_base_header(stream: BinaryIO, n_ctx: int, n_vocab: int, tokens: np.ndarray) -> None:
    """The header and the evaluated tokens (tokens: [n_chunk * n_ctx])."""
    n_chunk = tokens.size // n_ctx
    stream.write(np.array([(MAGIC, n_ctx, n_vocab, n_chunk)], HEADER).tobytes())
    stream.write(np.ascontiguousarray(tokens, "<i4").tobytes())


def mean_and_uncertainty(total: float, total2: float, count: int) -> tuple[float, float]:
    """Mean of the values summed in `total` (squares in `total2`) and its standard error
    (0 for 10 values or fewer), as llama-perplexity reports them."""
    if count < 1:
        return 0.0, 0.0
    mean = total / count
    var = total2 / count - mean * mean
    return mean, math.sqrt(var / (count - 1)) if var > 0 and count > 10 else 0.0


@dataclass
class NllStats:
    """Running sums of the scored tokens' negative log-likelihoods."""

    total: float = 0.0
    total2: float = 0.0
    count: int = 0

    def add(self, nll: np.ndarray) -> None:
        self.total += float(nll.sum())
        self.total2 += float((nll * nll).sum())
        self.count += nll.size

    @property
    def ppl(self) -> float:
        return math.exp(self.total / self.count)

    def ppl_error(self) -> float | None:
        """PPL · the standard error of the mean NLL; None where the variance comes out <= 0."""
        mean = self.total / self.count
        var = self.total2 / self.count - mean * mean
        return self.ppl * math.sqrt(var / (self.count - 1)) if var > 0 else None


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """NLL of targets[j] under logits row j: [n, n_vocab], [n] -> [n] float64."""
    lp = log_softmax(logits)
    return -lp[np.arange(len(targets)), targets]


@dataclass
class KlStats:
    """What llama-perplexity --kl-divergence accumulates: the NLLs of both models, KL(base ‖ Q)
    per token, Δp = p_Q(token) - p_base(token), and how often the top tokens agree."""

    nll: NllStats = field(default_factory=NllStats)
    nll_base: NllStats = field(default_factory=NllStats)
    nll_nll_base: float = 0.0
    kld: list[np.ndarray] = field(default_factory=list)
    p_diff: list[np.ndarray] = field(default_factory=list)
    n_same_top: int = 0

    def add(self, logits: np.ndarray, base_rows: np.ndarray, targets: np.ndarray) -> None:
        """logits [n, n_vocab] of the model under test, base_rows the file's rows of the same
        positions, targets [n] the tokens they predict."""
        n_vocab = logits.shape[1]
        lp = log_softmax(logits)
        lp_base = dequantize_rows(base_rows, n_vocab).astype(np.float64)
        rows = np.arange(len(targets))
        nll, nll_base = -lp[rows, targets], -lp_base[rows, targets]
        self.nll.add(nll)
        self.nll_base.add(nll_base)
        self.nll_nll_base += float((nll * nll_base).sum())
        kept = lp_base > -KEPT_NATS  # the file holds nothing below that
        terms = np.where(kept, np.exp(lp_base) * (lp_base - lp), 0.0)
        self.kld.append(terms.sum(axis=1))
        self.p_diff.append(np.exp(-nll) - np.exp(-nll_base))
        self.n_same_top += int((logits.argmax(axis=1) == lp_base.argmax(axis=1)).sum())

    @property
    def count(self) -> int:
        return self.nll.count

    def log_ppl_ratio(self) -> tuple[float, float]:
        """mean ln(PPL(Q) / PPL(base)) and its standard error (the two NLLs are correlated)."""
        mean, err = mean_and_uncertainty(self.nll.total, self.nll.total2, self.count)
        mean_b, err_b = mean_and_uncertainty(self.nll_base.total, self.nll_base.total2, self.count)
        cov = self.log_ppl_covariance()
        return mean - mean_b, math.sqrt(max(err * err + err_b * err_b - 2 * cov, 0.0))

    def log_ppl_covariance(self) -> float:
        """Cov of the two mean NLLs (0 for fewer than 10 tokens)."""
        n = self.count
        if n < 10:
            return 0.0
        return (self.nll_nll_base / n - (self.nll.total / n) * (self.nll_base.total / n)) / (n - 1)


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """Linear interpolation between the two nearest ranks, as llama-perplexity's percentiles."""
    if fraction <= 0:
        return float(sorted_values[0])
    if fraction >= 1:
        return float(sorted_values[-1])
    p = fraction * (len(sorted_values) - 1)
    i = int(p)
    p -= i
    return float((1 - p) * sorted_values[i] + p * sorted_values[min(i + 1, len(sorted_values) - 1)])


def median(sorted_values: np.ndarray) -> float:
    n = len(sorted_values)
    if n % 2 == 0:
        return float(0.5 * (sorted_values[n // 2] + sorted_values[n // 2 - 1]))
    return float(sorted_values[n // 2])
