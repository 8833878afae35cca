"""`ember convert` / `ember quantize` on stories260K: against the GGUF file llama.cpp produced,
across output types, checkpoint layouts (sharded, f16, bf16) and every error path."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf_builder import split_gguf

import ember
from ember import _core
from ember.convert import (
    ConvertError,
    convert,
    qtypes,
    quantize_gguf,
    supported_architectures,
    writer,
)

Q = gguf.GGMLQuantizationType


def _tensors(path: Path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def _field(reader: gguf.GGUFReader, key: str):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def _values(t: gguf.ReaderTensor) -> np.ndarray:
    """A GGUF tensor as float32 in numpy order."""
    shape = tuple(reversed([int(d) for d in t.shape]))
    return gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)


def _greedy(path: Path, n: int, prompt: tuple[int, ...] = (1,)) -> list[int]:
    model = _core.Model(str(path), n_threads=1)
    tokens = list(prompt)
    logits = model.eval_last(tokens)
    for _ in range(n):
        tokens.append(int(np.argmax(logits)))
        logits = model.eval_last(tokens[-1:], reset=False)
    return tokens


@pytest.fixture(scope="module")
def stories_f32(tmp_path_factory: pytest.TempPathFactory, stories_hf_path: Path) -> Path:
    out = tmp_path_factory.mktemp("conv") / "stories-f32.gguf"
    convert(stories_hf_path, out, "f32", progress=False)
    return out


# --- against llama.cpp's file ----------------------------------------------------------------


def test_f32_tensors_bit_exact_with_llama_cpp_file(stories_f32: Path, stories_path: Path) -> None:
    ours, ref = _tensors(stories_f32), _tensors(stories_path)
    # The reference was made from llama2.c's export, which stores the tied output projection
    # as its own copy; the HF checkpoint ties it (no lm_head), so our file has no output.weight.
    assert np.array_equal(ref["output.weight"].data, ref["token_embd.weight"].data)
    assert set(ref) - set(ours) == {"output.weight"}
    assert set(ours) - set(ref) == set()
    for name, t in ours.items():
        r = ref[name]
        assert t.tensor_type == r.tensor_type == Q.F32, name
        assert list(t.shape) == list(r.shape), name
        # Q/K went through the llama permutation; every value must land on the same bits.
        assert np.array_equal(t.data.view(np.uint32), r.data.view(np.uint32)), name


def test_f32_metadata_matches_llama_cpp_file(stories_f32: Path, stories_path: Path) -> None:
    ours, ref = gguf.GGUFReader(stories_f32), gguf.GGUFReader(stories_path)
    for key in ("general.architecture", "llama.embedding_length", "llama.feed_forward_length",
                "llama.attention.head_count", "llama.attention.head_count_kv",
                "llama.block_count", "llama.rope.dimension_count",
                "llama.attention.layer_norm_rms_epsilon", "tokenizer.ggml.model",
                "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.unknown_token_id"):
        assert _field(ours, key) == _field(ref, key), key
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        assert _field(ours, key) == _field(ref, key), key
    # llama2.c's exporter wrote 2048; the HF config says max_position_embeddings 512.
    assert _field(ours, "llama.context_length") == 512
    assert _field(ours, "general.file_type") == 0
    assert _field(ours, "general.quantization_version") is None
    assert _field(ours, "llama.rope.freq_base") == 10000.0
    assert _field(ours, "tokenizer.ggml.add_bos_token") is True
    assert _field(ours, "tokenizer.ggml.add_eos_token") is False
    assert _field(ours, "general.name") == "stories260K-hf"


def test_f32_logits_and_greedy_equal_llama_cpp_file(stories_f32: Path, stories_path: Path) -> None:
    tokens = [1, 403, 407, 261, 378, 285, 267, 280]
    a = _core.Model(str(stories_f32), n_threads=1).eval(tokens)
    b = _core.Model(str(stories_path), n_threads=1).eval(tokens)
    assert np.array_equal(a, b)  # the same weights, so the same bits
    assert _greedy(stories_f32, 40) == _greedy(stories_path, 40)


# --- output types ----------------------------------------------------------------------------

# (type, file_type, expected type of blk.N.attn_q (row 64), of blk.N.ffn_down (row 172),
#  of token_embd (row 64; tied, so it is also the output projection))
TYPE_CASES = [
    ("f16", 1, Q.F16, Q.F16, Q.F16),
    ("bf16", 32, Q.BF16, Q.BF16, Q.BF16),
    ("q8_0", 7, Q.Q8_0, Q.F16, Q.Q8_0),    # 172 is not whole 32-blocks: f16, as llama.cpp
    ("q4_0", 2, Q.Q4_0, Q.F16, Q.Q8_0),    # output: q6_k wants 256-rows -> q8_0
    ("q4_1", 3, Q.Q4_1, Q.F16, Q.Q8_0),
    ("q5_0", 8, Q.Q5_0, Q.F16, Q.Q8_0),
    ("q5_1", 9, Q.Q5_1, Q.F16, Q.Q8_0),
    ("q2_k", 10, Q.IQ4_NL, Q.F16, Q.Q8_0),   # k-quants need 256-rows: llama.cpp's fallbacks
    ("q3_k_m", 12, Q.IQ4_NL, Q.F16, Q.Q8_0),
    ("q4_k_m", 15, Q.Q5_0, Q.F16, Q.Q8_0),
    ("q5_k_m", 17, Q.Q5_1, Q.F16, Q.Q8_0),
    ("q6_k", 18, Q.Q8_0, Q.F16, Q.Q8_0),
    ("tq1_0", 36, Q.Q4_0, Q.F16, Q.Q8_0),  # ternary needs 256-rows: q4_0, as llama.cpp
    ("tq2_0", 37, Q.Q4_0, Q.F16, Q.Q8_0),
    ("mxfp4_moe", 38, Q.Q8_0, Q.F16, Q.Q8_0),  # no experts: every matrix q8_0, as llama.cpp
]

# Worst relative RMS error of a dequantized weight matrix against f32, per type (measured
# values are about a third of these on stories260K's weights): 4-bit ~ 1/(2^4 * sqrt(3)) of the
# block range, 8-bit 16x smaller, f16/bf16 their mantissa.
RMS_REL = {Q.F16: 1e-3, Q.BF16: 5e-3, Q.Q8_0: 1e-2, Q.Q4_0: 0.15, Q.Q4_1: 0.15, Q.Q5_0: 0.08,
           Q.Q5_1: 0.08, Q.F32: 0.0}


@pytest.mark.parametrize("case", TYPE_CASES, ids=[c[0] for c in TYPE_CASES])
def test_output_types(case, tmp_path: Path, stories_hf_path: Path, stories_f32: Path) -> None:
    name, file_type, attn_type, down_type, embd_type = case
    out = tmp_path / f"s-{name}.gguf"
    convert(stories_hf_path, out, name, progress=False)
    reader = gguf.GGUFReader(out)
    assert _field(reader, "general.file_type") == file_type
    quantized = name not in ("f16", "bf16")
    assert _field(reader, "general.quantization_version") == (2 if quantized else None)
    ours, ref = _tensors(out), _tensors(stories_f32)
    assert list(ours) == list(ref)
    assert ours["blk.2.attn_q.weight"].tensor_type == attn_type
    assert ours["blk.2.ffn_down.weight"].tensor_type == down_type
    assert ours["token_embd.weight"].tensor_type == embd_type
    for tname, t in ours.items():
        want = _values(ref[tname])
        if len(want.shape) == 1:
            assert t.tensor_type == Q.F32 and np.array_equal(_values(t), want), tname
            continue
        got = _values(t)
        rel = np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2))
        assert rel <= RMS_REL.get(t.tensor_type, 0.15), (tname, t.tensor_type.name, rel)
    # The file runs, and a model this small still follows the f32 model's first tokens.
    tokens = _greedy(out, 8)
    if name in ("f16", "bf16", "q8_0"):
        assert tokens == _greedy(stories_f32, 8)


# --- ember quantize ---------------------------------------------------------------------------


def _same_files(a: Path, b: Path, skip_keys: tuple[str, ...] = ()) -> None:
    ra, rb = gguf.GGUFReader(a), gguf.GGUFReader(b)
    keys_a = [k for k in ra.fields if k not in skip_keys]
    keys_b = [k for k in rb.fields if k not in skip_keys]
    assert sorted(keys_a) == sorted(keys_b)
    for k in keys_a:
        assert ra.fields[k].types == rb.fields[k].types, k
        assert _field(ra, k) == _field(rb, k), k
    ta, tb = _tensors(a), _tensors(b)
    assert list(ta) == list(tb)
    for name in ta:
        assert ta[name].tensor_type == tb[name].tensor_type, name
        assert np.array_equal(ta[name].data, tb[name].data), name


@pytest.mark.parametrize("out_type", ["q8_0", "q4_k_m", "f16"])
def test_quantize_equals_direct_conversion(out_type: str, tmp_path: Path, stories_hf_path: Path,
                                           stories_f32: Path) -> None:
    direct, requant = tmp_path / "direct.gguf", tmp_path / "requant.gguf"
    convert(stories_hf_path, direct, out_type, progress=False)
    result = quantize_gguf(stories_f32, requant, out_type, progress=False)
    assert result.path == requant
    _same_files(direct, requant)


def test_quantize_a_split_model(tmp_path: Path, stories_f32: Path) -> None:
    """From any shard of a split f32 model: the file quantizing the single one gives, byte for byte
    (no split.* keys: the output is one file)."""
    shards = split_gguf(stories_f32, tmp_path / "stories", 20)
    quantize_gguf(stories_f32, tmp_path / "single.gguf", "q8_0", progress=False)
    quantize_gguf(shards[1], tmp_path / "split.gguf", "q8_0", progress=False)
    assert (tmp_path / "split.gguf").read_bytes() == (tmp_path / "single.gguf").read_bytes()


def test_quantize_from_bf16_and_f16_files(tmp_path: Path, stories_hf_path: Path) -> None:
    for source in ("bf16", "f16"):
        src = tmp_path / f"{source}.gguf"
        convert(stories_hf_path, src, source, progress=False)
        direct, requant = tmp_path / f"{source}-direct.gguf", tmp_path / f"{source}-rq.gguf"
        quantize_gguf(src, requant, "q8_0", progress=False)
        # From the rounded weights of SRC: the same file as converting those weights directly.
        convert(_rounded_checkpoint(stories_hf_path, tmp_path / f"{source}-hf", source,
                                    only_2d=True), direct,
                "q8_0", progress=False, name="stories260K-hf")
        _same_files(direct, requant)


def test_quantize_refuses_quantized_input(tmp_path: Path, stories_hf_path: Path) -> None:
    q = tmp_path / "q.gguf"
    convert(stories_hf_path, q, "q8_0", progress=False)
    with pytest.raises(ConvertError, match="only f32, f16 and bf16 files can be quantized"):
        quantize_gguf(q, tmp_path / "qq.gguf", "q4_0")
    with pytest.raises(ConvertError, match="no such file"):
        quantize_gguf(tmp_path / "missing.gguf", tmp_path / "x.gguf", "q4_0")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ConvertError, match="not a readable GGUF file"):
        quantize_gguf(bad, tmp_path / "x.gguf", "q4_0")


# --- checkpoint layouts ----------------------------------------------------------------------


def _write_safetensors(path: Path, arrays: dict[str, tuple[str, tuple[int, ...], bytes]]) -> None:
    """A safetensors file from (dtype, shape, raw bytes) per name, written by hand so that bf16
    needs no torch."""
    header, offset = {}, 0
    for name, (dtype, shape, raw) in arrays.items():
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for _, _, raw in arrays.values():
            f.write(raw)


def _read_stories(stories_hf_path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(stories_hf_path / "model.safetensors"))


def _rounded_checkpoint(stories_hf_path: Path, folder: Path, dtype: str, n_shards: int = 1,
                        only_2d: bool = False) -> Path:
    """stories260K re-saved as `dtype` (f32/f16/bf16; only its 2-D weights if only_2d) in
    n_shards files with an index."""
    folder.mkdir()
    for f in ("config.json", "tokenizer.model", "tokenizer_config.json"):
        shutil.copy(stories_hf_path / f, folder / f)
    arrays = {}
    for name, a in _read_stories(stories_hf_path).items():
        if only_2d and a.ndim == 1:
            arrays[name] = ("F32", a.shape, a.astype(np.float32).tobytes())
        elif dtype == "bf16":
            raw = bytes(np.frombuffer(_core.quantize(a, "bf16"), np.uint8))
            arrays[name] = ("BF16", a.shape, raw)
        elif dtype == "f16":
            arrays[name] = ("F16", a.shape, a.astype(np.float16).tobytes())
        else:
            arrays[name] = ("F32", a.shape, a.astype(np.float32).tobytes())
    names = list(arrays)
    per = math.ceil(len(names) / n_shards)
    if n_shards == 1:
        _write_safetensors(folder / "model.safetensors", arrays)
        return folder
    weight_map = {}
    for i in range(n_shards):
        shard = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {n: arrays[n] for n in names[i * per:(i + 1) * per]}
        _write_safetensors(folder / shard, part)
        weight_map.update({n: shard for n in part})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_sharded_half_precision_checkpoints(dtype: str, tmp_path: Path, stories_hf_path: Path,
                                            stories_f32: Path) -> None:
    folder = _rounded_checkpoint(stories_hf_path, tmp_path / "hf", dtype, n_shards=3)
    assert len(list(folder.glob("*.safetensors"))) == 3
    out_f32, out_same = tmp_path / "f32.gguf", tmp_path / f"{dtype}.gguf"
    convert(folder, out_f32, "f32", progress=False)
    convert(folder, out_same, dtype, progress=False)
    ref = _tensors(stories_f32)
    same = _tensors(out_same)
    for name, t in _tensors(out_f32).items():
        want = ref[name].data
        if len(t.shape) > 1:  # 2-D weights were stored rounded; widening to f32 is exact
            want = _values(ref[name])
            rounded = np.frombuffer(_core.quantize(np.ascontiguousarray(want), dtype),
                                    np.uint8)
            want = _core.dequantize(dtype, rounded, want.size).reshape(want.shape)
            # f16/bf16 output of an f16/bf16 source keeps the source's bits
            assert same[name].tensor_type == (Q.BF16 if dtype == "bf16" else Q.F16)
            assert np.array_equal(same[name].data.view(np.uint8).reshape(-1), rounded), name
        else:
            want = _values(ref[name])
            rounded = _core.dequantize(dtype, np.frombuffer(
                _core.quantize(np.ascontiguousarray(want), dtype), np.uint8), want.size)
            want = rounded.reshape(want.shape)
        assert np.array_equal(_values(t), want), name


def test_other_safetensors_files_are_ignored(tmp_path: Path, stories_hf_path: Path,
                                             stories_f32: Path) -> None:
    folder = _copy_stories(stories_hf_path, tmp_path / "hf")
    # Mistral repos ship their own layout next to HF's; LoRA adapters sit in model folders too.
    shutil.copy(folder / "model.safetensors", folder / "consolidated.safetensors")
    shutil.copy(folder / "model.safetensors", folder / "adapter_model.safetensors")
    out = tmp_path / "o.gguf"
    convert(folder, out, "f32", progress=False, name="stories260K-hf")
    assert out.read_bytes() == stories_f32.read_bytes()


def test_progress_bar(tmp_path: Path, stories_hf_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    convert(stories_hf_path, tmp_path / "o.gguf", "q8_0", progress=True)
    err = capsys.readouterr().err
    assert err.count("\r") == 47  # redrawn once per tensor
    last = err.rstrip("\n").split("\r")[-1]
    assert last.startswith("stories260K-hf -> q8_0 [############################] 100.0%")
    assert "blk.4.ffn_down.weight" not in last and "output_norm.weight f32" in last
    convert(stories_hf_path, tmp_path / "o2.gguf", "q8_0")  # not a terminal: silent
    assert capsys.readouterr().err == ""


def test_index_naming_a_missing_shard(tmp_path: Path, stories_hf_path: Path) -> None:
    folder = _rounded_checkpoint(stories_hf_path, tmp_path / "hf", "f32", n_shards=2)
    next(folder.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(ConvertError, match="lists shard model-00002-of-00002.safetensors, which "
                                           "is missing"):
        convert(folder, tmp_path / "o.gguf", "f32")


# --- errors ----------------------------------------------------------------------------------


def _copy_stories(stories_hf_path: Path, folder: Path) -> Path:
    shutil.copytree(stories_hf_path, folder)
    return folder


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_unsupported_architecture_lists_supported(tmp_path: Path, stories_hf_path: Path) -> None:
    folder = _copy_stories(stories_hf_path, tmp_path / "hf")
    _edit_config(folder, architectures=["GPTNeoXForCausalLM"])
    with pytest.raises(ConvertError) as err:
        convert(folder, tmp_path / "o.gguf", "f32")
    msg = str(err.value)
    assert "GPTNeoXForCausalLM is not supported" in msg
    for name in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                 "Qwen3ForCausalLM", "Gemma3ForCausalLM", "Gemma2ForCausalLM", "Phi3ForCausalLM",
                 "BertModel"):
        assert name in msg
    assert supported_architectures() == sorted(["LlamaForCausalLM", "MistralForCausalLM",
                                                "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                                "Gemma3ForCausalLM", "Gemma2ForCausalLM",
                                                "Gemma3ForConditionalGeneration",
                                                "Qwen2_5_VLForConditionalGeneration",
                                                "Phi3ForCausalLM", "BertModel",
                                                "BertForSequenceClassification",
                                                "LlamaForSequenceClassification",
                                                "Qwen2ForSequenceClassification",
                                                "Qwen3ForSequenceClassification",
                                                "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
                                                "SmolLM3ForCausalLM", "GptOssForCausalLM"])


def test_shape_mismatch_and_missing_tensor(tmp_path: Path, stories_hf_path: Path) -> None:
    folder = _copy_stories(stories_hf_path, tmp_path / "hf")
    _edit_config(folder, num_key_value_heads=8)
    with pytest.raises(ConvertError, match=r"model.layers.0.self_attn.k_proj.weight has shape "
                                           r"\[32, 64\], config.json implies \[64, 64\]"):
        convert(folder, tmp_path / "o.gguf", "f32")
    _edit_config(folder, num_key_value_heads=4, num_hidden_layers=6)
    with pytest.raises(ConvertError, match="model.layers.5.input_layernorm.weight is missing"):
        convert(folder, tmp_path / "o.gguf", "f32")
    _edit_config(folder, num_hidden_layers=4)
    with pytest.raises(ConvertError, match="model.layers.4.* has no place in a llama GGUF"):
        convert(folder, tmp_path / "o.gguf", "f32")
    _edit_config(folder, num_hidden_layers=5, tie_word_embeddings=False)
    with pytest.raises(ConvertError, match="no lm_head.weight, but config.json says "
                                           "tie_word_embeddings is false"):
        convert(folder, tmp_path / "o.gguf", "f32")
    assert not list(tmp_path.glob("o.gguf*"))


def test_missing_files(tmp_path: Path, stories_hf_path: Path) -> None:
    with pytest.raises(ConvertError, match="no such folder, and not a Hugging Face repo id"):
        convert(tmp_path / "nowhere", tmp_path / "o.gguf", "f32")
    folder = _copy_stories(stories_hf_path, tmp_path / "hf")
    (folder / "tokenizer.model").unlink()
    with pytest.raises(ConvertError, match="no tokenizer.model or tokenizer.json"):
        convert(folder, tmp_path / "o.gguf", "f32")
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(ConvertError, match=r"no \*.safetensors weights \(found pytorch_model.bin"):
        convert(folder, tmp_path / "o.gguf", "f32")
    (folder / "config.json").unlink()
    with pytest.raises(ConvertError, match="has no config.json"):
        convert(folder, tmp_path / "o.gguf", "f32")
    with pytest.raises(ConvertError, match="unknown output type 'q4_k_x'; choose one of f32, f16"):
        convert(stories_hf_path, tmp_path / "o.gguf", "q4_k_x")


def test_truncated_safetensors(tmp_path: Path, stories_hf_path: Path) -> None:
    folder = _copy_stories(stories_hf_path, tmp_path / "hf")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:-1000])
    with pytest.raises(ConvertError, match="is it truncated"):
        convert(folder, tmp_path / "o.gguf", "f32")


def test_existing_target_needs_force(tmp_path: Path, stories_hf_path: Path) -> None:
    out = tmp_path / "o.gguf"
    out.write_bytes(b"keep me")
    with pytest.raises(ConvertError, match="already exists; pass --force"):
        convert(stories_hf_path, out, "f32")
    assert out.read_bytes() == b"keep me"
    convert(stories_hf_path, out, "f32", force=True, progress=False)
    assert gguf.GGUFReader(out).tensors


def test_failure_mid_write_removes_partial_file(tmp_path: Path, stories_hf_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "o.gguf"
    real_encode, calls = qtypes.encode, []

    def failing_encode(values, t):
        calls.append(t)
        if len(calls) == 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_encode(values, t)

    monkeypatch.setattr(writer, "encode", failing_encode)
    with pytest.raises(ConvertError, match="no space left on the device while writing"):
        convert(stories_hf_path, out, "q8_0")
    assert not out.exists() and not writer.partial_path(out).exists()

    calls.clear()
    monkeypatch.setattr(writer, "encode", lambda v, t: (_ for _ in ()).throw(
        KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        convert(stories_hf_path, out, "q8_0")
    assert not out.exists() and not writer.partial_path(out).exists()


def test_not_enough_disk_space(tmp_path: Path, stories_hf_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(
        10**9, 10**9 - 1000, 1000))
    with pytest.raises(ConvertError, match=r"not enough disk space .* has 0.00 GB free"):
        convert(stories_hf_path, tmp_path / "o.gguf", "f32")
    assert not list(tmp_path.iterdir())


def test_missing_quantizer_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(qtypes, "can_quantize", lambda t: t not in (Q.Q4_K, Q.Q6_K))
    with pytest.raises(ConvertError, match="--type q4_k_m needs q4_k, q6_k quantization, which "
                                           "this build of ember._core does not provide"):
        qtypes.check_available({Q.Q4_K, Q.Q6_K, Q.F32}, "--type q4_k_m")


# --- source: hub ------------------------------------------------------------------------------


def _run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "ember.cli", *args], capture_output=True,
                          text=True, env=full_env, timeout=300, check=False)


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"},
                                 {"HF_ENDPOINT": "http://127.0.0.1:9"}],
                         ids=["offline", "unreachable-endpoint"])
def test_hub_unreachable(env: dict, tmp_path: Path) -> None:
    r = _run_cli("convert", "someone/some-model", "-o", str(tmp_path / "o.gguf"),
                 env={**env, "HF_HOME": str(tmp_path / "hf-home")})
    assert r.returncode == 1
    assert "error: cannot download someone/some-model: the Hugging Face Hub is unreachable" \
        in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "o.gguf").exists()


def test_hub_repo_id_from_the_local_cache(tmp_path: Path, stories_hf_path: Path,
                                          stories_f32: Path) -> None:
    """A repo id goes through huggingface_hub.snapshot_download; offline, a cached snapshot
    (laid out as huggingface_hub stores it) is used."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf-home" / "hub" / "models--someone--stories"
    shutil.copytree(stories_hf_path, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    out = tmp_path / "o.gguf"
    r = _run_cli("convert", "someone/stories", "-o", str(out), "-t", "f32",
                 env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")})
    assert r.returncode == 0, r.stderr
    assert gguf.GGUFReader(out).fields["general.name"].contents() == "someone/stories"
    assert _tensors(out).keys() == _tensors(stories_f32).keys()


# --- CLI ----------------------------------------------------------------------------------------


def test_cli_convert_and_quantize(tmp_path: Path, stories_hf_path: Path) -> None:
    f32, q = tmp_path / "s.gguf", tmp_path / "s-q8.gguf"
    r = _run_cli("convert", str(stories_hf_path), "-o", str(f32), "--type", "f32")
    assert r.returncode == 0, r.stderr
    assert f"wrote {f32} (llama, 47 tensors: 47 f32" in r.stderr
    r = _run_cli("quantize", str(f32), str(q), "q8_0")
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stderr and "q8_0" in r.stderr
    assert ember.GGUFFile(str(q)).metadata["general.file_type"] == 7
    r = _run_cli("quantize", str(f32), str(q), "q8_0")
    assert r.returncode == 1
    assert r.stderr.strip() == f"error: {q} already exists; pass --force to overwrite it"
    r = _run_cli("quantize", str(f32), str(q), "q8_0", "--force")
    assert r.returncode == 0, r.stderr
    r = _run_cli("convert", str(stories_hf_path), "-o", str(tmp_path / "x.gguf"), "-t", "q9")
    assert r.returncode == 1 and "unknown output type 'q9'" in r.stderr
