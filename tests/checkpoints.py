"""Tiny random Hugging Face checkpoints saved as folders for ember.convert (the MoE models,
SmolLM3, Phi-3 with LongRoPE, a BERT), the test prompt, and the bounds their converted logits are
held to against transformers'.
tests/tiny_models.py makes the models these folders come from and writes GGUF files by hand."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
import transformers
from tiny_models import spread_weights

DATA = Path(__file__).parent / "data"
N_VOCAB = 512  # stories260K's SentencePiece vocabulary serves as every causal model's tokenizer

# ember keeps the KV cache in f16, so even with identical f32 weights each cached K/V value is
# rounded by up to 2^-11 relative; through two layers that moves logits by a few 1e-3 of the
# largest logit (tests/model/test_model_tiny.py measures the same), while a wrong permutation, norm,
# bias or RoPE setting moves them by O(1). 4e-3 of the largest logit separates the two.
F32_REL = 4e-3

# What ember adds on top of the stored weights: the f16 KV cache (F32_REL above) and, for
# quantized weights, 8-bit quantization of the activations in every matmul (q8_0 blocks, q8_K
# for k-quants, as llama.cpp does). Each activation moves by up to 1/254 of its 32-block's
# largest value (~0.6% RMS per element); eight matmuls deep (q/k/v/o, gate/up/down, output)
# that adds up to ~2% of the logits' RMS, whatever the weight type: measured 1.6-2.2% RMS and
# 2.0-3.0% of the largest logit for q8_0, q4_0, q4_k_m and q6_k. The bounds leave ~2x room; a
# misread block or a misplaced tensor moves logits by tens of percent.
TWIN_RMS, TWIN_MAX = 0.04, 0.06


def rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    """The RMS of a - b relative to b's."""
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def tokens_for_test(n: int = 100, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, N_VOCAB, n).tolist()


def save_checkpoint(model, folder: Path, dtype=None) -> Path:
    """`model` saved to `folder` (cast to dtype first, if given) with stories260K's tokenizer."""
    if dtype is not None:
        model = copy.deepcopy(model).to(dtype)
    model.save_pretrained(folder)
    for name in ("tokenizer.model", "tokenizer_config.json"):
        shutil.copy(DATA / "stories260K-hf" / name, folder / name)
    return folder


def built_fixture(make_model: Callable[[str], object]):
    """A module-scoped fixture `built`: case -> (transformers model of make_model(case), its
    checkpoint folder), each case built on first use. A module takes it as
    `built = built_fixture(make_model)`."""

    @pytest.fixture(scope="module")
    def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple]:
        cache: dict[str, tuple] = {}

        def get(case: str) -> tuple:
            if case not in cache:
                model = make_model(case)
                cache[case] = (model, save_checkpoint(model, tmp_path_factory.mktemp(case)))
            return cache[case]

        return get

    return built


# --- mixture of experts (tests/model/test_model_moe.py) ----------------------------------------

# Rows of 256 (hidden and expert widths) so that q4_k_m really uses k-quants on the experts.
# 8 experts, 2 chosen per token: llama.cpp's quantizer has rules for exactly 8 experts.
MOE_COMMON = {"vocab_size": N_VOCAB, "hidden_size": 256, "intermediate_size": 512,
              "moe_intermediate_size": 256, "num_experts": 8, "num_experts_per_tok": 2,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "bos_token_id": 1,
              "eos_token_id": 2}

MOE_CASES: dict[str, dict] = {
    # Qwen2-MoE: Q/K/V biases, a sigmoid-gated shared expert; top-k weights as the softmax gave.
    "qwen2moe": {"cls": "Qwen2MoeForCausalLM", "shared_expert_intermediate_size": 512},
    # Renormalised top-k weights, which Qwen2-MoE does only when its config says so.
    "qwen2moe-norm": {"cls": "Qwen2MoeForCausalLM", "shared_expert_intermediate_size": 512,
                      "norm_topk_prob": True},
    # Qwen3-MoE: Q/K norms, explicit head_dim, renormalised top-k weights (as published models).
    "qwen3moe": {"cls": "Qwen3MoeForCausalLM", "head_dim": 64, "norm_topk_prob": True},
}


def make_moe_model(case: str, seed: int = 0):
    """A random transformers model of MOE_CASES[case], weights spread as tiny_models does."""
    spec = dict(MOE_CASES[case])
    cls_name = spec.pop("cls")
    config = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))(**{**MOE_COMMON, **spec})
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(config).eval()
    spread_weights(model)
    return model


# --- SmolLM3's NoPE layers, Phi-3's LongRoPE (tests/model/test_model_nope_longrope.py) ---------

# Hidden 64, 4 query heads of 16 dims, 2 kv heads: small enough for 100 tokens in well under a second.
SMALL_COMMON = {"vocab_size": N_VOCAB, "hidden_size": 64, "intermediate_size": 96,
                "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
                "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None}

# SmolLM3: 1 = the layer rotates (transformers' no_rope_layers), 0 = NoPE. Not llama.cpp's
# every-4th pattern, so the file's rope_pattern must be read.
NOPE_FLAGS = [1, 0, 1, 0]

# Phi-3 LongRoPE: 12 of 16 head dims rotate (partial_rotary_factor 0.75, as Phi-4-mini), so 6
# pairs, each with its own short and long divisor; an original context of 32 tokens within a
# 128-token one: attention factor sqrt(1 + ln 4 / ln 32) = 1.18.
ORIGINAL_CTX = 32
SHORT = [1.0, 1.3, 1.9, 2.6, 4.1, 7.5]
LONG = [1.1, 2.2, 4.5, 9.0, 19.0, 41.0]


def make_smollm3(flags: list[int] = NOPE_FLAGS, seed: int = 0):
    """A random SmolLM3 of len(flags) layers, flags[i] == 1 where layer i rotates."""
    config = transformers.SmolLM3Config(**SMALL_COMMON, num_hidden_layers=len(flags),
                                        max_position_embeddings=512, no_rope_layers=flags)
    torch.manual_seed(seed)
    model = transformers.SmolLM3ForCausalLM(config).eval()
    spread_weights(model)
    return model


def make_phi3_longrope(seed: int = 0, original_ctx: int = ORIGINAL_CTX):
    """A random 2-layer Phi-3 with LongRoPE (SHORT and LONG factors), trained for original_ctx
    tokens and extended to 4 times that."""
    config = transformers.Phi3Config(
        **SMALL_COMMON, num_hidden_layers=2, max_position_embeddings=4 * original_ctx,
        original_max_position_embeddings=original_ctx,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                         "short_factor": SHORT, "long_factor": LONG})
    torch.manual_seed(seed)
    model = transformers.Phi3ForCausalLM(config).eval()
    spread_weights(model)
    return model


# --- BERT (tests/model/test_model_bert.py) ------------------------------------------------------

BERT_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(115)]


def write_wordpiece_tokenizer(folder: Path, vocab: list[str]) -> None:
    """tokenizer.json and tokenizer_config.json of a WordPiece tokenizer over `vocab`, whose
    first five entries are the special [PAD] [UNK] [CLS] [SEP] [MASK]."""
    tokenizer = {"version": "1.0", "added_tokens": [{"id": i, "content": t, "special": True}
                                                    for i, t in enumerate(vocab[:5])],
                 "normalizer": None, "pre_tokenizer": {"type": "BertPreTokenizer"},
                 "model": {"type": "WordPiece", "unk_token": "[UNK]",
                           "continuing_subword_prefix": "##",
                           "vocab": {t: i for i, t in enumerate(vocab)}}}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    (folder / "tokenizer_config.json").write_text(json.dumps({"cls_token": "[CLS]", "sep_token": "[SEP]",
                                                              "unk_token": "[UNK]", "pad_token": "[PAD]"}))


def tiny_bert(folder: Path, pooling: str) -> Path:
    """A random 2-layer BertModel over BERT_VOCAB saved as a sentence-transformers folder whose
    pooling is `pooling` ("cls_token", "mean_tokens")."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(BERT_VOCAB), hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=96,
                                     max_position_embeddings=40, type_vocab_size=2)
    model = transformers.BertModel(config).eval()
    with torch.no_grad():  # random LayerNorms too, so a swapped weight and bias shows
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("weight") else 0.0))
    model.save_pretrained(folder)
    write_wordpiece_tokenizer(folder, BERT_VOCAB)
    (folder / "modules.json").write_text(json.dumps([{"idx": 1, "name": "1", "path": "1_Pooling",
                                                      "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({f"pooling_mode_{pooling}": True}))
    return folder
