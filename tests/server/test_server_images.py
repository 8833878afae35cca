"""Images through every door of the server: OpenAI's image_url parts (object and string forms),
Anthropic image blocks (base64 and url sources), Responses input_image parts, each sent by the
real SDK clients with real PNG/JPEG bytes made here with Pillow.

On stories260K (a text model, no projector) every door answers the clear 400 that names the
image's part, and bad images (truncated, 1x1, 20000x20000, not an image, bad base64) answer a
400 saying what is wrong, the server serving the next request. A scripted engine that takes
images (the contract of ember.media, as a vision model's engine keeps it) shows what reaches the
engine: the prompt's text with one marker per image, in order, and the decoded pixels, exactly.
Local files only under --allowed-local-media-path, remote URLs only with --allow-remote-images
(a local http.server serves the PNG), and the limits (count, bytes, pixels)."""

from __future__ import annotations

import base64
import http.server
import io
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anthropic
import httpx
import numpy as np
import openai
import pytest
from PIL import Image
from server_support import RunningServer, ScriptedEngine, fake_config, serving

from ember.media import MEDIA_MARKER
from ember.server.config import ServerConfig

NO_VISION = "this model takes no images; start the server with --mmproj FILE"


def encoded(pixels: np.ndarray, fmt: str = "PNG", **kwargs: Any) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt, **kwargs)
    return out.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


RNG = np.random.default_rng(45)
PIXELS = RNG.integers(0, 256, (12, 16, 3), dtype=np.uint8)  # height 12, width 16
PNG = encoded(PIXELS)
OTHER = RNG.integers(0, 256, (8, 5, 3), dtype=np.uint8)
JPEG = encoded(OTHER, "JPEG", quality=90)
JPEG_PIXELS = np.asarray(Image.open(io.BytesIO(JPEG)).convert("RGB"))  # Pillow's own decode


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def chat_body(*parts: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": list(parts)}], "max_tokens": 2}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


class VisionEngine(ScriptedEngine):
    """ScriptedEngine that takes images as the contract says: tokenize_images expands nothing
    (a marker stays its characters) and records the text and pixels; submit records the
    pixels it was given."""

    vision = True
    n_ctx = 512

    def __init__(self) -> None:
        super().__init__()
        self.tokenized: list[tuple[str, list[np.ndarray]]] = []
        self.submitted: list[list[np.ndarray]] = []

    def tokenize_images(self, text: str, images: Sequence[np.ndarray]) -> list[int]:
        if text.count(MEDIA_MARKER) != len(images):
            raise ValueError(f"the prompt has {text.count(MEDIA_MARKER)} image markers for "
                             f"{len(images)} images")
        self.tokenized.append((text, list(images)))
        return self.tokenizer.encode(text)

    def submit(self, prompt_tokens: Sequence[int], params: Any = None, *,
               images: Sequence[Any] = (), **kwargs: Any) -> Any:
        self.submitted.append(list(images))
        return super().submit(prompt_tokens, params, **kwargs)


class PNGHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        if self.path != "/cat.png":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("media")
    (root / "media").mkdir()
    (root / "media" / "cat.png").write_bytes(PNG)
    (root / "secret.png").write_bytes(PNG)  # beside the allowed directory, not in it
    (root / "media" / "escape.png").symlink_to(root / "secret.png")
    return root


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), PNGHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def server(stories_path: Path, media_dir: Path) -> Iterator[RunningServer]:
    """stories260K, a text model: images are refused, files allowed under media/."""
    config = ServerConfig(model=str(stories_path), parallel=1, threads=1, ctx_size=512,
                          allowed_local_media_path=str(media_dir / "media"))
    with serving(config) as running:
        yield running


@pytest.fixture(scope="module")
def vision() -> tuple[RunningServer, VisionEngine]:
    engine = VisionEngine()
    config = fake_config(allow_remote_images=True, max_images=3, image_max_bytes=4096,
                         image_max_pixels=10_000)
    with serving(config, lambda: engine) as running:
        yield running, engine


def error_of(response: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text
    return response.json()["error"]


def post(server: RunningServer, path: str, body: Any) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def answers_text(server: RunningServer) -> None:
    """The server still serves: a text request answers."""
    response = post(server, "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] is not None


# --- a text model: every door reaches the engine's "no vision" -----------------------------

def test_openai_client_image_url_on_a_text_model(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", max_tokens=2, messages=[
            {"role": "user", "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": data_url(PNG), "detail": "low"}}]}])
    error = caught.value.body
    assert caught.value.status_code == 400
    assert error["message"] == f"'messages[0].content[1]': {NO_VISION} (the model's vision " \
                               "projector)"
    assert error["param"] == "messages[0].content[1]"
    # The string form (llama-server's and vLLM's clients send it too), in a later message.
    body = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                         {"role": "user", "content": [{"type": "image_url",
                                                       "image_url": data_url(JPEG, "image/jpeg")}]}]}
    assert error_of(post(server, "/v1/chat/completions", body))["param"] == \
        "messages[2].content[0]"
    answers_text(server)


def test_anthropic_client_image_blocks_on_a_text_model(server: RunningServer) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="m", max_tokens=2, system="Be brief.", messages=[
            {"role": "user", "content": [
                {"type": "text", "text": "Describe it."},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": base64.b64encode(PNG).decode()}}]}])
    assert caught.value.status_code == 400
    # Named as the Messages request has it (the system prompt moves nothing).
    assert caught.value.body["error"]["message"].startswith(
        f"'messages[0].content[1]': {NO_VISION}")
    url_block = {"type": "image", "source": {"type": "url", "url": data_url(PNG)}}
    response = post(server, "/v1/messages", {"max_tokens": 2, "messages": [
        {"role": "user", "content": [url_block]}]})
    assert error_of(response)["message"].startswith(f"'messages[0].content[0]': {NO_VISION}")
    file_block = {"type": "image", "source": {"type": "file", "file_id": "file_1"}}
    response = post(server, "/v1/messages", {"max_tokens": 2, "messages": [
        {"role": "user", "content": [file_block]}]})
    assert "'messages[0].content[0].source' must be" in error_of(response)["message"]
    answers_text(server)


def test_responses_input_image_on_a_text_model(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="m", max_output_tokens=2, input=[
            {"role": "user", "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": data_url(PNG), "detail": "auto"}]}])
    assert caught.value.status_code == 400
    assert caught.value.body["message"].startswith(f"'input[0].content[1]': {NO_VISION}")
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="m", max_output_tokens=2, input=[
            {"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}])
    assert caught.value.body["param"] == "input[0].content[0].file_id"
    assert caught.value.body["code"] == "unsupported_parameter"
    answers_text(server)


# --- bad images: a 400 saying what is wrong, and the server keeps serving ----------------

def _huge() -> bytes:
    out = io.BytesIO()
    Image.new("1", (20000, 20000)).save(out, "PNG")
    return out.getvalue()


HUGE = _huge()
BAD_IMAGES = {
    "truncated": (data_url(PNG[:len(PNG) // 2]), "truncated"),
    "one_pixel": (data_url(encoded(np.zeros((1, 1, 3), np.uint8))), "1x1 pixels"),
    # 20000x20000 one-bit pixels compress to 48 KB: refused from its header, never decoded.
    "huge": (data_url(HUGE), "more pixels"),
    "not_an_image": (data_url(b"plain text, not a picture"), "not an image"),
    "tiff": (data_url(encoded(PIXELS, "TIFF")), "PNG, JPEG, WebP, GIF and BMP"),
    "bad_base64": ("data:image/png;base64,***", "not valid base64"),
    "text_data_url": ("data:text/plain;base64,aGk=", "no image"),
    "no_url": ("", "needs"),
}


@pytest.mark.parametrize("name", list(BAD_IMAGES))
def test_bad_images_answer_400_and_the_server_keeps_serving(server: RunningServer,
                                                            name: str) -> None:
    url, reason = BAD_IMAGES[name]
    error = error_of(post(server, "/v1/chat/completions",
                          chat_body(text_part("Look:"), image_part(url))))
    assert error["param"] == "messages[0].content[1]", error
    assert error["message"].startswith("'messages[0].content[1]'"), error
    assert reason in error["message"], error
    answers_text(server)


def test_image_parts_only_in_user_messages(server: RunningServer) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": [image_part(data_url(PNG))]},
                         {"role": "user", "content": "Well?"}]}
    error = error_of(post(server, "/v1/chat/completions", body))
    assert error["param"] == "messages[1].content[0]"
    assert "images go in user messages" in error["message"]
    detail = {"type": "image_url", "image_url": {"url": data_url(PNG), "detail": "max"}}
    assert "detail" in error_of(post(server, "/v1/chat/completions", chat_body(detail)))["message"]


# --- sources: files and remote URLs only where the server allows them ----------------------

def test_local_files_only_under_the_allowed_directory(server: RunningServer,
                                                      media_dir: Path) -> None:
    cases = {
        f"file://{media_dir}/secret.png": "outside the directory",
        f"file://{media_dir}/media/escape.png": "outside the directory",  # a symlink out
        "file://../secret.png": "outside the directory",
        f"file://{media_dir}/media/missing.png": "no such file",
        f"file://{media_dir}/media": "is a directory",
    }
    for url, reason in cases.items():
        error = error_of(post(server, "/v1/chat/completions", chat_body(image_part(url))))
        assert reason in error["message"], (url, error)
    # Allowed: read, decoded, then the model says it takes none (relative: llama-server's way).
    for url in (f"file://{media_dir}/media/cat.png", "file://cat.png"):
        error = error_of(post(server, "/v1/chat/completions", chat_body(image_part(url))))
        assert NO_VISION in error["message"], (url, error)
    answers_text(server)


def test_remote_urls_refused_without_the_flag(server: RunningServer, image_host: str) -> None:
    error = error_of(post(server, "/v1/chat/completions",
                          chat_body(image_part(f"{image_host}/cat.png"))))
    assert error["code"] == "remote_images_disallowed"
    assert "--allow-remote-images" in error["message"]


def test_no_local_files_without_the_flag(vision: tuple[RunningServer, VisionEngine],
                                         media_dir: Path) -> None:
    running, _ = vision
    error = error_of(post(running, "/v1/chat/completions",
                          chat_body(image_part(f"file://{media_dir}/media/cat.png"))))
    assert error["code"] == "local_images_disallowed"
    assert "--allowed-local-media-path" in error["message"]


# --- a model that takes images: what reaches the engine ----------------------------------

def test_pixels_and_markers_reach_the_engine_in_order(
        vision: tuple[RunningServer, VisionEngine]) -> None:
    running, engine = vision
    client = openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0)
    engine.tokenized.clear()
    engine.submitted.clear()
    answer = client.chat.completions.create(model="m", max_tokens=2, messages=[
        {"role": "user", "content": [
            {"type": "text", "text": "Compare"},
            {"type": "image_url", "image_url": {"url": data_url(PNG)}},
            {"type": "text", "text": "with"},
            {"type": "image_url", "image_url": {"url": data_url(JPEG, "image/jpeg")}}]}])
    assert answer.choices[0].message.content == "ok"
    [(text, images)] = engine.tokenized
    # Parts joined as llama.cpp joins them: "\n" between texts, none around a marker.
    assert text == f"Compare{MEDIA_MARKER}with{MEDIA_MARKER}"
    assert [i.shape for i in images] == [(12, 16, 3), (8, 5, 3)]
    assert all(i.dtype == np.uint8 for i in images)
    np.testing.assert_array_equal(images[0], PIXELS)
    np.testing.assert_array_equal(images[1], JPEG_PIXELS)
    [submitted] = engine.submitted
    assert [s is i for s, i in zip(submitted, images)] == [True, True]


def test_anthropic_and_responses_images_reach_the_engine(
        vision: tuple[RunningServer, VisionEngine]) -> None:
    running, engine = vision
    engine.tokenized.clear()
    anthropic_client = anthropic.Anthropic(base_url=running.url, api_key="unused", max_retries=0)
    reply = anthropic_client.messages.create(model="m", max_tokens=2, messages=[
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(PNG).decode()}},
            {"type": "text", "text": "What?"}]}])
    assert reply.content[0].text == "ok"
    openai_client = openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0)
    response = openai_client.responses.create(model="m", max_output_tokens=2, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "And"},
                                     {"type": "input_image", "image_url": data_url(JPEG)}]}])
    assert response.output_text == "ok"
    (first, first_images), (second, second_images) = engine.tokenized
    assert first == f"{MEDIA_MARKER}What?" and second == f"And{MEDIA_MARKER}"
    np.testing.assert_array_equal(first_images[0], PIXELS)
    np.testing.assert_array_equal(second_images[0], JPEG_PIXELS)


def test_remote_url_fetched_with_the_flag(vision: tuple[RunningServer, VisionEngine],
                                          image_host: str) -> None:
    running, engine = vision
    engine.tokenized.clear()
    response = post(running, "/v1/chat/completions", chat_body(image_part(f"{image_host}/cat.png")))
    assert response.status_code == 200, response.text
    np.testing.assert_array_equal(engine.tokenized[0][1][0], PIXELS)
    error = error_of(post(running, "/v1/chat/completions",
                          chat_body(image_part(f"{image_host}/missing.png"))))
    assert error["code"] == "image_fetch_failed" and "HTTP 404" in error["message"]
    # Nothing listens on port 9 of loopback (discard): the fetch fails, the server goes on.
    error = error_of(post(running, "/v1/chat/completions",
                          chat_body(image_part("http://127.0.0.1:9/cat.png"))))
    assert error["code"] == "image_fetch_failed"
    answers_text(running)


def test_limits(vision: tuple[RunningServer, VisionEngine]) -> None:
    running, _ = vision
    # Count: at most 3 images (--limit-mm-per-prompt image=3); the fourth is named.
    error = error_of(post(running, "/v1/chat/completions",
                          chat_body(*[image_part(data_url(PNG))] * 4)))
    assert error["param"] == "messages[0].content[3]" and error["code"] == "too_many_images"
    assert "4 images" in error["message"] and "limit of 3" in error["message"]
    # Bytes: over --image-max-size is a 413 (noise compresses to more than 4096 bytes).
    noise = encoded(RNG.integers(0, 256, (48, 48, 3), dtype=np.uint8))
    assert len(noise) > 4096
    error = error_of(post(running, "/v1/chat/completions", chat_body(image_part(data_url(noise)))),
                     413)
    assert error["code"] == "image_too_large" and "4096" in error["message"]
    # Pixels: 101 x 100 is over --image-max-pixels 10000, said before decoding.
    wide = encoded(np.zeros((100, 101, 3), np.uint8))
    error = error_of(post(running, "/v1/chat/completions", chat_body(image_part(data_url(wide)))))
    assert "101x100" in error["message"] and "10000" in error["message"]
    answers_text(running)


def test_a_marker_typed_into_the_text_is_a_400(vision: tuple[RunningServer, VisionEngine]
                                               ) -> None:
    running, _ = vision
    error = error_of(post(running, "/v1/chat/completions",
                          chat_body(text_part(f"a {MEDIA_MARKER} here"), image_part(data_url(PNG)))))
    assert error["param"] == "messages" and "2 image markers for 1 images" in error["message"]


def test_limit_flag_parsing() -> None:
    import typer

    from ember.commands.serve import _image_limit

    assert _image_limit("image=2") == 2
    assert _image_limit('{"image": 5}') == 5
    for bad in ("image=0", "video=1", "image", '{"image": "x"}', "{"):
        with pytest.raises(typer.BadParameter):
            _image_limit(bad)


# --- llama-server's /completion multimodal_data and /props ----------------------------------

def test_completion_multimodal_data(server: RunningServer,
                                    vision: tuple[RunningServer, VisionEngine]) -> None:
    raw = base64.b64encode(PNG).decode()  # llama-server's: plain base64, no data URL
    prompt = {"prompt_string": f"{MEDIA_MARKER}A picture of", "multimodal_data": [raw]}
    error = error_of(post(server, "/completion", {"prompt": prompt, "n_predict": 2}))
    assert error["param"] == "prompt.multimodal_data[0]" and NO_VISION in error["message"]
    assert httpx.get(server.url + "/props").json()["modalities"]["vision"] is False
    running, engine = vision
    assert httpx.get(running.url + "/props").json()["modalities"]["vision"] is True
    engine.tokenized.clear()
    engine.submitted.clear()
    answer = post(running, "/completion", {"prompt": prompt, "n_predict": 2})
    assert answer.status_code == 200, answer.text
    assert answer.json()["content"] == "ok"
    [(text, images)] = engine.tokenized
    assert text == f"{MEDIA_MARKER}A picture of"
    np.testing.assert_array_equal(images[0], PIXELS)
    np.testing.assert_array_equal(engine.submitted[0][0], PIXELS)
    two = post(running, "/completion", {"prompt": [prompt, "text"], "n_predict": 2})
    assert "only prompt" in error_of(two)["message"]
    bad = post(running, "/completion", {"prompt": {"prompt_string": "x", "multimodal_data": 5}})
    assert error_of(bad)["param"] == "prompt.multimodal_data"
    truncated = {"prompt_string": MEDIA_MARKER, "multimodal_data": [
        base64.b64encode(PNG[:len(PNG) // 2]).decode()]}
    error = error_of(post(running, "/completion", {"prompt": truncated, "n_predict": 2}))
    assert error["param"] == "prompt.multimodal_data[0]" and "truncated" in error["message"]
    mismatch = {"prompt_string": "no marker", "multimodal_data": [raw]}
    error = error_of(post(running, "/completion", {"prompt": mismatch, "n_predict": 2}))
    assert error["param"] == "prompt" and "0 image markers for 1 images" in error["message"]


def test_fitting_the_context_keeps_the_kept_messages_images(
        vision: tuple[RunningServer, VisionEngine]) -> None:
    running, engine = vision
    engine.tokenized.clear()
    engine.submitted.clear()
    # Responses' truncation "auto" drops the oldest turn (600 characters: 600 scripted tokens,
    # more than the context of 512) and its image with it.
    response = post(running, "/v1/responses", {"max_output_tokens": 2, "truncation": "auto", "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": data_url(PNG)},
                                     {"type": "input_text", "text": "x" * 600}]},
        {"role": "assistant", "content": "Seen."},
        {"role": "user", "content": [{"type": "input_image", "image_url": data_url(JPEG)},
                                     {"type": "input_text", "text": "And this?"}]}]})
    assert response.status_code == 200, response.text
    text, images = engine.tokenized[-1]
    assert text == f"{MEDIA_MARKER}And this?"
    assert len(images) == 1 and len(engine.submitted[-1]) == 1
    np.testing.assert_array_equal(engine.submitted[-1][0], JPEG_PIXELS)
