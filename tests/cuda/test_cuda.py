"""The CUDA backend against the CPU backend, on this machine's first usable NVIDIA GPU. Every op
on fresh random inputs (tests/cpp/test_backend_ops.cpp, tolerances explained there: CUDA's
expf, sincosf, erff and tanhf are within the bounds it allows for Vulkan, and its division and
sqrt are correctly rounded); whole models giving the CPU's greedy text (stories260K, SmolLM2, a
tiny llama in every k-quant and iq4_nl, a mixture of experts); an encoder's embeddings (bert's
layer_norm and gelu); the engine's batching invariance and prefix caching; one device
submission per engine step; `ember serve --device cuda`, and the server contract tests on it.

They need a build with the CUDA backend (pip install . -C cmake.define.EMBER_CUDA=ON) and an
NVIDIA GPU with its driver: without them they are skipped, unless EMBER_REQUIRE_CUDA=1 (set it
on a machine with a GPU), where that is a failure. scripts/cuda_check.sh runs them there."""

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
from server_support import serve_process

from ember import _core
from ember.convert import convert
from ember.embeddings import Embedder
from ember.engine import Engine
from ember.sampling import SamplingParams


def cuda_device() -> str | None:
    """The first usable CUDA device of this build and machine ("cuda:N"), or None."""
    devices, _notes = _core.devices()
    usable = [d["device"] for d in devices if d["backend"] == "cuda" and d["usable"]]
    return usable[0] if usable else None


DEVICE = cuda_device()
if DEVICE is None:
    devices, notes = _core.devices()
    why = "; ".join([n for n in notes if n.startswith("cuda")] +
                    [f"{d['device']}: {d['unusable']}" for d in devices if d["backend"] == "cuda"])
    if os.environ.get("EMBER_REQUIRE_CUDA") == "1":
        raise RuntimeError(f"EMBER_REQUIRE_CUDA=1 but the CUDA backend cannot run: {why or 'no CUDA device'}")
    pytest.skip(f"no CUDA: {why or 'no usable CUDA device'}", allow_module_level=True)

WEIGHT_TYPES = ("f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "q2_k", "q3_k",
                "q4_k", "q5_k", "q6_k")
OP_CASES = [f"{op}_{t}" for t in WEIGHT_TYPES for op in ("matmul", "get_rows")] + [
    "matmul_rows_independent", "elementwise_exact", "silu_gelu_mul", "softcap", "rms_norm", "softmax", "rope",
    "store_kv_f16", "store_kv_q8_0", "copy_kv", "attention_f16", "attention_q8_0",
    "one_submission_per_download"]


def test_every_op_matches_the_cpu() -> None:
    run_cases(build_cpp_test("test_backend_ops", cuda=True), OP_CASES, DEVICE)


def greedy(path: Path, device: str, prompt: str, n: int) -> list[int]:
    with Engine(path, device=device, parallel=1, n_ctx=256) as engine:
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        return list(engine.generate(prompt, params).tokens)


def test_stories_greedy_text_is_the_cpus(stories_path: Path) -> None:
    for prompt in ("Once upon a time", "The little dog", "Tom and Lily went to the"):
        assert greedy(stories_path, DEVICE, prompt, 40) == greedy(stories_path, "cpu", prompt, 40), prompt


def test_smollm2_greedy_text_is_the_cpus_up_to_near_ties(smollm2_path: Path) -> None:
    backend_support.check_smollm2_greedy_up_to_near_ties(smollm2_path, DEVICE)


@pytest.fixture(scope="module")
def quantized_tiny_llamas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("transformers")
    return backend_support.quantized_tiny_llamas(tmp_path_factory.mktemp("tiny-k"))


@pytest.mark.parametrize("file_type", ["q2_k", "q3_k_m", "q5_k_m", "iq4_nl"])
def test_k_quant_and_iq4_nl_models_give_the_cpus_greedy_text(quantized_tiny_llamas: dict[str, Path],
                                                              file_type: str) -> None:
    """Every weight type reaches the right kernels at model scale: the CUDA logits stay within a
    quarter of what quantizing did to the CPU's (as tests/vulkan argues: an activation within an
    ULP of a rounding boundary may round the other way, moving one input by one step), which a
    wrong block decode or weight layout exceeds many times over."""
    path = quantized_tiny_llamas[file_type]
    backend_support.check_quantized_llama_up_to_a_quarter_of_the_rounding(path, DEVICE)


def test_batching_is_invisible_and_prefix_caching_holds(stories_path: Path) -> None:
    backend_support.check_batching_is_invisible_and_prefix_caching_holds(stories_path, DEVICE)


def test_one_device_submission_per_engine_step(stories_path: Path) -> None:
    backend_support.check_one_device_submission_per_engine_step(stories_path, DEVICE)


def test_ember_info_lists_the_device_and_auto_picks_it(stories_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "ember.cli", "info", "--devices", "--json"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    names = [d["device"] for d in json.loads(out)["devices"]]
    assert names[0] == "cpu" and DEVICE in names
    with Engine(stories_path, parallel=1, n_ctx=64) as engine:  # device "auto"
        assert engine.device.startswith(DEVICE)
    env = dict(os.environ, EMBER_DEVICE="cuda")
    code = f"from ember.engine import Engine; print(Engine({str(stories_path)!r}).device)"
    by_env = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env=env)
    assert by_env.stdout.startswith("cuda:0"), by_env.stderr


def test_an_encoder_runs_on_cuda(tmp_path: Path) -> None:
    """bert (layer_norm, gelu): CUDA's embeddings within 1e-4 of the CPU's (unit vectors of a
    2-layer model: f32 sums in other orders and a few ULP of erf differ far below that)."""
    from checkpoints import tiny_bert

    folder = tiny_bert(tmp_path / "hf", "mean_tokens")
    gguf = convert(folder, tmp_path / "tiny.gguf", "f32", progress=False).path
    texts = ["w1 w2 w3", "w4 w5"]
    cpu = Embedder(gguf, n_threads=1, device="cpu").embed(texts)
    dev = Embedder(gguf, n_threads=1, device=DEVICE).embed(texts)
    np.testing.assert_allclose(dev, cpu, atol=1e-4)


def test_a_mixture_of_experts_model_gives_the_cpus_text(tmp_path: Path) -> None:
    """add_rows_scaled (the experts' weighted scatter) and routing's mid-pass download."""
    pytest.importorskip("transformers")
    from checkpoints import make_moe_model, save_checkpoint

    folder = save_checkpoint(make_moe_model("qwen3moe"), tmp_path / "hf")
    path = convert(folder, tmp_path / "moe.gguf", "q8_0", progress=False).path
    assert greedy(path, DEVICE, "hello", 12) == greedy(path, "cpu", "hello", 12)


def test_serve_on_cuda_answers_the_contract(stories_path: Path, tmp_path: Path) -> None:
    with serve_process(stories_path, ["--device", DEVICE, "--parallel", "2"], tmp_path) as (url, _):
        body = {"model": "stories260K.gguf", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"].startswith(", there was a little girl named Lily")
        bad = httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": -1}, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
        metrics = httpx.get(f"{url}/metrics", timeout=60).text
        total = [line for line in metrics.splitlines() if line.startswith("ember_device_memory_total_bytes")]
        assert total and float(total[0].split()[-1]) > 0


def test_the_server_contract_tests_pass_on_cuda() -> None:
    """tests/server/test_server_api.py, unchanged, with its server on CUDA ($EMBER_DEVICE)."""
    backend_support.check_the_server_contract_tests_pass(DEVICE)
