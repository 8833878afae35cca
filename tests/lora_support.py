"""A tiny random Llama checkpoint with PEFT LoRA adapters on it, converted by ember.convert (the
base to an f32 GGUF, each adapter to a LoRA GGUF), and transformers + PEFT's logits to hold
ember's to. Used by tests/convert/test_convert_lora.py, tests/engine/test_engine_lora.py and
tests/server/test_server_lora.py."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from checkpoints import N_VOCAB, save_checkpoint
from tiny_models import spread_weights

from ember.convert import convert, convert_lora

BASE = {"vocab_size": N_VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2}

# Two adapters unlike each other: every projection at rank 4 (alpha / rank = 2), and a rank-8 one
# on q, v and down only (alpha / rank = 0.5).
ADAPTERS = {
    "all": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj",
                                                         "gate_proj", "up_proj", "down_proj"]},
    "qvd": {"r": 8, "lora_alpha": 4, "target_modules": ["q_proj", "v_proj", "down_proj"]},
}


@dataclass
class LoraCase:
    base_hf: transformers.PreTrainedModel
    peft: dict[str, object]       # adapter name -> its PeftModel (a copy of the base each)
    base_dir: Path
    adapter_dirs: dict[str, Path]
    base_gguf: Path
    adapter_ggufs: dict[str, Path]

    def hf_logits(self, adapter: str | None, tokens: list[int], scale: float = 1.0) -> np.ndarray:
        """transformers' (+ PEFT's) logits [n_tokens, n_vocab], the adapter's product times scale."""
        model = self.base_hf if adapter is None else self.peft[adapter]
        scaled = []
        if adapter is not None and scale != 1.0:
            for m in model.modules():
                if hasattr(m, "scaling") and isinstance(m.scaling, dict) and "default" in m.scaling:
                    scaled.append((m, m.scaling["default"]))
                    m.scaling["default"] *= scale
        try:
            with torch.no_grad():
                return model(torch.tensor([tokens])).logits[0].float().numpy()
        finally:
            for m, value in scaled:
                m.scaling["default"] = value


def random_lora(base: transformers.PreTrainedModel, spec: dict, seed: int):
    """A PEFT model of `spec` over a copy of `base`, A and B drawn at random (PEFT starts B at
    zero, which would change nothing), so that the adapter moves the logits by O(1)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(copy.deepcopy(base), LoraConfig(**spec, lora_dropout=0.0))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[1]))
            elif "lora_B" in name:
                p.copy_(0.5 * torch.randn_like(p) / math.sqrt(p.shape[1]))
    return model.eval()


def build_lora_case(tmp: Path) -> LoraCase:
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**BASE)).eval()
    spread_weights(base)
    base_dir = save_checkpoint(base, tmp / "base")
    base_gguf = tmp / "base.gguf"
    convert(base_dir, base_gguf, "f32", progress=False)
    peft, dirs, ggufs = {}, {}, {}
    for i, (name, spec) in enumerate(ADAPTERS.items()):
        peft[name] = random_lora(base, spec, seed=10 + i)
        dirs[name] = tmp / f"adapter-{name}"
        peft[name].save_pretrained(dirs[name])
        ggufs[name] = tmp / f"adapter-{name}.gguf"
        convert_lora(dirs[name], ggufs[name], "f32", base=str(base_dir), progress=False)
    return LoraCase(base, peft, base_dir, dirs, base_gguf, ggufs)


_BUILT: list[LoraCase] = []  # built once per test session, whichever module asks first


def lora_case_fixture():
    """A module's `lora_case` fixture (`lora_case = lora_case_fixture()`): the case, built on
    first use in the session."""

    @pytest.fixture(scope="module")
    def lora_case(tmp_path_factory: pytest.TempPathFactory) -> LoraCase:
        if not _BUILT:
            _BUILT.append(build_lora_case(tmp_path_factory.mktemp("lora")))
        return _BUILT[0]

    return lora_case
