"""`ember perplexity MODEL -f TEXT`: perplexity over a text and KL divergence against a base
model's saved log-probabilities, with llama-perplexity's protocol, output and base-file format
(ember/perplexity.py), so quantizations compare across both engines.

Per-chunk numbers and the results go to stdout as llama-perplexity prints them; what it logs
(tokenization, the chunk count, the time per pass and the ETA) goes to stderr.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from ember.perplexity import (
    BaseFile,
    KlStats,
    NllStats,
    PerplexityError,
    chunk_tokens,
    mean_and_uncertainty,
    median,
    percentile,
    quantize_rows,
    token_nll,
    write_base_header,
)

DEFAULT_N_CTX = 512  # llama-perplexity's


def log(message: str) -> None:
    typer.echo(message, err=True)


def out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def read_text(path: Path) -> str:
    """The text as llama-perplexity reads -f: the whole file, less one trailing newline."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise PerplexityError(f"cannot read the text file {path}: {err.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise PerplexityError(f"{path} is not UTF-8 text (byte {err.start})") from None
    return text[:-1] if text.endswith("\n") else text


def row_blocks(n_rows: int, block: int = 32) -> list[slice]:
    """Slices of at most `block` rows: the float64 statistics of a whole chunk at once would
    take n_ctx / 2 * n_vocab * 8 bytes per temporary (0.5 GiB for a 262k vocabulary)."""
    return [slice(i, min(i + block, n_rows)) for i in range(0, n_rows, block)]


def log_eta(what: str, seconds_per_pass: float, n_pass: int) -> None:
    total = int(seconds_per_pass * n_pass)
    hours = f"{total // 3600} hours " if total >= 3600 else ""
    log(f"{what}: {seconds_per_pass:.2f} seconds per pass - ETA {hours}{total % 3600 / 60:.2f} minutes")


class ChunkRunner:
    """Evaluates chunks the way llama-perplexity does: each from an empty cache, BOS first
    where the vocabulary adds one; returns the scored positions' logits."""

    def __init__(self, model_path: Path, n_ctx: int, n_batch: Optional[int],
                 n_threads: Optional[int], device: Optional[str]) -> None:
        from ember import Model, Tokenizer
        from ember.options import resolve_device

        self.tokenizer = Tokenizer(str(model_path))
        if self.tokenizer.add_eos:
            raise PerplexityError("the vocabulary adds EOS after every text, which this protocol "
                                  "(like llama-perplexity's) does not handle")
        self.model = Model(str(model_path), n_threads=n_threads, n_ctx=n_ctx,
                           n_batch=min(n_batch, n_ctx) if n_batch else None,
                           device=resolve_device(device))
        self.n_ctx = n_ctx
        self.bos = self.tokenizer.bos if self.tokenizer.add_bos else None

    @property
    def n_vocab(self) -> int:
        return self.model.n_vocab

    def scored_logits(self, tokens: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Chunk i's logits [n_scored, n_vocab] of positions n_ctx//2 .. n_ctx-2 and the tokens
        [n_scored] they predict."""
        first = self.n_ctx // 2
        logits = self.model.eval(chunk_tokens(tokens, i, self.n_ctx, self.bos))
        start = i * self.n_ctx
        return logits[first:self.n_ctx - 1], tokens[start + first + 1:start + self.n_ctx]


def run_perplexity(runner: ChunkRunner, text: str, n_chunks: Optional[int],
                   base_path: Optional[Path]) -> NllStats:
    n_ctx = runner.n_ctx
    log("perplexity: tokenizing the input ..")
    t0 = time.perf_counter()
    tokens = np.array(runner.tokenizer.encode(text, add_special=True, parse_special=False),
                      dtype=np.int32)
    log(f"perplexity: tokenization took {1e3 * (time.perf_counter() - t0):g} ms")
    if tokens.size < 2 * n_ctx:
        raise PerplexityError(f"the text tokenizes to {tokens.size} tokens; a context of {n_ctx} "
                              f"needs at least {2 * n_ctx} (2 chunks): give a longer text or a "
                              "smaller -c")
    n_chunk = tokens.size // n_ctx if n_chunks is None else min(n_chunks, tokens.size // n_ctx)
    log(f"perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}, "
        f"batch_size={runner.model.n_batch}")
    base = None
    if base_path is not None:
        log(f"perplexity: saving all logits to {base_path}")
        try:
            base = open(base_path, "wb")
        except OSError as err:
            raise PerplexityError(f"cannot write {base_path}: {err.strerror}") from None
        write_base_header(base, n_ctx, runner.n_vocab, tokens[:n_chunk * n_ctx])
    stats = NllStats()
    try:
        for i in range(n_chunk):
            t_start = time.perf_counter()
            logits, targets = runner.scored_logits(tokens, i)
            if i == 0:
                log_eta("perplexity", time.perf_counter() - t_start, n_chunk)
            if base is not None:
                for rows in row_blocks(len(logits)):
                    base.write(quantize_rows(logits[rows]).tobytes())
            for rows in row_blocks(len(logits)):
                stats.add(token_nll(logits[rows], targets[rows]))
            out(f"[{i + 1}]{stats.ppl:.4f},")
    finally:
        if base is not None:
            base.close()
    out("\n")
    error = stats.ppl_error()
    if error is None:
        log("perplexity: unexpected negative standard deviation of log(prob)")
    else:
        out(f"Final estimate: PPL = {stats.ppl:.4f} +/- {error:.5f}\n")
    return stats


def chunk_row(i: int, kl: KlStats) -> str:
    """One line of llama-perplexity's per-chunk KL table."""
    n = kl.count
    log_ppl, log_ppl_err = mean_and_uncertainty(kl.nll.total, kl.nll.total2, n)
    ratio, ratio_err = kl.log_ppl_ratio()
    kld = np.concatenate(kl.kld)
    kld_mean, kld_err = mean_and_uncertainty(float(kld.sum()), float((kld * kld).sum()), n)
    rms, rms_err = p_diff_rms(kl)
    top = kl.n_same_top / n
    top_err = np.sqrt(top * (1 - top) / (n - 1))
    ppl = np.exp(log_ppl)
    return (f"{i + 1:4d}    {ppl:9.4f} ± {ppl * log_ppl_err:9.4f}    {ratio:10.5f} ± {ratio_err:10.5f}"
            f"    {kld_mean:10.5f} ± {kld_err:10.5f}    {100 * rms:6.3f} ± {100 * rms_err:6.3f} %"
            f"    {100 * top:6.3f} ± {100 * top_err:6.3f} %\n")


def p_diff_rms(kl: KlStats) -> tuple[float, float]:
    p_diff2 = np.concatenate(kl.p_diff) ** 2
    mse, mse_err = mean_and_uncertainty(float(p_diff2.sum()), float((p_diff2 ** 2).sum()), kl.count)
    rms = float(np.sqrt(mse))
    return rms, 0.5 / rms * mse_err if rms > 0 else 0.0


def run_kl_divergence(runner: ChunkRunner, base: BaseFile, n_chunks: Optional[int]) -> KlStats:
    n_chunk = base.n_chunk if n_chunks is None else min(n_chunks, base.n_chunk)
    log(f"kl_divergence: computing over {n_chunk} chunks, n_ctx={base.n_ctx}, "
        f"batch_size={runner.model.n_batch}")
    kl = KlStats()
    for i in range(n_chunk):
        t_start = time.perf_counter()
        logits, targets = runner.scored_logits(base.tokens, i)
        if i == 0:
            log_eta("kl_divergence", time.perf_counter() - t_start, n_chunk)
            out("\nchunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
                "              Δp RMS            Same top p\n")
        base_rows = base.read_chunk(i)
        for rows in row_blocks(len(logits)):
            kl.add(logits[rows], base_rows[rows], targets[rows])
        out(chunk_row(i, kl))
    out("\n")
    if kl.count >= 100:  # llama-perplexity's floor for the statistics
        out(kl_summary(kl))
    return kl


def kl_summary(kl: KlStats) -> str:
    """llama-perplexity's closing statistics of --kl-divergence."""
    n = kl.count
    log_ppl, log_ppl_err = mean_and_uncertainty(kl.nll.total, kl.nll.total2, n)
    log_base, log_base_err = mean_and_uncertainty(kl.nll_base.total, kl.nll_base.total2, n)
    ppl, ppl_base = np.exp(log_ppl), np.exp(log_base)
    ppl_err, ppl_base_err = ppl * log_ppl_err, ppl_base * log_base_err
    cov = kl.log_ppl_covariance()
    cor = cov / (log_ppl_err * log_base_err) if log_ppl_err * log_base_err > 0 else 0.0
    ratio, ratio_err = kl.log_ppl_ratio()
    ppl_cov = ppl * ppl_base * cov
    diff_err = np.sqrt(max(ppl_err ** 2 + ppl_base_err ** 2 - 2 * ppl_cov, 0.0))
    kld = np.sort(np.concatenate(kl.kld))
    p_diff = np.sort(np.concatenate(kl.p_diff))
    kld_mean, kld_err = mean_and_uncertainty(float(kld.sum()), float((kld * kld).sum()), n)
    dp_mean, dp_err = mean_and_uncertainty(float(p_diff.sum()), float((p_diff ** 2).sum()), n)
    rms, rms_err = p_diff_rms(kl)
    top = kl.n_same_top / n
    lines = [
        "====== Perplexity statistics ======",
        f"Mean PPL(Q)                   : {ppl:10.6f} ± {ppl_err:10.6f}",
        f"Mean PPL(base)                : {ppl_base:10.6f} ± {ppl_base_err:10.6f}",
        f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * cor:6.2f}%",
        f"Mean ln(PPL(Q)/PPL(base))     : {ratio:10.6f} ± {ratio_err:10.6f}",
        f"Mean PPL(Q)/PPL(base)         : {np.exp(ratio):10.6f} ± {np.exp(ratio) * ratio_err:10.6f}",
        f"Mean PPL(Q)-PPL(base)         : {ppl - ppl_base:10.6f} ± {diff_err:10.6f}",
        "",
        "====== KL divergence statistics ======",
        f"Mean    KLD: {kld_mean:10.6f} ± {kld_err:10.6f}",
        f"Maximum KLD: {kld[-1]:10.6f}",
        *(f"{label}   KLD: {percentile(kld, q):10.6f}"
          for label, q in (("99.9%", 0.999), ("99.0%", 0.99), ("95.0%", 0.95), ("90.0%", 0.9))),
        f"Median  KLD: {median(kld):10.6f}",
        *(f"{label}   KLD: {percentile(kld, q):10.6f}"
          for label, q in (("10.0%", 0.1), (" 5.0%", 0.05), (" 1.0%", 0.01), (" 0.1%", 0.001))),
        f"Minimum KLD: {kld[0]:10.6f}",
        "",
        "====== Token probability statistics ======",
        f"Mean    Δp: {100 * dp_mean:6.3f} ± {100 * dp_err:5.3f} %",
        f"Maximum Δp: {100 * p_diff[-1]:6.3f}%",
        *(f"{label}   Δp: {100 * percentile(p_diff, q):6.3f}%"
          for label, q in (("99.9%", 0.999), ("99.0%", 0.99), ("95.0%", 0.95), ("90.0%", 0.9),
                           ("75.0%", 0.75))),
        f"Median  Δp: {100 * median(p_diff):6.3f}%",
        *(f"{label}   Δp: {100 * percentile(p_diff, q):6.3f}%"
          for label, q in (("25.0%", 0.25), ("10.0%", 0.1), (" 5.0%", 0.05), (" 1.0%", 0.01),
                           (" 0.1%", 0.001))),
        f"Minimum Δp: {100 * p_diff[0]:6.3f}%",
        f"RMS Δp    : {100 * rms:6.3f} ± {100 * rms_err:5.3f} %",
        f"Same top p: {100 * top:6.3f} ± {100 * np.sqrt(top * (1 - top) / (n - 1)):5.3f} %",
    ]
    return "\n".join(lines) + "\n"


def perplexity(
    model: Annotated[Optional[str], typer.Argument(
        help="a .gguf file or hf://USER/REPO[:QUANT] (default: the demo model)",
        show_default=False)] = None,
    file: Annotated[Optional[Path], typer.Option(
        "-f", "--file", help="the text to score (UTF-8; one trailing newline is dropped)",
        show_default=False)] = None,
    ctx_size: Annotated[Optional[int], typer.Option(
        "-c", "--ctx-size", min=2, help=f"tokens per chunk \\[default: {DEFAULT_N_CTX}; with "
        "--kl-divergence, the base file's]", show_default=False)] = None,
    chunks: Annotated[Optional[int], typer.Option(
        "--chunks", min=1, help="score only the first N chunks \\[default: all]",
        show_default=False)] = None,
    batch_size: Annotated[Optional[int], typer.Option(
        "-b", "--batch-size", min=1, help="rows per forward pass (at most the chunk)",
        show_default=False)] = None,
    threads: Annotated[Optional[int], typer.Option(
        "-t", "--threads", help="threads (default: physical cores)", show_default=False)] = None,
    device: Annotated[Optional[str], typer.Option(
        "--device", help=("device to run on: cpu, vulkan or vulkan:N "
                          "\\[default: $EMBER_DEVICE, else the first GPU, else the CPU]"),
        show_default=False)] = None,
    kl_divergence_base: Annotated[Optional[Path], typer.Option(
        "--kl-divergence-base", help="the base log-probabilities file: written while scoring "
        "-f, or read with --kl-divergence (llama-perplexity's format; either engine reads "
        "the other's)", show_default=False)] = None,
    kl_divergence: Annotated[bool, typer.Option(
        "--kl-divergence", help="compare this model with the base file's: KL divergence, "
        "top-token agreement, Δp and the PPL ratio (the tokens come from the file; no -f)")] = False,
) -> None:
    """Perplexity of MODEL over a text with llama-perplexity's protocol: chunks of -c tokens,
    each evaluated alone from BOS, the second half of each scored; prints the running PPL per
    chunk and 'Final estimate: PPL = X +/- err' (the text must fill 2 chunks at least).
    --kl-divergence-base FILE also saves the
    log-probabilities; a later run of another model (a quantization of it) with
    --kl-divergence --kl-divergence-base FILE reports how far it is from them."""
    from ember.hub.models import resolve_model

    if kl_divergence:
        if kl_divergence_base is None:
            raise PerplexityError("--kl-divergence reads the base model's log-probabilities: "
                                  "give their file with --kl-divergence-base FILE")
        if file is not None:
            raise PerplexityError("--kl-divergence scores the tokens saved in the base file: "
                                  "leave -f out")
        base = BaseFile.open(kl_divergence_base)
        try:
            if ctx_size is not None and ctx_size != base.n_ctx:
                raise PerplexityError(f"{kl_divergence_base} holds chunks of n_ctx {base.n_ctx}, "
                                      f"not the {ctx_size} of -c (leave -c out to use the file's)")
            runner = ChunkRunner(resolve_model(model), base.n_ctx, batch_size, threads, device)
            if base.n_vocab != runner.n_vocab:
                raise PerplexityError(f"{kl_divergence_base} is of a vocabulary of "
                                      f"{base.n_vocab} tokens, the model's has {runner.n_vocab}")
            run_kl_divergence(runner, base, chunks)
        finally:
            base.close()
        return
    if file is None:
        raise PerplexityError("perplexity needs the text to score: -f FILE")
    text = read_text(file)
    runner = ChunkRunner(resolve_model(model), ctx_size or DEFAULT_N_CTX, batch_size, threads,
                         device)
    run_perplexity(runner, text, chunks, kl_divergence_base)


def register(app: typer.Typer) -> None:
    app.command()(perplexity)
