"""Tiny random vision checkpoints for the vision tests (tests/vision/): a Gemma 3 with its SigLIP
tower, saved with stories260K's SentencePiece tokenizer plus Gemma 3's three image tokens as
added tokens (ids 512-514, past the 512 pieces), and converted with ember convert."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
import transformers
from checkpoints import DATA, N_VOCAB

BOI, EOI, IMAGE = N_VOCAB, N_VOCAB + 1, N_VOCAB + 2  # <start_of_image>, <end_of_image>, soft token
IMAGE_TOKEN_TEXTS = {BOI: "<start_of_image>", EOI: "<end_of_image>", IMAGE: "<image_soft_token>"}

# 64x64 pixels in 8x8 patches: 8 patches a side, pooled 2x2 into 16 image tokens (the real
# models: 896 / 14 = 64 a side, pooled 4x4 into 256). Two layers each, widths that keep the
# vision heads (16) and the text heads (32) whole for the f16 KV cache.
GEMMA3_TEXT = {"vocab_size": N_VOCAB + 3, "hidden_size": 64, "intermediate_size": 128,
               "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
               "head_dim": 32, "query_pre_attn_scalar": 32, "max_position_embeddings": 512,
               "sliding_window": 512, "rms_norm_eps": 1e-6, "bos_token_id": 1,
               "eos_token_id": 2, "pad_token_id": 0}
GEMMA3_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 2, "image_size": 64, "patch_size": 8,
                 "layer_norm_eps": 1e-6}
GEMMA3_MM_TOKENS = 16


def spread(model: torch.nn.Module, seed: int = 0) -> None:
    """Weights of O(1) effect (transformers' init of 0.02 leaves a tiny model's logits nearly
    flat, where a wrong norm or position would hide): normal(0, 1/sqrt(fan_in)) matrices, norm
    weights around their identity (Gemma's (1 + w): 0; LayerNorm's w: 1), biases of 0.1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                fan_in = p[0].numel() if "mm_input_projection" not in name else p.shape[0]
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
            elif "layer_norm" in name or "layernorm" in name and "vision" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def make_gemma3_vision(seed: int = 0) -> transformers.Gemma3ForConditionalGeneration:
    config = transformers.Gemma3Config(
        text_config=GEMMA3_TEXT, vision_config=GEMMA3_VISION,
        mm_tokens_per_image=GEMMA3_MM_TOKENS, boi_token_index=BOI, eoi_token_index=EOI,
        image_token_index=IMAGE)
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    spread(model, seed)
    return model


def save_gemma3_vision(model, folder: Path) -> Path:
    """The checkpoint folder: weights, stories260K's tokenizer with the image tokens added, the
    image processor's config."""
    model.save_pretrained(folder)
    shutil.copy(DATA / "stories260K-hf" / "tokenizer.model", folder / "tokenizer.model")
    config = json.loads((DATA / "stories260K-hf" / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {str(i): {"content": t, "special": True}
                                      for i, t in IMAGE_TOKEN_TEXTS.items()}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    # As published Gemma 3 folders have it (llama.cpp's converter reads the mean and std here).
    side = GEMMA3_VISION["image_size"]
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Gemma3ImageProcessor", "image_mean": [0.5] * 3,
        "image_std": [0.5] * 3, "image_seq_length": GEMMA3_MM_TOKENS, "resample": 2,
        "rescale_factor": 1 / 255, "size": {"height": side, "width": side}}))
    return folder


def sample_image(seed: int = 0, size: tuple[int, int] = (64, 64)) -> np.ndarray:
    """RGB pixels uint8 (height, width, 3): smooth gradients plus noise, so that every patch
    differs."""
    rng = np.random.default_rng(seed)
    h, w = size
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1),
                     (x + y) * 127 / max(w + h - 2, 1)], axis=-1)
    return np.clip(base + rng.normal(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)
