"""Embeddings from decoder models (model/embedder.h on llama, qwen2, qwen3, gemma3, gemma2,
windowed mistral): tiny random transformers checkpoints converted with ember.convert, against
the same model's final hidden states (last_hidden_state, after the final norm) run in torch
float64 and pooled there (mean, first token, last token, or every token), and decoder rerankers
(Qwen3ForSequenceClassification) against their logits.

Tolerance: cosine >= 0.9999 per vector. With f32 weights ember differs from float64 torch only
by f32 arithmetic and the f16 rounding (2^-11 relative) of each cached K and V: the lowest
cosine measured is 0.99999984 on these two-layer models. The f16 file is compared with the same
model with its weights rounded to f16 (what the file holds), so only those differences remain
(and f16 matmul rounding): lowest 0.9999975. A wrong pooled row takes it far below the bar
(measured on qwen3, 30 tokens: the second-last token's state 0.57, the first's 0.19, a mean
missing one of 30 rows 0.9988).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from checkpoints import N_VOCAB, save_checkpoint, spread_weights, tokens_for_test
from tiny_models import make_model

from ember import _core
from ember.convert import convert
from ember.embeddings import Embedder
from ember.llm import LLM

ARCHS = ("llama", "qwen2", "qwen3")
LENGTHS = (1, 7, 30, 64)  # packed into one forward pass together
MIN_COSINE = 0.9999


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def pooled(h: np.ndarray, pooling: str) -> np.ndarray:
    return {"mean": h.mean(0), "cls": h[0], "last": h[-1]}[pooling]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], tuple]:
    """(arch, "f32" | "f16") -> (the float64 reference model, the converted GGUF path)."""
    out = {}
    for arch in ARCHS:
        model = make_model(arch, vocab_size=N_VOCAB)
        folder = save_checkpoint(model, tmp_path_factory.mktemp(arch))
        for out_type in ("f32", "f16"):
            path = convert(folder, folder / f"{out_type}.gguf", out_type, progress=False).path
            ref = copy.deepcopy(model)
            if out_type == "f16":
                ref = ref.half()
            out[arch, out_type] = ref.double().eval(), path
    return out


def hidden_states(model, tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model.model(torch.tensor([tokens])).last_hidden_state[0].numpy()


SEQS = [tokens_for_test(n, seed=i) for i, n in enumerate(LENGTHS)]


def qwen3_classifier(tmp_path: Path, n_labels: int, seed: int) -> tuple[Any, Path]:
    """A tiny random Qwen3ForSequenceClassification with n_labels labels, and its f32 GGUF."""
    config = transformers.Qwen3Config(
        vocab_size=N_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
        rms_norm_eps=1e-5, num_labels=n_labels, pad_token_id=0)
    torch.manual_seed(seed)
    model = transformers.Qwen3ForSequenceClassification(config).eval()
    spread_weights(model)
    folder = save_checkpoint(model, tmp_path / "hf")
    return model, Path(convert(folder, tmp_path / "r.gguf", "f32", progress=False).path)


@pytest.mark.parametrize("out_type", ["f32", "f16"])
@pytest.mark.parametrize("pooling", ["mean", "last", "cls"])
@pytest.mark.parametrize("arch", ARCHS)
def test_pooled_embeddings_match_transformers(models, arch: str, pooling: str, out_type: str):
    ref, path = models[arch, out_type]
    embedder = Embedder(path, pooling=pooling)
    assert embedder.pooling == pooling and not embedder.is_encoder
    vectors = embedder.embed(SEQS)
    assert vectors.shape == (len(SEQS), ref.config.hidden_size)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    for tokens, v in zip(SEQS, vectors):
        assert cosine(v, pooled(hidden_states(ref, tokens), pooling)) >= MIN_COSINE, len(tokens)
    # Unnormalized, the vectors are the pooled states themselves (their norm included).
    raw = embedder.embed_tokens(SEQS, normalize=False)
    want = pooled(hidden_states(ref, SEQS[2]), pooling)
    assert abs(np.linalg.norm(raw[2]) / np.linalg.norm(want) - 1) < 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_pooling_none_gives_every_token(models, arch: str):
    ref, path = models[arch, "f32"]
    embedder = Embedder(path)  # a chat model's file does not say: none, as llama.cpp
    assert embedder.pooling == "none"
    rows = embedder.token_embeddings(SEQS)
    assert [r.shape for r in rows] == [(n, ref.config.hidden_size) for n in LENGTHS]
    for tokens, r in zip(SEQS, rows):
        h = hidden_states(ref, tokens)
        assert min(cosine(a, b) for a, b in zip(r, h)) >= MIN_COSINE
        assert abs(np.linalg.norm(r[-1]) / np.linalg.norm(h[-1]) - 1) < 1e-3  # unnormalized
    with pytest.raises(ValueError, match="pools none"):
        embedder.embed(SEQS)


def test_errors_name_the_input(models):
    _, path = models["qwen3", "f32"]
    embedder = Embedder(path, pooling="last")
    with pytest.raises(ValueError, match="input 1 token 0 has id 9999"):
        embedder.embed_tokens([[5], [9999]])
    with pytest.raises(ValueError, match="input 0 has 0 tokens"):
        embedder.embed_tokens([[]])
    with pytest.raises(ValueError, match="input 0 has 513 tokens; expected 1 to 512"):
        embedder.embed_tokens([[5] * 513])
    with pytest.raises(ValueError, match="pooling 'avg' is not one of"):
        Embedder(path, pooling="avg")


def test_pooling_from_the_sentence_transformers_module(tmp_path: Path):
    """A sentence-transformers decoder (Qwen3-Embedding's layout: a Pooling module with
    pooling_mode_lasttoken) converts with pooling_type last, which the embedder then uses."""
    model = make_model("qwen3", vocab_size=N_VOCAB, seed=1)
    folder = save_checkpoint(model, tmp_path / "hf")
    (folder / "modules.json").write_text(json.dumps(
        [{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_lasttoken": True}))
    path = convert(folder, tmp_path / "m.gguf", "f32", progress=False).path
    assert _core.GGUFFile(str(path)).get("qwen3.pooling_type") == 3
    embedder = Embedder(path)
    assert embedder.pooling == "last"
    v = embedder.embed([SEQS[2]])[0]
    assert cosine(v, hidden_states(model.double(), SEQS[2])[-1]) >= MIN_COSINE


def test_llm_embed_on_a_decoder(models):
    """ember.LLM generates and embeds with the same decoder file (its Embedder loads on the
    first embed)."""
    ref, path = models["llama", "f32"]
    llm = LLM(path, n_ctx=128, pooling="mean")
    try:
        vectors = llm.embed([SEQS[1], SEQS[2]])
        assert vectors.shape == (2, ref.config.hidden_size)
        assert cosine(vectors[1], hidden_states(ref, SEQS[2]).mean(0)) >= MIN_COSINE
        result = llm.generate(SEQS[1], max_tokens=3)
        assert result.usage.prompt_tokens == len(SEQS[1]) and 1 <= len(result.tokens) <= 3
    finally:
        llm.close()


def test_decoder_reranker_matches_transformers(tmp_path: Path):
    """Qwen3ForSequenceClassification (score.weight over the last token's state) converts to
    cls.output with pooling rank; its score is the head's logit, as transformers computes it."""
    model, path = qwen3_classifier(tmp_path, n_labels=1, seed=2)
    embedder = Embedder(path)
    assert embedder.pooling == "rank" and embedder.is_reranker
    pairs = [tokens_for_test(n, seed=10 + n) for n in (5, 17, 40)]
    scores = embedder.rerank_tokens(pairs, [[0] * len(t) for t in pairs])
    ref = model.double()
    with torch.no_grad():
        want = [float(ref(torch.tensor([t])).logits[0, 0]) for t in pairs]
    spread = max(want) - min(want)
    np.testing.assert_allclose(scores, want, atol=1e-3 * max(spread, 1.0))
    assert np.argsort(scores).tolist() == np.argsort(want).tolist()


def test_yes_no_reranker_with_a_rerank_template(tmp_path: Path):
    """A Qwen3-Reranker file as llama.cpp's converter writes it: a two-label head (yes, no) and
    a tokenizer.chat_template.rerank framing each pair. The pair is that template filled in and
    tokenized with special tokens parsed, and the score is P(yes), the softmax's first, as
    llama.cpp computes it."""
    from gguf_template import with_metadata

    model, plain = qwen3_classifier(tmp_path, n_labels=2, seed=4)
    template = "<s>Query: {query}\nDocument: {document}\nRelevant:"
    path = with_metadata(plain, tmp_path / "t.gguf",
                         strings={"tokenizer.chat_template.rerank": template})
    embedder = Embedder(path)
    query, documents = "the cat", ["a dog ran far away", "the cat sat", "once"]
    tokens, _ = embedder.pair_tokens(query, documents)
    for t, d in zip(tokens, documents):
        text = template.replace("{query}", query).replace("{document}", d)
        assert t == list(embedder.tokenizer.encode(text, False, True))
        assert t[0] == 1  # <s> parsed as the special token
    ref = model.double()
    with torch.no_grad():
        want = [float(torch.softmax(ref(torch.tensor([t])).logits[0], 0)[0]) for t in tokens]
    # The head's logits move by a few 1e-4 with the f16 K/V cache (measured: P(yes) by up to
    # 1.1e-4); a wrong row, template or missing softmax moves P(yes) by more than 0.05.
    np.testing.assert_allclose(embedder.rerank(query, documents), want, atol=1e-3)


# Decoders whose layers differ: Gemma 3 (sandwich norms, Q/K norms, local layers with a window of
# 16 between global ones, embeddings scaled by sqrt(n_embd)), Gemma 2 (soft-capped scores) and
# Mistral with a window shorter than the inputs: 100 tokens leave most keys outside the windows.
OTHER_DECODERS = {
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", {
        "head_dim": 64, "num_hidden_layers": 4, "sliding_window": 16, "query_pre_attn_scalar": 64,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": {"rope_type": "default", "rope_theta": 1e6}}}),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", {
        "head_dim": 64, "num_hidden_layers": 4, "sliding_window": 16, "query_pre_attn_scalar": 64,
        "attn_logit_softcapping": 2.0, "final_logit_softcapping": 8.0}),
    "mistral-window": ("MistralForCausalLM", "MistralConfig", {"sliding_window": 16}),
}


@pytest.mark.parametrize("case", list(OTHER_DECODERS))
def test_other_decoders_match_transformers(case: str, tmp_path: Path):
    cls_name, config_name, spec = OTHER_DECODERS[case]
    config = getattr(transformers, config_name)(
        vocab_size=N_VOCAB, hidden_size=256, intermediate_size=512, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, bos_token_id=1,
        eos_token_id=2, **{"num_hidden_layers": 2, **spec})
    torch.manual_seed(5)
    model = getattr(transformers, cls_name)(config).eval()
    spread_weights(model, norm_center=0.0 if case.startswith("gemma") else 1.0)
    folder = save_checkpoint(model, tmp_path / "hf")
    path = convert(folder, tmp_path / "m.gguf", "f32", progress=False).path
    seqs = [tokens_for_test(n, seed=20 + n) for n in (5, 100)]
    ref = model.double()
    for pooling in ("mean", "last"):
        vectors = Embedder(path, pooling=pooling).embed(seqs)
        for tokens, v in zip(seqs, vectors):
            assert cosine(v, pooled(hidden_states(ref, tokens), pooling)) >= MIN_COSINE
