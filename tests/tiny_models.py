"""Tiny random transformers checkpoints of each supported architecture, written to GGUF the way
llama.cpp's converter writes them (tensor names, metadata keys, Q/K row permutation for llama).

The weights are drawn with a larger spread than transformers' initializer (std 0.02 gives
near-uniform logits, which would hide most bugs), and norm weights and biases are random too,
so every tensor the engine reads changes the logits.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import torch

from ember.convert.llama import llama3_rope_factors

ARCHS = ("llama", "qwen2", "qwen3")


def make_model(arch: str, *, tied: bool = False, rope: dict | None = None, seed: int = 0,
               head_dim: int | None = None, hidden_size: int = 64, intermediate_size: int = 96,
               vocab_size: int = 256):
    """A random 2-layer model of `arch` with GQA (4 query heads, 2 kv heads), vocab 256 unless
    vocab_size says (512: stories260K's tokenizer's, for checkpoints ember.convert reads).

    rope: transformers rope_parameters (rope_theta is added); head_dim: overrides
    hidden_size / heads (qwen3 sets it explicitly in its config anyway); hidden_size and
    intermediate_size: 256 and 512 give rows of whole k-quant blocks.
    """
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    torch.manual_seed(seed)
    rope_parameters = {"rope_type": "default", "rope_theta": 10000.0, **(rope or {})}
    common = {
        "vocab_size": vocab_size, "hidden_size": hidden_size, "intermediate_size": intermediate_size,
        "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": tied, "rope_parameters": rope_parameters,
    }
    if arch == "llama":
        config, cls = LlamaConfig(**common, head_dim=head_dim), LlamaForCausalLM
    elif arch == "qwen2":
        config, cls = Qwen2Config(**common), Qwen2ForCausalLM
    elif arch == "qwen3":
        config, cls = Qwen3Config(**common, head_dim=head_dim or 32), Qwen3ForCausalLM
    else:
        raise ValueError(arch)
    model = cls(config).eval()
    spread_weights(model)
    return model


def spread_weights(model: torch.nn.Module, norm_center: float = 1.0) -> None:
    """Re-draws every parameter with a larger spread than transformers' initializer (std 0.02
    gives near-uniform logits that hide bugs): norms norm_center +- 0.2, biases 0.3 and matrices
    1/sqrt(fan-in), so every tensor (routers included) moves the logits."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(norm_center + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]))


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.LlamaModel.permute: HF's rotate-half row order to the
    interleaved pairs llama.cpp's "normal" RoPE rotates."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_gguf(model, path: Path, arch: str, *, file_arch: str | None = None,
               edit: Callable[[str, np.ndarray], np.ndarray | None] | None = None) -> Path:
    """Writes `model` to an f32 GGUF at `path` with llama.cpp's names and metadata keys.

    For error tests: file_arch replaces general.architecture (and the metadata key prefix);
    edit(name, array) may return a replacement array, or None to leave the tensor out.
    """
    cfg = model.config
    n_head, n_head_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_head
    rope = cfg.rope_parameters
    w = gguf.GGUFWriter(str(path), file_arch or arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_vocab_size(cfg.vocab_size)
    if head_dim != cfg.hidden_size // n_head:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    def add(name: str, t: torch.Tensor | np.ndarray) -> None:
        a = np.ascontiguousarray(t.detach().float().numpy() if isinstance(t, torch.Tensor) else t)
        if edit is not None:
            a = edit(name, a)
        if a is not None:
            w.add_tensor(name, a)

    sd = model.state_dict()
    add("token_embd.weight", sd["model.embed_tokens.weight"])
    add("output_norm.weight", sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        add("output.weight", sd["lm_head.weight"])
    if rope.get("rope_type") == "llama3":  # the converter's divisors; transformers' logits check them
        add("rope_freqs.weight", llama3_rope_factors(rope["rope_theta"], head_dim, rope))
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        q = sd[p + "self_attn.q_proj.weight"].numpy()
        k = sd[p + "self_attn.k_proj.weight"].numpy()
        if arch == "llama":
            q, k = _permute(q, n_head), _permute(k, n_head_kv)
        add(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        add(b + "attn_q.weight", q)
        add(b + "attn_k.weight", k)
        add(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        for proj in ("q", "k", "v"):
            bias = sd.get(p + f"self_attn.{proj}_proj.bias")
            if bias is not None:
                add(b + f"attn_{proj}.bias", bias)
        if arch == "qwen3":
            add(b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
            add(b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
        add(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        add(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        add(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        add(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        add(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def hf_logits(model, tokens: list[int]) -> np.ndarray:
    """transformers' logits [n_tokens, n_vocab] for one sequence."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float().numpy()
