"""Tiny random transformers checkpoints of every supported architecture, converted by
ember.convert and run by ember's Model, against transformers' logits."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from checkpoints import (
    F32_REL,
    N_VOCAB,
    TWIN_MAX,
    TWIN_RMS,
    built_fixture,
    rel_rms,
    save_checkpoint,
    tokens_for_test,
)
from engine_support import reference_greedy, run_all, settled_stats, tokens_of
from tiny_models import hf_logits, spread_weights

from ember import _core
from ember.convert import convert

# Rows of 256 so that q4_k_m really uses k-quants (q4_k, and q6_k for attn_v / ffn_down / output
# in the layers llama.cpp gives more bits); qwen3 has its explicit head_dim (32, q width 128).
COMMON = {"vocab_size": N_VOCAB, "hidden_size": 256, "intermediate_size": 512,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "bos_token_id": 1,
          "eos_token_id": 2}

CASES: dict[str, dict] = {
    "llama": {"cls": "LlamaForCausalLM"},
    "llama-tied": {"cls": "LlamaForCausalLM", "tie_word_embeddings": True},
    "mistral": {"cls": "MistralForCausalLM"},
    "qwen2": {"cls": "Qwen2ForCausalLM"},
    "qwen2-tied": {"cls": "Qwen2ForCausalLM", "tie_word_embeddings": True},
    "qwen3": {"cls": "Qwen3ForCausalLM", "head_dim": 32},
    "qwen3-tied": {"cls": "Qwen3ForCausalLM", "head_dim": 32, "tie_word_embeddings": True},
    "llama-linear": {"cls": "LlamaForCausalLM",
                     "rope_parameters": {"rope_type": "linear", "factor": 4.0,
                                         "rope_theta": 10000.0}},
    # Gemma 3: local layers (window 16, so 100 tokens leave most keys outside it) between global
    # ones, each kind with its own RoPE base; head_dim 64 (query width 256 != hidden 256 / 4).
    "gemma3": {"cls": "Gemma3ForCausalLM", "config_cls": "Gemma3TextConfig", "head_dim": 64,
               "num_hidden_layers": 4, "sliding_window": 16, "query_pre_attn_scalar": 64,
               "layer_types": ["sliding_attention", "full_attention"] * 2,
               "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                   "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}},
    # Gemma 2: no Q/K norms; every other layer local (window 16 of 100 tokens, one RoPE base);
    # attention scores and logits soft-capped, with caps low enough for these random weights'
    # scores (a few units) and logits (~10) that tanh bends them (test_gemma2_softcaps_matter).
    "gemma2": {"cls": "Gemma2ForCausalLM", "head_dim": 64, "num_hidden_layers": 4, "sliding_window": 16,
               "query_pre_attn_scalar": 64, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 8.0},
    # Mistral with a window shorter than the prompt: every layer attends over the last 16 only.
    "mistral-window": {"cls": "MistralForCausalLM", "sliding_window": 16},
    "phi3": {"cls": "Phi3ForCausalLM", "pad_token_id": 0},
    "phi3-partial-rope": {"cls": "Phi3ForCausalLM", "pad_token_id": 0, "partial_rotary_factor": 0.5},
    "llama-llama3": {"cls": "LlamaForCausalLM",
                     "rope_parameters": {"rope_type": "llama3", "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 64,
                                         "rope_theta": 500000.0}},
}

GEMMA_TYPES = ("gemma3_text", "gemma2")  # transformers' model_type of the (1 + w)-norm families


def make_model(case: str, seed: int = 0):
    spec = dict(CASES[case])
    cls_name = spec.pop("cls")
    config_cls = getattr(transformers, spec.pop("config_cls", cls_name.replace("ForCausalLM", "Config")))
    config = config_cls(**{**COMMON, **spec})
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(config).eval()
    # Gemma's norms scale by 1 + w, the others' by w: either way a scale of 1 +- 0.2.
    spread_weights(model, norm_center=0.0 if config.model_type in GEMMA_TYPES else 1.0)
    return model


built = built_fixture(make_model)  # case -> (transformers model, checkpoint folder)


@pytest.mark.parametrize("case", list(CASES))
def test_f32_logits_match_transformers(case: str, built, tmp_path: Path) -> None:
    model, folder = built(case)
    out = tmp_path / "m.gguf"
    result = convert(folder, out, "f32", progress=False)
    arch = {"Llama": "llama", "Mistral": "llama", "Qwen2": "qwen2", "Qwen3": "qwen3",
            "Gemma3": "gemma3", "Gemma2": "gemma2", "Phi3": "phi3"}[
        CASES[case]["cls"].removesuffix("ForCausalLM")]
    assert result.architecture == arch
    names = {t.name for t in gguf.GGUFReader(out).tensors}
    assert ("output.weight" in names) == (not model.config.tie_word_embeddings)
    assert ("blk.0.attn_q.bias" in names) == (arch == "qwen2")
    assert ("blk.0.attn_q_norm.weight" in names) == (arch in ("qwen3", "gemma3"))
    assert ("blk.0.post_ffw_norm.weight" in names) == (arch in ("gemma3", "gemma2"))
    assert ("blk.0.attn_qkv.weight" in names) == (arch == "phi3")
    assert ("rope_freqs.weight" in names) == (case == "llama-llama3")
    ember_model = _core.Model(str(out), n_threads=1)
    assert ember_model.architecture == arch
    tokens = tokens_for_test()
    ours, ref = ember_model.eval(tokens), hf_logits(model, tokens)
    assert ours.shape == ref.shape == (len(tokens), N_VOCAB)
    assert np.abs(ours - ref).max() < F32_REL * np.abs(ref).max()


def _metadata(path: Path) -> dict[str, object]:
    reader = gguf.GGUFReader(path)
    return {name: field.contents() for name, field in reader.fields.items()}


def test_gemma2_softcaps_matter(built, tmp_path: Path) -> None:
    """The GGUF carries Gemma 2's caps and window as llama.cpp names them, and they change the
    logits far beyond test_f32_logits_match_transformers' tolerance: without them (or with the
    window ignored) that test would fail."""
    model, folder = built("gemma2")
    out = convert(folder, tmp_path / "m.gguf", "f32", progress=False).path
    meta = _metadata(out)
    assert meta["gemma2.attn_logit_softcapping"] == pytest.approx(2.0)
    assert meta["gemma2.final_logit_softcapping"] == pytest.approx(8.0)
    assert meta["gemma2.attention.sliding_window"] == 16
    assert meta["gemma2.attention.sliding_window_pattern"] == 2
    tokens = tokens_for_test()
    ref = hf_logits(model, tokens)
    for change in ({"attn_logit_softcapping": None}, {"final_logit_softcapping": None},
                   {"sliding_window": 4096}):
        other = copy.deepcopy(model)
        for key, value in change.items():
            setattr(other.config, key, value)
            for layer in other.model.layers:
                if key == "attn_logit_softcapping":
                    layer.self_attn.attn_logit_softcapping = value
                elif key == "sliding_window" and layer.self_attn.sliding_window:
                    layer.self_attn.sliding_window = value
        assert np.abs(hf_logits(other, tokens) - ref).max() > 10 * F32_REL * np.abs(ref).max(), change


def test_mistral_window_in_gguf(built, tmp_path: Path) -> None:
    model, folder = built("mistral-window")
    out = convert(folder, tmp_path / "m.gguf", "f32", progress=False).path
    assert _metadata(out)["llama.attention.sliding_window"] == 16
    # The window matters for these 100 tokens: transformers attending globally differs a lot.
    tokens = tokens_for_test()
    other = copy.deepcopy(model)
    other.config.sliding_window = None
    ref = hf_logits(model, tokens)
    assert np.abs(hf_logits(other, tokens) - ref).max() > 10 * F32_REL * np.abs(ref).max()


def test_bf16_checkpoint(tmp_path: Path) -> None:
    model = make_model("qwen2")
    folder = save_checkpoint(model, tmp_path / "hf", dtype=torch.bfloat16)
    header = (folder / "model.safetensors").read_bytes()[:400]
    assert b'"BF16"' in header
    out = tmp_path / "m.gguf"
    convert(folder, out, "f32", progress=False)
    rounded = copy.deepcopy(model)  # the weights as stored; buffers (RoPE inv_freq) stay f32
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    tokens = tokens_for_test()
    ours = _core.Model(str(out), n_threads=1).eval(tokens)
    ref = hf_logits(rounded, tokens)
    assert np.abs(ours - ref).max() < F32_REL * np.abs(ref).max()


# --- quantized --------------------------------------------------------------------------------

_GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TO_HF = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of llama.cpp's Q/K row permutation."""
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


# Where Gemma 3 and Phi-3 name layer tensors otherwise.
_LAYER_TO_HF_OF = {
    "gemma3_text": {**_LAYER_TO_HF, "post_attention_norm.weight": "post_attention_layernorm.weight",
                    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
                    "post_ffw_norm.weight": "post_feedforward_layernorm.weight"},
    "gemma2": {**_LAYER_TO_HF, "post_attention_norm.weight": "post_attention_layernorm.weight",
               "ffn_norm.weight": "pre_feedforward_layernorm.weight",
               "post_ffw_norm.weight": "post_feedforward_layernorm.weight"},
    "phi3": {**_LAYER_TO_HF, "attn_qkv.weight": "self_attn.qkv_proj.weight",
             "ffn_up.weight": "mlp.gate_up_proj.weight"},
}


def dequantized_model(model, path: Path):
    """A copy of `model` carrying the weights stored in GGUF file `path`, dequantized: what
    ember should compute, up to its own rounding."""
    cfg = model.config
    layer_to_hf = _LAYER_TO_HF_OF.get(cfg.model_type, _LAYER_TO_HF)
    state = {}
    for t in gguf.GGUFReader(path).tensors:
        if t.name == "rope_freqs.weight":  # computed from the config, not an HF weight
            continue
        shape = tuple(reversed([int(d) for d in t.shape]))
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
        m = re.match(r"blk\.(\d+)\.(.*)", t.name)
        hf = f"model.layers.{m.group(1)}.{layer_to_hf[m.group(2)]}" if m else _GGUF_TO_HF[t.name]
        if cfg.model_type in GEMMA_TYPES and t.name.endswith("norm.weight"):
            values = values - 1.0  # the converter stored Gemma's 1 + w
        if cfg.model_type in ("llama", "mistral") and ".q_proj." in hf:
            values = _unpermute(values, cfg.num_attention_heads)
        elif cfg.model_type in ("llama", "mistral") and ".k_proj." in hf:
            values = _unpermute(values, cfg.num_key_value_heads)
        state[hf] = torch.from_numpy(np.array(values, dtype=np.float32))
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    twin = copy.deepcopy(model)
    missing, unexpected = twin.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return twin


Q = gguf.GGMLQuantizationType

# Against the original f32 model the weights themselves are rounded as well, beyond what
# TWIN_RMS allows for: q8_0 keeps ~0.6% RMS error per weight (measured logits: 2.4-3.2% RMS),
# 4-bit blocks ~10% per weight (q4_k_m measured 22-29% RMS on these Gaussian weights, q4_0
# 29-35%). Bounds at ~2x; two unrelated logit sets differ by ~140% RMS.
VS_F32_RMS = {"q8_0": 0.06, "q4_k_m": 0.5}


@pytest.mark.parametrize("out_type", ["q8_0", "q4_k_m"])
@pytest.mark.parametrize("case", ["llama", "mistral", "qwen2", "qwen3-tied"])
def test_quantized_logits(case: str, out_type: str, built, tmp_path: Path) -> None:
    model, folder = built(case)
    out = tmp_path / "m.gguf"
    result = convert(folder, out, out_type, progress=False)
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(out).tensors}
    if out_type == "q8_0":
        assert set(result.tensor_types) == {"q8_0", "f32"}
    else:
        # llama.cpp's q4_k_m: q4_k by default; q6_k for the output projection (the embedding
        # when tied), and for attn_v / ffn_down in the layers use_more_bits picks (with two
        # layers: layer 1, since i >= 7*2//8 = 1; layer 0 is not: 0 < 2//8 = 0 is false).
        assert types["blk.0.attn_q.weight"] == Q.Q4_K
        assert types["blk.0.ffn_gate.weight"] == Q.Q4_K
        assert types["blk.0.attn_v.weight"] == Q.Q4_K
        assert types["blk.0.ffn_down.weight"] == Q.Q4_K
        assert types["blk.1.attn_v.weight"] == Q.Q6_K
        assert types["blk.1.ffn_down.weight"] == Q.Q6_K
        output = "token_embd.weight" if model.config.tie_word_embeddings else "output.weight"
        assert types[output] == Q.Q6_K
        if not model.config.tie_word_embeddings:
            assert types["token_embd.weight"] == Q.Q4_K
    assert all(types[n] == Q.F32 for n in types if n.endswith(("norm.weight", ".bias")))

    tokens = tokens_for_test()
    ours = _core.Model(str(out), n_threads=1).eval(tokens)
    twin = hf_logits(dequantized_model(model, out), tokens)
    assert rel_rms(ours, twin) < TWIN_RMS
    assert np.abs(ours - twin).max() < TWIN_MAX * np.abs(twin).max()
    assert rel_rms(ours, hf_logits(model, tokens)) < VS_F32_RMS[out_type]


@pytest.mark.parametrize("out_type", ["q8_0", "q4_k_m"])
@pytest.mark.parametrize("case", ["phi3", "gemma3", "gemma2"])
def test_quantized_fused_and_gemma_layouts(case: str, out_type: str, built, tmp_path: Path) -> None:
    """Phi-3's fused Q/K/V and gate/up are read as row views of one quantized tensor, and Gemma 3
    has norms of its own: quantized, ember's logits stay within TWIN_RMS of transformers running
    the same dequantized weights."""
    model, folder = built(case)
    out = convert(folder, tmp_path / "q.gguf", out_type, progress=False).path
    tokens = tokens_for_test()
    ours = _core.Model(str(out), n_threads=1).eval(tokens)
    twin = hf_logits(dequantized_model(model, out), tokens)
    assert rel_rms(ours, twin) < TWIN_RMS


@pytest.mark.parametrize(("case", "preemptions"), [("mistral-window", 0), ("mistral", 1)])
def test_blocks_behind_the_window_are_released(case: str, preemptions: int, built,
                                               tmp_path: Path) -> None:
    """Two requests of 40 + 120 tokens in a 256-token KV pool (blocks of 4): together they need
    320 slots, so with every block kept (mistral: its 4096 window is never reached) one of them
    is preempted; with a 16-token window on every layer the blocks behind it go back to the pool
    as the requests advance, and both run through. Either way each greedy output equals the
    single-sequence loop on a contiguous cache (ember.Model), so releasing changes nothing."""
    _, folder = built(case)
    path = str(convert(folder, tmp_path / "m.gguf", "f32", progress=False).path)
    rng = np.random.default_rng(1)
    prompts = [[1, *rng.integers(3, N_VOCAB, 39).tolist()] for _ in range(2)]
    model = _core.Model(path, n_threads=1)
    engine = _core.Engine(path, n_threads=1, parallel=2, n_ctx=256, kv_size=256, block_size=4)
    events = run_all(engine, prompts, 120)
    assert [tokens_of(e) for e in events] == [reference_greedy(model, p, 120) for p in prompts]
    assert settled_stats(engine)["preemptions"] == preemptions
