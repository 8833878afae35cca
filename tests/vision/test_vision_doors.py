"""Images through every door into the real vision engine: the tiny random Gemma 3 with its
mmproj (tests/vision_support.py) served by `ember serve --mmproj` as a child process, asked by
the real openai and anthropic clients with the same PNG, and `ember run --image`: each door's
prompt token count and first-token distribution equal LLM.chat(images=...)'s on the same file,
and a repeated image is served from the prefix cache. The tiny model's greedy text is newlines
whatever the image, so the doors are compared by the first token's five most likely tokens and
their log-probabilities (the same engine on the same file, one request at a time: the same
arithmetic, equal to 1e-5), which the image moves."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys

import anthropic
import openai
import pytest
from PIL import Image
from server_support import serve_process
from vision_support import GEMMA3_MM_TOKENS, make_gemma3_vision, sample_image, save_gemma3_vision

from ember.convert import convert
from ember.llm import LLM

QUESTION = "What is in the picture?"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(text GGUF, mmproj GGUF, PNG path, PNG bytes)."""
    folder = tmp_path_factory.mktemp("vision-doors")
    save_gemma3_vision(make_gemma3_vision(), folder / "hf")
    result = convert(folder / "hf", folder / "tiny.gguf", "f16", progress=False)
    png = io.BytesIO()
    Image.fromarray(sample_image(3)).save(png, format="PNG")
    (folder / "picture.png").write_bytes(png.getvalue())
    return result.path, result.mmproj, folder / "picture.png", png.getvalue()


def first_top5(llm: LLM, images: list) -> tuple[dict[str, float], int]:
    """LLM.chat's first token for QUESTION with `images`: ({token text: log-probability} of
    the five most likely, prompt tokens)."""
    result = llm.chat([{"role": "user", "content": QUESTION}], images=images, max_tokens=1,
                      temperature=0, logprobs=True, top_logprobs=5)
    return {t.text: t.logprob for t in result.logprobs[0].top}, result.usage.prompt_tokens


@pytest.fixture(scope="module")
def reference(files):
    """first_top5 with the picture, and without it."""
    text, mmproj, picture, _ = files
    llm = LLM(text, mmproj=mmproj, n_threads=2, n_ctx=256, parallel=1, device="cpu")
    try:
        return first_top5(llm, [picture]), first_top5(llm, [])
    finally:
        llm.close()


def close(got: dict[str, float], want: dict[str, float]) -> bool:
    return got.keys() == want.keys() and all(abs(got[k] - want[k]) < 1e-5 for k in want)


def test_the_reference_sees_the_image(reference) -> None:
    (with_image, n_with), (without, n_without) = reference
    # The image adds its soft tokens and their two framing tokens to the prompt, and moves the
    # first token's distribution.
    assert n_with >= n_without + GEMMA3_MM_TOKENS + 2
    assert max(abs(with_image[k] - without.get(k, -99.0)) for k in with_image) > 0.01


def test_openai_and_anthropic_clients_send_the_image(files, reference, tmp_path) -> None:
    text, mmproj, _, png = files
    (want, n_prompt), _ = reference
    data = base64.b64encode(png).decode()
    args = ["--mmproj", str(mmproj), "--threads", "2", "--ctx-size", "256", "--parallel", "1",
            "--device", "cpu"]
    with serve_process(text, args, tmp_path) as (base, _):
        client = openai.OpenAI(base_url=base + "/v1", api_key="none")
        # The image before the text, where LLM.chat(images=) puts it.
        messages = [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + data}},
            {"type": "text", "text": QUESTION}]}]
        for _ in range(2):
            answer = client.chat.completions.create(
                model="tiny", messages=messages, max_tokens=1, temperature=0, logprobs=True,
                top_logprobs=5)
            top = answer.choices[0].logprobs.content[0].top_logprobs
            assert close({t.token: t.logprob for t in top}, want)
            assert answer.usage.prompt_tokens == n_prompt
        # The second time the image came from the prefix cache.
        assert answer.usage.prompt_tokens_details.cached_tokens > GEMMA3_MM_TOKENS

        claude = anthropic.Anthropic(base_url=base, api_key="none")
        answer = claude.messages.create(
            model="tiny", max_tokens=1, extra_body={"temperature": 0},
            messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": data}},
                {"type": "text", "text": QUESTION}]}])
        # Anthropic's input_tokens leave out what the cache read: the same image through
        # another door is the same cache entry.
        usage = answer.usage
        assert usage.input_tokens + usage.cache_read_input_tokens == n_prompt
        assert usage.cache_read_input_tokens > GEMMA3_MM_TOKENS
        assert answer.content[0].text == max(want, key=want.get)


def test_ember_run_image(files, reference) -> None:
    text, mmproj, picture, _ = files
    (want, n_prompt), _ = reference
    run = subprocess.run(
        [sys.executable, "-m", "ember.cli", "run", str(text), "--mmproj", str(mmproj),
         "--image", str(picture), "-p", QUESTION, "-n", "1", "--temp", "0", "--json",
         "--threads", "2", "--ctx-size", "256", "--device", "cpu"],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert answer["usage"]["prompt_tokens"] == n_prompt
    assert answer["text"] == max(want, key=want.get)  # greedy: the most likely first token
