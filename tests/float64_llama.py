"""The true forward pass of a llama GGUF file: every tensor dequantized by gguf-py and the whole
pass in numpy float64, so it carries no rounding of its own worth measuring. What the backends'
own rounding (the CPU's q8 activations, Vulkan's order of sums) costs is their distance from it
(tests/vulkan/test_vulkan_agreement.py, benchmarks/vulkan_agreement.py)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


class Float64Llama:
    """llama: GQA, SiLU MLP, RMSNorm, "normal" RoPE over interleaved pairs (2i, 2i+1) (the
    rotation llama.cpp's converter permutes Q/K rows for), the output tied to the embedding when
    the file has no output.weight. No rope scaling, no biases: a file with them is refused."""

    def __init__(self, path: Path) -> None:
        reader = gguf.GGUFReader(path)
        arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
        if arch != "llama":
            raise ValueError(f"{path}: architecture {arch!r}, this reference runs llama only")

        def meta(key: str, default: float | None = None) -> float:
            f = reader.fields.get(f"{arch}.{key}")
            if f is None and default is None:
                raise ValueError(f"{path}: no {arch}.{key}")
            return default if f is None else f.contents()

        self.n_layer = int(meta("block_count"))
        self.n_head = int(meta("attention.head_count"))
        self.n_head_kv = int(meta("attention.head_count_kv"))
        n_embd = int(meta("embedding_length"))
        self.head_dim = int(meta("attention.key_length", n_embd // self.n_head))
        self.n_rot = int(meta("rope.dimension_count", self.head_dim))
        self.eps = float(meta("attention.layer_norm_rms_epsilon"))
        self.theta = float(meta("rope.freq_base", 10000.0))
        if f"{arch}.rope.scaling.type" in reader.fields:
            raise ValueError(f"{path}: rope scaling is not modelled by this reference")
        # name -> float64 [rows, cols] (GGUF lists a tensor's dims innermost first).
        self.w = {t.name: gguf.dequantize(t.data, t.tensor_type).astype(np.float64)
                  .reshape([int(d) for d in reversed(t.shape)]) for t in reader.tensors}
        if any(name.endswith(".bias") for name in self.w):
            raise ValueError(f"{path}: biases are not modelled by this reference")
        self.out = self.w.get("output.weight", self.w["token_embd.weight"])  # [n_vocab, n_embd]

    def rms_norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def rope(self, x: np.ndarray) -> np.ndarray:
        """x [n_tok, n_heads, head_dim] at positions 0..n_tok-1, pairs (2i, 2i+1) of the first n_rot dims."""
        inv_freq = self.theta ** (-np.arange(0, self.n_rot, 2, dtype=np.float64) / self.n_rot)
        angle = np.arange(x.shape[0], dtype=np.float64)[:, None] * inv_freq  # [n_tok, n_rot / 2]
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        a, b = x[..., 0:self.n_rot:2], x[..., 1:self.n_rot:2]
        out = x.copy()
        out[..., 0:self.n_rot:2] = a * cos - b * sin
        out[..., 1:self.n_rot:2] = a * sin + b * cos
        return out

    def logits(self, tokens: list[int]) -> np.ndarray:
        """[n_tok, n_vocab] logits of every position of `tokens`, one causal pass from position 0."""
        n, w = len(tokens), self.w
        x = w["token_embd.weight"][tokens]  # [n, n_embd]
        group = self.n_head // self.n_head_kv
        causal = np.triu(np.full((n, n), -np.inf), 1)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self.rms_norm(x, w[p + "attn_norm.weight"])
            q = self.rope((h @ w[p + "attn_q.weight"].T).reshape(n, self.n_head, self.head_dim))
            k = self.rope((h @ w[p + "attn_k.weight"].T).reshape(n, self.n_head_kv, self.head_dim))
            v = (h @ w[p + "attn_v.weight"].T).reshape(n, self.n_head_kv, self.head_dim)
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # [n, n_head, head_dim]
            scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(self.head_dim) + causal
            probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, self.n_head * self.head_dim)
            x = x + attn @ w[p + "attn_output.weight"].T
            h = self.rms_norm(x, w[p + "ffn_norm.weight"])
            gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
        return self.rms_norm(x, w["output_norm.weight"]) @ self.out.T


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def distances(ref: np.ndarray, got: np.ndarray, targets: np.ndarray, top_k: int) -> dict[str, np.ndarray]:
    """Per position of logits ref and got [n_tok, n_vocab], on log-probabilities: |Δ| at the
    position's target token (the next token of the sequence), max |Δ| over ref's top_k tokens,
    and KL(ref ‖ got) in nats over the whole vocabulary."""
    lr, lg = log_softmax(ref), log_softmax(got)
    top = np.argsort(-lr, axis=-1)[:, :top_k]
    return {"target": np.abs(lr - lg)[np.arange(len(targets)), targets],
            "top_k": np.abs(np.take_along_axis(lr - lg, top, axis=-1)).max(axis=-1),
            "kl": (np.exp(lr) * (lr - lg)).sum(axis=-1)}
