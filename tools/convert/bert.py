"""BERT encoders (GGUF architecture "bert"): sentence-embedding models such as
sentence-transformers/all-MiniLM-L6-v2 or BAAI/bge-small-en-v1.5, and cross-encoder rerankers
(BertForSequenceClassification, e.g. cross-encoder/ms-marco-MiniLM-L6-v2).

As llama.cpp's converter writes them: word, position and token-type embeddings, an embedding
LayerNorm, post-LayerNorm blocks with biases on every projection; attention.causal false;
pooling_type from the sentence-transformers Pooling module (modules.json -> its config.json),
mean when there is none; the WordPiece vocabulary in "phantom space" form (see vocab.py). An
embedding model has no output head (the pooler is dropped). A sequence classifier keeps its
head under llama.cpp's names: the pooler (dense + tanh over the [CLS] state) as cls.weight /
cls.bias, the classifier as cls.output.weight / cls.output.bias, its labels as
{arch}.classifier.output_labels, and pooling cls (the [CLS] state is what the head reads).
llama.cpp's own converter drops that pooler and so scores without it; the file here has both,
which llama.cpp's graph also applies (cls, tanh, cls.output), as transformers does.
"""

from __future__ import annotations

from typing import ClassVar

from gguf import GGUFWriter, PoolingType

from .base import DecoderFamily, HParams, TensorSpec, sentence_pooling
from .checkpoint import Checkpoint
from .errors import ConvertError
from .registry import register

# Checkpoint tensors an embedding model does not use.
_UNUSED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")


@register("BertModel", "BertForSequenceClassification")
class BertFamily(DecoderFamily):
    gguf_arch = "bert"
    activations: ClassVar[tuple[str, ...]] = ("gelu",)

    def __init__(self, hp: HParams, checkpoint: Checkpoint, where: str, config: dict) -> None:
        super().__init__(hp, checkpoint, where, config)
        if hp.n_ctx is None:
            raise ConvertError(f"{where}: max_position_embeddings is missing (BERT's position "
                               "table needs it)")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ConvertError(f"{where}: position_embedding_type "
                               f"{config['position_embedding_type']!r} is not supported (absolute)")
        self.layer_norm_eps = float(config.get("layer_norm_eps", 1e-12))
        self.n_token_types = int(config.get("type_vocab_size") or 1)
        # BertForMaskedLM-style checkpoints prefix every name with "bert."
        self.prefix = "bert." if "bert.embeddings.word_embeddings.weight" in checkpoint else ""
        self.labels: list[str] = []  # a sequence classifier's (a reranker's) output labels
        if "BertForSequenceClassification" in (config.get("architectures") or []):
            id2label = config.get("id2label") or {"0": "LABEL_0"}
            self.labels = [str(v) for _, v in sorted(id2label.items(), key=lambda kv: int(kv[0]))]
            self.pooling = PoolingType.CLS
        else:
            self.pooling = sentence_pooling(checkpoint) or PoolingType.MEAN

    def all_specs(self) -> list[TensorSpec]:
        hp, p = self.hp, self.prefix
        e = p + "embeddings."
        specs = [
            TensorSpec("token_embd.weight", e + "word_embeddings.weight", (hp.n_vocab, hp.n_embd)),
            TensorSpec("token_types.weight", e + "token_type_embeddings.weight",
                       (self.n_token_types, hp.n_embd)),
            TensorSpec("position_embd.weight", e + "position_embeddings.weight",
                       (hp.n_ctx, hp.n_embd)),
            TensorSpec("token_embd_norm.weight", e + "LayerNorm.weight", (hp.n_embd,)),
            TensorSpec("token_embd_norm.bias", e + "LayerNorm.bias", (hp.n_embd,)),
        ]
        for i in range(hp.n_layer):
            specs += self.layer_specs(i)
        if self.labels:
            d, n = hp.n_embd, len(self.labels)
            specs += [TensorSpec("cls.weight", p + "pooler.dense.weight", (d, d)),
                      TensorSpec("cls.bias", p + "pooler.dense.bias", (d,)),
                      TensorSpec("cls.output.weight", "classifier.weight", (n, d)),
                      TensorSpec("cls.output.bias", "classifier.bias", (n,))]
        return specs

    def layer_specs(self, i: int) -> list[TensorSpec]:
        hp = self.hp
        p, b = f"{self.prefix}encoder.layer.{i}.", f"blk.{i}."
        d, ff = hp.n_embd, hp.n_ff
        pairs = [
            ("attn_q", "attention.self.query", (d, d)),
            ("attn_k", "attention.self.key", (d, d)),
            ("attn_v", "attention.self.value", (d, d)),
            ("attn_output", "attention.output.dense", (d, d)),
            ("attn_output_norm", "attention.output.LayerNorm", None),
            ("ffn_up", "intermediate.dense", (ff, d)),
            ("ffn_down", "output.dense", (d, ff)),
            ("layer_output_norm", "output.LayerNorm", None),
        ]
        specs = []
        for gguf_name, hf_name, shape in pairs:
            rows = (shape or (d,))[0]
            specs.append(TensorSpec(f"{b}{gguf_name}.weight", f"{p}{hf_name}.weight", shape or (d,)))
            specs.append(TensorSpec(f"{b}{gguf_name}.bias", f"{p}{hf_name}.bias", (rows,)))
        return specs

    def ignored(self, hf_name: str) -> bool:
        name = hf_name.removeprefix(self.prefix)
        if self.labels and name.startswith("pooler."):
            return False  # a classifier's head
        return name in _UNUSED or super().ignored(hf_name)

    def add_metadata(self, w: GGUFWriter) -> None:
        self.add_shape(w)
        hp = self.hp
        w.add_layer_norm_eps(self.layer_norm_eps)
        w.add_causal_attention(False)
        w.add_pooling_type(self.pooling)
        w.add_token_type_count(self.n_token_types)
        w.add_vocab_size(hp.n_vocab)
        if self.labels:
            w.add_classifier_output_labels(self.labels)
