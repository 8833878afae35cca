"""Mixture-of-experts models (qwen2moe, qwen3moe): tiny random Qwen2-MoE and Qwen3-MoE checkpoints
converted by ember.convert (experts merged into 3-D tensors) and run by ember, against
transformers' logits; quantized files against transformers on their dequantized weights; and the
engine's batched greedy output against each request alone."""

from __future__ import annotations

import copy
import re
from contextlib import contextmanager
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from checkpoints import (
    F32_REL,
    MOE_CASES,
    N_VOCAB,
    TWIN_MAX,
    TWIN_RMS,
    built_fixture,
    make_moe_model,
    rel_rms,
    tokens_for_test,
)
from engine_support import prompts_of, run_all, tokens_of
from tiny_models import hf_logits
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ember import _core
from ember.convert import ConvertError, convert

ARCH = {"Qwen2MoeForCausalLM": "qwen2moe", "Qwen3MoeForCausalLM": "qwen3moe"}


def router_margins(model, tokens: list[int]) -> np.ndarray:
    """[n_tokens] the smallest gap, over layers, between each token's k-th and (k+1)-th router
    probability in transformers: where it is tiny, rounding elsewhere may swap the choice."""
    k = model.config.num_experts_per_tok
    with torch.no_grad():
        logits = model(torch.tensor([tokens]), output_router_logits=True).router_logits
    gaps = [p[:, k - 1] - p[:, k] for p in
            (torch.softmax(r.float(), -1).sort(-1, descending=True).values for r in logits)]
    return torch.stack(gaps).min(0).values.numpy()


def router_margin(model, tokens: list[int]) -> float:
    return float(router_margins(model, tokens).min())


def decisive_prompt(model, n: int, margin: float, seed: int = 0) -> list[int]:
    """n random tokens, each redrawn until every layer's router separates its k-th expert from
    the next by more than `margin` (a token's routing depends only on the tokens up to it, so
    one token at a time over transformers' cache)."""
    rng = np.random.default_rng(seed)
    k = model.config.num_experts_per_tok
    tokens: list[int] = []
    cache = None
    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one-token steps: spare threads only spin (5x slower on 2 cores)
    try:
        while len(tokens) < n:
            token = int(rng.integers(3, N_VOCAB))
            with torch.no_grad():
                out = model(torch.tensor([[token]]), cache=copy.deepcopy(cache), use_cache=True,
                            output_router_logits=True)
            probs = [torch.softmax(r[-1].float(), -1).sort(descending=True).values
                     for r in out.router_logits]
            if min(float(p[k - 1] - p[k]) for p in probs) > margin:
                tokens.append(token)
                cache = out.cache
    finally:
        torch.set_num_threads(n_threads)
    return tokens


@contextmanager
def f16_kv_attention():
    """transformers' attention over keys and values rounded to f16 (after RoPE), as ember caches
    them: the one rounding ember adds to f32 weights."""
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def rounded(module, query, key, value, *args, **kwargs):
        return sdpa(module, query, key.half().float(), value.half().float(), *args, **kwargs)

    ALL_ATTENTION_FUNCTIONS.register("sdpa", rounded)
    try:
        yield
    finally:
        ALL_ATTENTION_FUNCTIONS.register("sdpa", sdpa)


built = built_fixture(make_moe_model)


@pytest.mark.parametrize("case", list(MOE_CASES))
def test_f32_logits_match_transformers(case: str, built, tmp_path: Path) -> None:
    model, folder = built(case)
    arch = ARCH[MOE_CASES[case]["cls"]]
    result = convert(folder, tmp_path / "m.gguf", "f32", progress=False)
    assert result.architecture == arch
    reader = gguf.GGUFReader(result.path)
    shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
    # ggml order: {n_in, n_out, n_expert}, as llama.cpp reads them.
    assert shapes["blk.0.ffn_gate_exps.weight"] == [256, 256, 8]
    assert shapes["blk.1.ffn_down_exps.weight"] == [256, 256, 8]
    assert shapes["blk.0.ffn_gate_inp.weight"] == [256, 8]
    assert ("blk.0.ffn_gate_inp_shexp.weight" in shapes) == (arch == "qwen2moe")
    assert ("blk.0.attn_q.bias" in shapes) == (arch == "qwen2moe")
    assert ("blk.0.attn_q_norm.weight" in shapes) == (arch == "qwen3moe")
    assert not any(n.startswith("blk.0.ffn_gate.") for n in shapes)
    fields = {f.name: f.contents() for f in reader.fields.values() if f.name.startswith(arch)}
    assert fields[f"{arch}.expert_count"] == 8
    assert fields[f"{arch}.expert_used_count"] == 2
    assert fields[f"{arch}.expert_feed_forward_length"] == 256
    assert fields[f"{arch}.expert_weights_norm"] == MOE_CASES[case].get("norm_topk_prob", False)

    tokens = tokens_for_test()
    ours = _core.Model(str(result.path), n_threads=1)
    assert ours.architecture == arch
    logits, ref = ours.eval(tokens), hf_logits(model, tokens)
    assert logits.shape == ref.shape == (len(tokens), N_VOCAB)
    # The same bound as the dense families: the f16 KV cache's rounding (measured here: 3.6-5.8e-4
    # of the largest logit), while a wrong routing, normalisation or shared-expert gate moves
    # logits by O(1).
    assert np.abs(logits - ref).max() < F32_REL * np.abs(ref).max()
    # Sharper: against transformers attending over the same f16-rounded keys and values, only
    # f32 summation order differs: the largest difference was 1.6-2.0e-5 of the largest logit on a
    # Xeon; on a Zen 5 (torch's kernels differ by CPU) per token 0-5.3e-5, and 1.4e-4 on one token
    # (not explained for certain: a key or value on an f16 rounding boundary, rounded to the
    # neighbouring f16 under the other f32 order, would move a token by that much). One token routed
    # to another expert moves its logits by ~1e-1, which 1e-3 still catches 100x over; no token
    # here is near a tie (the smallest gap between the k-th and next router probability is
    # ~2e-4, some 100x what f32 rounding moves a probability), so every token must take
    # transformers' experts, and the typical token must agree to summation order.
    with f16_kv_attention():
        ref16 = hf_logits(model, tokens)
        assert router_margin(model, tokens) > 1e-5
    per_token = np.abs(logits - ref16).max(axis=1) / np.abs(ref16).max()
    assert per_token.max() < 1e-3
    assert np.median(per_token) < 1e-4


def dequantized_twin(model, path: Path):
    """`model` carrying the weights stored in GGUF `path`, dequantized (experts unstacked into
    transformers' fused gate_up_proj / down_proj parameters)."""
    names = {"token_embd.weight": "model.embed_tokens.weight",
             "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    layer = {"attn_norm.weight": "input_layernorm.weight",
             "ffn_norm.weight": "post_attention_layernorm.weight",
             "attn_output.weight": "self_attn.o_proj.weight",
             "attn_q_norm.weight": "self_attn.q_norm.weight",
             "attn_k_norm.weight": "self_attn.k_norm.weight",
             "ffn_gate_inp.weight": "mlp.gate.weight", "ffn_down_exps.weight": "mlp.experts.down_proj",
             "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight"}
    for p in "qkv":
        for kind in ("weight", "bias"):
            layer[f"attn_{p}.{kind}"] = f"self_attn.{p}_proj.{kind}"
    for p in ("gate", "up", "down"):
        layer[f"ffn_{p}_shexp.weight"] = f"mlp.shared_expert.{p}_proj.weight"
    state, gate_up = {}, {}
    for t in gguf.GGUFReader(path).tensors:
        shape = tuple(reversed([int(d) for d in t.shape]))
        values = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape),
                                           dtype=np.float32))
        m = re.match(r"blk\.(\d+)\.(.*)", t.name)
        if not m:
            state[names[t.name]] = values
        elif m.group(2) in ("ffn_gate_exps.weight", "ffn_up_exps.weight"):
            gate_up.setdefault(m.group(1), {})[m.group(2)[4:6]] = values
        else:
            state[f"model.layers.{m.group(1)}.{layer[m.group(2)]}"] = values
    for i, parts in gate_up.items():
        state[f"model.layers.{i}.mlp.experts.gate_up_proj"] = torch.cat([parts["ga"], parts["up"]], dim=1)
    twin = copy.deepcopy(model)
    missing, unexpected = twin.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return twin


Q = gguf.GGMLQuantizationType


@pytest.mark.parametrize("out_type", ["q8_0", "q4_k_m"])
@pytest.mark.parametrize("case", ["qwen2moe", "qwen3moe"])
def test_quantized_logits_match_the_dequantized_weights(case: str, out_type: str, built,
                                                        tmp_path: Path) -> None:
    model, folder = built(case)
    path = convert(folder, tmp_path / "q.gguf", out_type, progress=False).path
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    # Routers stay f32, as llama.cpp's converter and quantizer keep them.
    assert types["blk.0.ffn_gate_inp.weight"] == Q.F32
    if out_type == "q4_k_m":
        assert types["blk.0.ffn_gate_exps.weight"] == Q.Q4_K
        assert types["blk.0.ffn_up_exps.weight"] == Q.Q4_K
        assert types["blk.0.ffn_down_exps.weight"] == Q.Q4_K
        assert types["blk.1.ffn_down_exps.weight"] == Q.Q6_K  # use_more_bits' layer
        # llama.cpp's rules for 8-expert models: attn_k / attn_v q8_0, attn_output q5_k.
        assert types["blk.0.attn_k.weight"] == types["blk.0.attn_v.weight"] == Q.Q8_0
        assert types["blk.0.attn_output.weight"] == Q.Q5_K
    twin = dequantized_twin(model, path)
    # 8-bit activations (below) move a router probability by an estimated ~5e-3 at most (the
    # router's input is off by ~2%, its logits by ~2e-2, a probability by p(1 - p) <= 1/4 of
    # that); a token whose k-th and (k+1)-th experts are closer may take another expert than in
    # transformers, which moves its logits and, through attention, every later token's (on
    # random 100-token prompts, measured: 0.1-0.6 of the largest logit from the first such
    # token on, while earlier rows stayed within 2%). So the prompt keeps every routing
    # decision 2x clear of the estimate, and then every row must match.
    tokens = decisive_prompt(twin, 48, margin=0.01)
    ours = _core.Model(str(path), n_threads=1).eval(tokens)
    ref = hf_logits(twin, tokens)
    # The dense families' bounds (tests/checkpoints.py): the f16 cache and 8-bit activations.
    assert rel_rms(ours, ref) < TWIN_RMS
    assert np.abs(ours - ref).max() < TWIN_MAX * np.abs(ref).max()


@pytest.mark.parametrize(("case", "out_type"), [("qwen2moe", "q4_k_m"), ("qwen3moe", "f16")])
def test_batched_greedy_equals_each_request_alone(case: str, out_type: str, built,
                                                  tmp_path: Path) -> None:
    """Tokens that share a step share experts too (one matmul per expert over the rows that
    chose it); the runner keeps each row's bits independent of the others, so batching,
    chunked prefill and the prefix cache change no request's greedy tokens. Quantized and
    float expert weights (the CPU has other kernels for each; where a weight type's kernels
    round a row differently below some row count, an expert's call is padded up to it)."""
    _, folder = built(case)
    path = str(convert(folder, tmp_path / "m.gguf", out_type, progress=False).path)
    lengths = [5, 40, 12, 1, 27, 9, 60, 3]
    n_gen = 10
    alone = _core.Engine(path, n_threads=2, parallel=1, kv_size=1024, prefix_caching=False)
    prompts = prompts_of(alone.n_vocab, lengths, seed=3)
    reference = [tokens_of(run_all(alone, [p], n_gen)[0]) for p in prompts]
    del alone
    engine = _core.Engine(path, n_threads=2, parallel=8, kv_size=2048, max_batch_tokens=32)
    for attempt in ("batched", "from the prefix cache"):
        got = [tokens_of(ev) for ev in run_all(engine, prompts, n_gen)]
        for i in range(len(prompts)):
            assert got[i] == reference[i], f"prompt {i} {attempt}"


def test_dense_layers_between_expert_layers_are_refused(built, tmp_path: Path) -> None:
    _, folder = built("qwen3moe")
    config = (folder / "config.json").read_text()
    (tmp_path / "hf").mkdir()
    for f in folder.iterdir():
        (tmp_path / "hf" / f.name).write_bytes(f.read_bytes())
    (tmp_path / "hf" / "config.json").write_text(config.replace('"mlp_only_layers": []',
                                                                '"mlp_only_layers": [1]'))
    with pytest.raises(ConvertError, match="mlp_only_layers"):
        convert(tmp_path / "hf", tmp_path / "m.gguf", "f32", progress=False)


def _set_uint(path: Path, key: str, value: int) -> None:
    """Rewrites an integer metadata value of GGUF file `path` in place."""
    field = gguf.GGUFReader(path, "r+").fields[key]
    field.parts[field.data[0]][0] = value


def test_inconsistent_expert_counts_are_refused(built, tmp_path: Path) -> None:
    _, folder = built("qwen3moe")
    path = convert(folder, tmp_path / "m.gguf", "f32", progress=False).path
    _set_uint(path, "qwen3moe.expert_used_count", 9)
    with pytest.raises(ValueError, match=r"'qwen3moe.expert_used_count' \(9\) must satisfy 0 < used"):
        _core.Model(str(path))
    _set_uint(path, "qwen3moe.expert_used_count", 2)
    _set_uint(path, "qwen3moe.expert_feed_forward_length", 128)
    with pytest.raises(ValueError, match=r"tensor 'blk.0.ffn_gate_exps.weight': expected shape "
                                         r"\[256, 128, 8\], got \[256, 256, 8\]"):
        _core.Model(str(path))
