"""A tiny random Qwen2.5-VL checkpoint (tests/model/test_model_qwen25vl.py,
tests/convert/test_convert_qwen25vl.py): a 2-layer Qwen2 text model with M-RoPE sections (2, 3, 3)
over head_dim 16, and a 2-block vision tower (head_dim 16, the second block full attention, the
first windowed with windows of one merged token, so window and full attention differ even on a
56x56 image: 4x4 patches, 2x2 merged tokens).

Its tokenizer is stories260K's SentencePiece vocabulary (512 tokens) with the three vision
tokens written over its last ids, as a published checkpoint's tokenizer_config.json adds them.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import torch

DATA = Path(__file__).parent / "data"
N_VOCAB = 512
VISION_START, VISION_END, IMAGE_PAD = 509, 510, 511
VISION_TOKENS = {VISION_START: "<|vision_start|>", VISION_END: "<|vision_end|>", IMAGE_PAD: "<|image_pad|>"}
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)  # Qwen2.5-VL's preprocessor_config.json
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)
PATCH, MERGE, TEMPORAL = 14, 2, 2


def make_qwen25vl(seed: int = 0):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": N_VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
            "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        },
        vision_config={
            "depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 64,
            "patch_size": PATCH, "spatial_merge_size": MERGE, "temporal_patch_size": TEMPORAL,
            "window_size": PATCH * MERGE, "fullatt_block_indexes": [1], "in_channels": 3,
        },
        image_token_id=IMAGE_PAD, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
        video_token_id=508, tie_word_embeddings=False)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_q" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn_like(p))
            else:  # matrices (the patch embedding's conv too): 1/sqrt(fan-in)
                p.copy_(torch.randn_like(p) / math.sqrt(p[0].numel()))
    return model


def save_qwen25vl(model, folder: Path) -> Path:
    """`model` saved with stories260K's tokenizer, the vision tokens and a preprocessor config."""
    model.save_pretrained(folder)
    shutil.copy(DATA / "stories260K-hf" / "tokenizer.model", folder / "tokenizer.model")
    tokenizer_config = json.loads((DATA / "stories260K-hf" / "tokenizer_config.json").read_text())
    tokenizer_config["added_tokens_decoder"] = {
        str(i): {"content": text, "special": True} for i, text in VISION_TOKENS.items()}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "image_mean": IMAGE_MEAN, "image_std": IMAGE_STD,
        "patch_size": PATCH, "merge_size": MERGE, "temporal_patch_size": TEMPORAL,
        "min_pixels": 4 * 28 * 28, "max_pixels": 64 * 28 * 28}))
    return folder


def hf_pixel_values(pixels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2VLImageProcessor's pixel_values [n_patches, 3 * 2 * 14 * 14] and image_grid_thw [1, 3]
    of normalized planar pixels [3, H, W] (H, W multiples of 28): the frame twice (an image's two
    temporal frames), patches in merged-block order, each flattened as (channel, frame, y, x)."""
    c, h, w = pixels.shape
    gh, gw = h // PATCH, w // PATCH
    frames = np.stack([pixels, pixels])                              # [t, c, h, w]
    x = frames.reshape(1, TEMPORAL, c, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)                       # grid_t, bh, bw, dy, dx, c, t, py, px
    flat = x.reshape(gh * gw, c * TEMPORAL * PATCH * PATCH)
    return torch.from_numpy(np.ascontiguousarray(flat)), torch.tensor([[1, gh, gw]])
