"""`ember serve BASE --lora NAME=FILE`: a request picks an adapter by model name ("base:NAME")
or llama-server's `lora` field, /lora-adapters lists them and sets their global scales, and the
answers are transformers + PEFT's greedy tokens (tests/lora_support.py's tiny Llama)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from lora_support import LoraCase, lora_case_fixture
from server_support import RunningServer, assert_400_naming, ok, post, serving

from ember.server.config import ServerConfig
from ember.server.lora import split_model_name

lora_case = lora_case_fixture()

N_GEN = 6
PROMPT = [1, 45, 300, 12, 99, 7, 250, 31, 480, 3, 77, 140]


@pytest.fixture(scope="module")
def server(lora_case: LoraCase) -> Iterator[RunningServer]:
    adapters = {name: str(path) for name, path in lora_case.adapter_ggufs.items()}
    config = ServerConfig(model=str(lora_case.base_gguf), parallel=4, threads=2, lora=adapters)
    with serving(config) as running:
        yield running


_GREEDY: dict[tuple[str | None, float], list[int]] = {}


def peft_greedy(case: LoraCase, adapter: str | None, scale: float = 1.0) -> list[int]:
    """transformers + PEFT's greedy tokens after PROMPT (computed once per adapter and scale)."""
    if (adapter, scale) not in _GREEDY:
        tokens = list(PROMPT)
        for _ in range(N_GEN):
            tokens.append(int(case.hf_logits(adapter, tokens, scale)[-1].argmax()))
        _GREEDY[adapter, scale] = tokens[len(PROMPT):]
    return _GREEDY[adapter, scale]


def completion_tokens(server: RunningServer, **fields) -> list[int]:
    body = {"prompt": PROMPT, "n_predict": N_GEN, "temperature": 0, "return_tokens": True,
            **fields}
    return ok(server, "/completion", body)["tokens"]


def test_split_model_name() -> None:
    assert split_model_name("base.gguf:french") == ("base.gguf", "french")
    assert split_model_name("base.gguf") == ("base.gguf", None)
    assert split_model_name("hf://user/repo:Q4_K_M:french") == ("hf://user/repo:Q4_K_M", "french")
    assert split_model_name(":x") == (":x", None) and split_model_name("x:") == ("x:", None)


def test_adapters_are_listed(server: RunningServer, lora_case: LoraCase) -> None:
    assert httpx.get(server.url + "/lora-adapters").json() == [
        {"id": 0, "path": str(lora_case.adapter_ggufs["all"]), "scale": 0.0},
        {"id": 1, "path": str(lora_case.adapter_ggufs["qvd"]), "scale": 0.0}]
    ids = [m["id"] for m in httpx.get(server.url + "/v1/models").json()["data"]]
    assert ids == ["base.gguf", "base.gguf:all", "base.gguf:qvd"]


def test_requests_pick_adapters_by_field_and_model_name(server: RunningServer,
                                                        lora_case: LoraCase) -> None:
    plain, all_, qvd = (peft_greedy(lora_case, a) for a in (None, "all", "qvd"))
    assert len({tuple(plain), tuple(all_), tuple(qvd)}) == 3  # the adapters change the output
    assert completion_tokens(server) == plain
    assert completion_tokens(server, lora=[{"id": 0, "scale": 1.0}]) == all_
    assert completion_tokens(server, lora=[{"id": 0, "scale": 0.0}, {"id": 1, "scale": 1}]) == qvd
    assert completion_tokens(server, lora=[{"id": 1, "scale": 0.5}]) == \
        peft_greedy(lora_case, "qvd", 0.5)
    assert completion_tokens(server, model="base.gguf:all") == all_
    settings = ok(server, "/completion", {"prompt": PROMPT, "n_predict": 1, "model": "x:qvd"})
    assert settings["generation_settings"]["lora"] == [{"id": 1, "scale": 1.0}]
    assert completion_tokens(server, model="anything:qvd") == qvd
    # OpenAI's /v1/completions: the same text as llama-server's field gives.
    text = ok(server, "/v1/completions", {"model": "base.gguf:qvd", "prompt": PROMPT,
                                          "max_tokens": N_GEN, "temperature": 0})
    native = ok(server, "/completion", {"prompt": PROMPT, "n_predict": N_GEN, "temperature": 0,
                                        "lora": [{"id": 1, "scale": 1}]})
    assert text["choices"][0]["text"] == native["content"]


def test_requests_batched_together_keep_their_adapters(server: RunningServer,
                                                       lora_case: LoraCase) -> None:
    from concurrent.futures import ThreadPoolExecutor

    choices = [None, "all", "qvd", None, "all", "qvd"]
    with ThreadPoolExecutor(len(choices)) as pool:
        got = list(pool.map(lambda a: completion_tokens(
            server, **({"model": f"base.gguf:{a}"} if a else {})), choices))
    for adapter, tokens in zip(choices, got):
        assert tokens == peft_greedy(lora_case, adapter), adapter


def test_unknown_adapters_and_several_at_once_are_400s(server: RunningServer) -> None:
    body = {"prompt": PROMPT, "n_predict": 2}
    assert_400_naming(post(server, "/completion", {**body, "model": "base.gguf:nope"}), "model",
                      "no LoRA adapter 'nope' is loaded")
    assert_400_naming(post(server, "/v1/completions", {**body, "model": "x:nope"}), "model",
                      "loaded: all, qvd")
    assert_400_naming(post(server, "/completion", {**body, "lora": [{"id": 2, "scale": 1}]}),
                      "lora[0].id", "no LoRA adapter 2 is loaded (ids 0..1 are loaded)")
    assert_400_naming(post(server, "/completion", {**body, "lora": [{"id": 0, "scale": "x"}]}),
                      "lora[0].scale", "must be a finite number")
    error = assert_400_naming(post(server, "/completion", {**body, "lora": [
        {"id": 0, "scale": 1}, {"id": 1, "scale": 1}]}), "lora", "one LoRA adapter per request")
    assert error["code"] == "unsupported_parameter"
    assert_400_naming(post(server, "/completion", {**body, "lora": {"id": 0}}), "lora",
                      "must be an array")


def test_global_scales_serve_requests_that_pick_none(server: RunningServer,
                                                     lora_case: LoraCase) -> None:
    try:
        assert ok(server, "/lora-adapters", [{"id": 1, "scale": 1.0}]) == {"success": True}
        scales = [a["scale"] for a in httpx.get(server.url + "/lora-adapters").json()]
        assert scales == [0.0, 1.0]
        assert completion_tokens(server) == peft_greedy(lora_case, "qvd")
        # A request's own choice wins; its list sets every adapter (unlisted ones: 0).
        assert completion_tokens(server, lora=[]) == peft_greedy(lora_case, None)
        assert completion_tokens(server, lora=[{"id": 0, "scale": 1}]) == \
            peft_greedy(lora_case, "all")
        response = post(server, "/lora-adapters", [{"id": 0, "scale": 1}, {"id": 1, "scale": 1}])
        assert response.status_code == 400 and "one LoRA adapter" in response.text
        assert_400_naming(post(server, "/lora-adapters", [{"id": 9, "scale": 1}]), "[0].id",
                          "no LoRA adapter 9")
    finally:
        assert ok(server, "/lora-adapters", []) == {"success": True}
    assert [a["scale"] for a in httpx.get(server.url + "/lora-adapters").json()] == [0.0, 0.0]
    assert np.array_equal(completion_tokens(server), peft_greedy(lora_case, None))


def test_serve_refuses_adapters_beside_several_models(lora_case: LoraCase, tmp_path) -> None:
    import shutil
    import subprocess
    import sys

    other = shutil.copy(lora_case.base_gguf, tmp_path / "other.gguf")
    for flags, message in (([str(other), "--lora", f"all={lora_case.adapter_ggufs['all']}"],
                            "LoRA adapters go with one served model"),
                           (["--lora", "all"], "'all': expected NAME=FILE"),
                           (["--lora", "x=/nonexistent.gguf"], "/nonexistent.gguf: no such file")):
        run = subprocess.run([sys.executable, "-m", "ember.cli", "serve", str(lora_case.base_gguf),
                              *flags], capture_output=True, text=True, timeout=60)
        assert run.returncode != 0 and message in " ".join(run.stderr.split()), run.stderr
