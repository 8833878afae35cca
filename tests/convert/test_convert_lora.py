"""`ember convert --lora`: PEFT adapters to llama.cpp's LoRA GGUF (metadata, names, orientation,
the llama Q/K row permutation of B) and the adapters it refuses. The logits of converted
adapters are checked against PEFT in tests/engine/test_engine_lora.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import gguf
import numpy as np
import pytest
from lora_support import ADAPTERS, LoraCase, lora_case_fixture

from ember.convert import ConvertError, convert_lora
from ember.convert.base import permute

lora_case = lora_case_fixture()


def fields(reader: gguf.GGUFReader) -> dict:
    out = {}
    for key, f in reader.fields.items():
        if f.types and f.types[0] == gguf.GGUFValueType.STRING:
            out[key] = bytes(f.parts[f.data[0]]).decode()
        elif f.data:
            out[key] = f.parts[f.data[0]].tolist()
    return out


def test_adapter_gguf_has_llamacpp_keys_names_and_orientation(lora_case: LoraCase) -> None:
    reader = gguf.GGUFReader(str(lora_case.adapter_ggufs["all"]))
    meta = fields(reader)
    assert meta["general.architecture"] == "llama"
    assert meta["general.type"] == "adapter"
    assert meta["adapter.type"] == "lora"
    assert meta["adapter.lora.alpha"] == [8.0]
    tensors = {t.name: t for t in reader.tensors}
    # Every projection of both layers, A then B, f32 as asked.
    projections = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
    assert sorted(tensors) == sorted(f"blk.{i}.{p}.weight.lora_{x}" for i in range(2)
                                     for p in projections for x in "ab")
    assert {t.tensor_type for t in tensors.values()} == {gguf.GGMLQuantizationType.F32}
    sd = {k: v.float().numpy() for k, v in lora_case.peft["all"].state_dict().items()
          if "lora_" in k}
    pre = "base_model.model.model.layers.0."
    # ggml shapes: A {n_in, rank}, B {rank, n_out} (numpy: PEFT's [rank, n_in] and [n_out, rank]).
    a = tensors["blk.0.attn_q.weight.lora_a"]
    assert a.shape.tolist() == [64, 4]
    np.testing.assert_array_equal(a.data, sd[pre + "self_attn.q_proj.lora_A.default.weight"])
    # B's rows follow the base weight's Q/K permutation (4 query heads, 2 kv heads); V's do not.
    np.testing.assert_array_equal(tensors["blk.0.attn_q.weight.lora_b"].data,
                                  permute(sd[pre + "self_attn.q_proj.lora_B.default.weight"], 4))
    np.testing.assert_array_equal(tensors["blk.0.attn_k.weight.lora_b"].data,
                                  permute(sd[pre + "self_attn.k_proj.lora_B.default.weight"], 2))
    np.testing.assert_array_equal(tensors["blk.0.attn_v.weight.lora_b"].data,
                                  sd[pre + "self_attn.v_proj.lora_B.default.weight"])
    assert tensors["blk.1.ffn_down.weight.lora_b"].shape.tolist() == [4, 64]


def test_cli_converts_to_f16_with_the_base_as_src(lora_case: LoraCase, tmp_path) -> None:
    out = tmp_path / "qvd-f16.gguf"
    proc = subprocess.run([sys.executable, "-m", "ember.cli", "convert", str(lora_case.base_dir),
                           "--lora", str(lora_case.adapter_dirs["qvd"]), "-o", str(out),
                           "--type", "f16"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "12 tensors: 12 f16" in proc.stderr
    reader = gguf.GGUFReader(str(out))
    assert fields(reader)["adapter.lora.alpha"] == [4.0]
    names = sorted(t.name for t in reader.tensors)
    assert names[:2] == ["blk.0.attn_q.weight.lora_a", "blk.0.attn_q.weight.lora_b"]
    assert {t.tensor_type for t in reader.tensors} == {gguf.GGMLQuantizationType.F16}
    assert ADAPTERS["qvd"]["r"] == 8 and reader.tensors[0].shape.tolist() == [64, 8]


def _edited_adapter(case: LoraCase, tmp_path, **config) -> str:
    folder = tmp_path / "edited"
    shutil.copytree(case.adapter_dirs["all"], folder)
    path = folder / "adapter_config.json"
    cfg = json.loads(path.read_text())
    cfg.update(config)
    path.write_text(json.dumps(cfg))
    return str(folder)


def test_refused_adapters_name_the_reason(lora_case: LoraCase, tmp_path) -> None:
    base = str(lora_case.base_dir)
    out = tmp_path / "x.gguf"
    with pytest.raises(ConvertError, match="no adapter_config.json"):
        convert_lora(lora_case.base_dir, out, base=base)
    with pytest.raises(ConvertError, match="use_dora is set"):
        convert_lora(_edited_adapter(lora_case, tmp_path, use_dora=True), out, base=base)
    with pytest.raises(ConvertError, match="converts to f32 or f16, not 'q4_0'"):
        convert_lora(lora_case.adapter_dirs["all"], out, "q4_0", base=base)
    with pytest.raises(ConvertError, match="base model /nonexistent: no such folder"):
        convert_lora(lora_case.adapter_dirs["all"], out, base="/nonexistent")
    # A base with other widths: the pairs do not fit its projections.
    other = tmp_path / "other-base"
    shutil.copytree(lora_case.base_dir, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["intermediate_size"] = 128
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConvertError, match=r"mlp.gate_proj has lora_A \[4, 64\] and lora_B \[96, 4\]"):
        convert_lora(lora_case.adapter_dirs["all"], out, base=str(other))
    assert not out.exists()
