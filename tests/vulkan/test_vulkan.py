"""The Vulkan backend against the CPU backend, on whatever Vulkan device this machine has (in CI:
Mesa's lavapipe, a Vulkan 1.3 device that runs on the CPU, so these tests say nothing about GPU
speed). Every op on fresh random inputs (tests/cpp/test_backend_ops.cpp, tolerances explained
there); whole models giving the CPU's greedy text (stories260K, SmolLM2, and a tiny llama in
every k-quant and iq4_nl); the engine's batching invariance and prefix caching; one device
submission per engine step; `ember serve --device vulkan`, and the server contract tests on it.

They need a build with the Vulkan backend (pip install . -C cmake.define.EMBER_VULKAN=ON) and a
Vulkan device: without them they are skipped, unless EMBER_REQUIRE_VULKAN=1 (CI sets it), where
that is a failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import backend_support
import httpx
import numpy as np
import pytest
from cpp_cases import build_cpp_test, run_cases
from engine_support import prompts_of, reference_greedy, run_all, tokens_of
from server_support import serve_process

from ember import UnsupportedError, _core
from ember.convert import convert
from ember.embeddings import Embedder
from ember.engine import Engine
from ember.llm import LLM
from ember.sampling import SamplingParams


def vulkan_device() -> str | None:
    """The first usable Vulkan device of this build and machine ("vulkan:N"), or None."""
    devices, _notes = _core.devices()
    usable = [d["device"] for d in devices if d["backend"] == "vulkan" and d["usable"]]
    return usable[0] if usable else None


DEVICE = vulkan_device()
if DEVICE is None:
    why = "; ".join(_core.devices()[1]) or "no usable Vulkan device"
    if os.environ.get("EMBER_REQUIRE_VULKAN") == "1":
        raise RuntimeError(f"EMBER_REQUIRE_VULKAN=1 but the Vulkan backend cannot run: {why}")
    pytest.skip(f"no Vulkan: {why}", allow_module_level=True)

WEIGHT_TYPES = ("f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "q2_k", "q3_k",
                "q4_k", "q5_k", "q6_k", "tq1_0", "tq2_0", "iq4_xs", "mxfp4", "iq2_xxs", "iq2_xs")
OP_CASES = [f"{op}_{t}" for t in WEIGHT_TYPES for op in ("matmul", "get_rows")] + [
    "matmul_rows_independent", "elementwise_exact", "silu_gelu_mul", "gelu", "softcap", "rms_norm",
    "layer_norm", "softmax", "rope",
    "store_kv_f16", "store_kv_q8_0", "copy_kv", "attention_f16", "attention_q8_0",
    "one_submission_per_download"]


@pytest.mark.parametrize("staging", [False, True], ids=["mapped", "staging"])
def test_every_op_matches_the_cpu(staging: bool) -> None:
    """staging: device memory written and read through a staging buffer, as on a discrete GPU
    (lavapipe's memory is host visible, which the backend otherwise maps)."""
    program = build_cpp_test("test_backend_ops", vulkan=True)
    env = {"EMBER_VULKAN_STAGING": "1"} if staging else {}
    os.environ.update(env)
    try:
        run_cases(program, OP_CASES, DEVICE)
    finally:
        for k in env:
            del os.environ[k]


def greedy(path: Path, device: str, prompt: str, n: int) -> list[int]:
    with Engine(path, device=device, parallel=1, n_ctx=256) as engine:
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        return list(engine.generate(prompt, params).tokens)


def test_stories_greedy_text_is_the_cpus(stories_path: Path) -> None:
    for prompt in ("Once upon a time", "The little dog", "Tom and Lily went to the"):
        cpu, vk = greedy(stories_path, "cpu", prompt, 40), greedy(stories_path, DEVICE, prompt, 40)
        assert vk == cpu, prompt


def test_smollm2_greedy_text_is_the_cpus_up_to_near_ties(smollm2_path: Path) -> None:
    backend_support.check_smollm2_greedy_up_to_near_ties(smollm2_path, DEVICE)


@pytest.fixture(scope="module")
def quantized_tiny_llamas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("transformers")
    return backend_support.quantized_tiny_llamas(tmp_path_factory.mktemp("tiny-k"))


@pytest.mark.parametrize("file_type", ["q2_k", "q3_k_m", "q5_k_m", "iq4_nl"])
def test_k_quant_and_iq4_nl_models_give_the_cpus_greedy_text(quantized_tiny_llamas: dict[str, Path],
                                                              file_type: str) -> None:
    """Every weight type reaches the right shaders at model scale. The CPU backend rounds every
    activation to 8 bits per block of 32 before a quantized matmul; a value within an ULP of a
    rounding boundary can round the other way on Vulkan (whose exp, sin and cos differ in the
    last bits), moving that one input by one step, where the CPU's own rounding moves every input
    by up to half a step. So the Vulkan logits must stay within a quarter of what quantizing did
    to the CPU's (this file's CPU logits against the f32 file's; measured: under a tenth, for
    every type), which a wrong block decode or weight layout exceeds many times over."""
    path = quantized_tiny_llamas[file_type]
    types = {t.type for t in _core.GGUFFile(str(path)).tensors}
    wanted = {"q2_k": {"q2_k", "q3_k"}, "q3_k_m": {"q3_k", "q5_k"}, "q5_k_m": {"q5_k"},
              "iq4_nl": {"iq4_nl"}}[file_type]
    assert wanted <= types, types
    backend_support.check_quantized_llama_up_to_a_quarter_of_the_rounding(path, DEVICE)


def test_nope_layers_and_longrope_match_transformers(tmp_path: Path) -> None:
    """SmolLM3's NoPE layers and Phi-3's LongRoPE (short and long factors, and the attention
    factor the rope shader multiplies cos and sin by) on Vulkan, held to the CPU's bound against
    transformers (tests/model/test_model_nope_longrope.py explains the contexts compared)."""
    pytest.importorskip("transformers")
    from checkpoints import (
        F32_REL,
        ORIGINAL_CTX,
        make_phi3_longrope,
        make_smollm3,
        save_checkpoint,
        tokens_for_test,
    )
    from tiny_models import hf_logits

    tokens = tokens_for_test(100)
    runs = [(make_smollm3(), 512, tokens), (make_phi3_longrope(), ORIGINAL_CTX, tokens[:ORIGINAL_CTX]),
            (make_phi3_longrope(), 100, tokens)]
    for i, (hf, n_ctx, prompt) in enumerate(runs):
        folder = save_checkpoint(hf, tmp_path / f"hf{i}")
        path = convert(folder, tmp_path / f"m{i}.gguf", "f32", progress=False).path
        ours = np.asarray(_core.Model(str(path), device=DEVICE, n_ctx=n_ctx).eval(prompt))
        ref = hf_logits(hf, prompt)
        assert np.abs(ours - ref).max() < F32_REL * np.abs(ref).max(), (hf.config.model_type, n_ctx)


def test_batching_is_invisible_and_prefix_caching_holds(stories_path: Path) -> None:
    backend_support.check_batching_is_invisible_and_prefix_caching_holds(stories_path, DEVICE)


def test_cache_dir_blocks_load_into_the_device_cache(stories_path: Path, tmp_path: Path) -> None:
    """Disk cache blocks go down from and up to the device's KV buffers (Backend::download /
    upload of a block's range per layer): a restarted Vulkan engine reads a prompt's 9 blocks
    back, and a CPU engine reads the same files (the f16 rows are laid out alike), both giving
    the CPU's greedy tokens."""
    model = _core.Model(str(stories_path), n_threads=2, device="cpu")
    prompt = prompts_of(model.n_vocab, [150], seed=8)[0]
    n_gen = 8
    reference = reference_greedy(model, prompt, n_gen)
    cache = str(tmp_path / "cache")
    for device, n_cached in ((DEVICE, 0), (DEVICE, 144), ("cpu", 144)):
        engine = _core.Engine(str(stories_path), parallel=1, kv_size=1024, cache_dir=cache, device=device)
        events = run_all(engine, [prompt], n_gen)[0]
        engine.shutdown()
        assert events[-1].n_cached_tokens == n_cached, device
        assert tokens_of(events) == reference, device


def test_one_device_submission_per_engine_step(stories_path: Path) -> None:
    backend_support.check_one_device_submission_per_engine_step(stories_path, DEVICE)


def test_ember_info_lists_the_device() -> None:
    out = subprocess.run([sys.executable, "-m", "ember.cli", "info", "--devices", "--json"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    report = json.loads(out)
    names = [d["device"] for d in report["devices"]]
    assert names[0] == "cpu" and DEVICE in names


def test_no_loader_means_the_cpu_and_a_reason(stories_path: Path) -> None:
    env = dict(os.environ, EMBER_VULKAN_LOADER="libvulkan-missing.so.1")
    info = subprocess.run([sys.executable, "-m", "ember.cli", "info", "--devices"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert info.returncode == 0 and "no Vulkan loader (libvulkan-missing.so.1)" in info.stdout
    code = f"from ember.engine import Engine; print(Engine({str(stories_path)!r}).device)"
    auto = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert auto.stdout.strip() == "cpu", auto.stderr
    run = subprocess.run([sys.executable, "-m", "ember.cli", "run", str(stories_path), "-p", "Once",
                          "-n", "2", "--device", "vulkan"], capture_output=True, text=True, timeout=120,
                         env=env)
    assert run.returncode != 0 and "no Vulkan loader" in run.stderr and "Traceback" not in run.stderr


def test_an_embedding_model_is_refused_on_vulkan_and_auto_means_the_cpu(tmp_path: Path) -> None:
    """The encoders run on the CPU only (their pooling reads host memory): a bert on Vulkan is
    refused at load with the way out, and "auto" (which would pick the GPU for a generation
    model) is the CPU."""
    from checkpoints import tiny_bert

    folder = tiny_bert(tmp_path / "hf", "mean_tokens")
    gguf = convert(folder, tmp_path / "tiny.gguf", "f32", progress=False).path
    refusal = "bert models run on the cpu backend only, not on the vulkan backend; use --device cpu"
    with pytest.raises(UnsupportedError, match=refusal):
        Embedder(gguf, n_threads=1, device=DEVICE)
    with pytest.raises(UnsupportedError, match=refusal):
        LLM(gguf, n_threads=1, device="vulkan")
    expected = Embedder(gguf, n_threads=1, device="cpu").embed(["w1 w2 w3"])
    auto = LLM(gguf, n_threads=1, device="auto")
    assert auto.embedder is not None and auto.embedder.device == "cpu"
    np.testing.assert_array_equal(auto.embed(["w1 w2 w3"]), expected)


def test_a_mixture_of_experts_model_is_refused_on_vulkan(tmp_path: Path) -> None:
    """Vulkan has no add_rows_scaled (the experts' weighted scatter), and routing reads the
    router's probabilities back mid-pass: a MoE model on it is refused at load, with the way out."""
    pytest.importorskip("transformers")
    from checkpoints import make_moe_model, save_checkpoint

    folder = save_checkpoint(make_moe_model("qwen3moe"), tmp_path / "hf")
    path = convert(folder, tmp_path / "moe.gguf", "q8_0", progress=False).path
    refusal = r"qwen3moe \(mixture of experts\) is not supported on the vulkan backend yet; use --device cpu"
    with pytest.raises(UnsupportedError, match=refusal):
        Engine(path, device=DEVICE, parallel=1, n_ctx=64)


def test_serve_on_vulkan_answers_the_contract(stories_path: Path, tmp_path: Path) -> None:
    with serve_process(stories_path, ["--device", DEVICE, "--parallel", "2"], tmp_path) as (url, _):
        body = {"model": "stories260K.gguf", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["text"]
        assert text.startswith(", there was a little girl named Lily")
        chunks = []
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=120) as s:
            for line in s.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:])["choices"][0]["text"])
        assert "".join(chunks) == text
        bad = httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": -1}, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
        metrics = httpx.get(f"{url}/metrics", timeout=60).text
        total = [line for line in metrics.splitlines() if line.startswith("ember_device_memory_total_bytes")]
        assert total and float(total[0].split()[-1]) > 0


def test_the_server_contract_tests_pass_on_vulkan() -> None:
    backend_support.check_the_server_contract_tests_pass(DEVICE)


def test_lora_adapters_are_refused_on_vulkan(tmp_path: Path) -> None:
    """The adapters' product needs add_rows_scaled, which Vulkan lacks: loading one there is
    refused, naming the op and the way out."""
    from lora_support import build_lora_case

    case = build_lora_case(tmp_path)
    refusal = (r"adapter-all.gguf: the vulkan backend has no f32 add_rows_scaled, which LoRA "
               r"adapters need; run on the CPU \(--device cpu\)")
    with pytest.raises(UnsupportedError, match=refusal):
        Engine(case.base_gguf, device=DEVICE, parallel=1, n_ctx=64,
               lora={"all": case.adapter_ggufs["all"]})


@pytest.mark.parametrize("name", ["tq1_0", "tq2_0", "mxfp4", "iq2_xxs", "iq2_xs"])
def test_typed_models_match_the_dequantized_weights(name: str, tmp_path: Path) -> None:
    import tiny_models
    from checkpoints import TWIN_MAX, TWIN_RMS, rel_rms
    from typed_models import dequantized_twin, make_model, write_typed

    model = make_model()
    path = write_typed(model, tmp_path / f"{name}.gguf", name, tmp_path)
    tokens = np.random.default_rng(1).integers(0, 256, 40).tolist()
    ours = np.asarray(_core.Model(str(path), device=DEVICE).eval(tokens))
    ref = tiny_models.hf_logits(dequantized_twin(model, path), tokens)
    assert rel_rms(ours, ref) < TWIN_RMS
    assert np.abs(ours - ref).max() < TWIN_MAX * np.abs(ref).max()


@pytest.mark.parametrize("name", ["iq2_s", "iq1_m"])
def test_weight_types_without_shaders_are_refused_naming_the_type(name: str, tmp_path: Path) -> None:
    from typed_models import make_model, write_typed

    path = write_typed(make_model(), tmp_path / f"{name}.gguf", name, tmp_path)
    # The embedding table is bound first; the matrices would be refused the same way.
    refusal = rf"'token_embd.weight': type {name} cannot be read by the vulkan backend"
    with pytest.raises(UnsupportedError, match=refusal):
        _core.Model(str(path), device=DEVICE)
    assert _core.Model(str(path), n_threads=1, device="cpu").eval([1, 2, 3]).shape == (3, 256)
