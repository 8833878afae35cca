"""Every error the server answers, in OpenAI's shape {"error": {"message", "type", "param",
"code"}}: client mistakes (400), API keys (401), unknown routes (404), large bodies (413), a
full queue or a loading model (503), failures after streaming started (an SSE error event) and
bugs (500 without a traceback). Model-dependent checks run on stories260K; the rest on a
scripted engine."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_support import RunningServer, ScriptedEngine, fake_config, scripted, serving, start_server

from ember.server.config import ServerConfig

KEY = "sk-test-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server(stories_path: Path) -> Iterator[RunningServer]:
    config = ServerConfig(model=str(stories_path), parallel=1, threads=1, ctx_size=512,
                          api_key=KEY, aliases=["stories"])
    with serving(config) as running:
        yield running


def assert_error(response: httpx.Response, status: int, param: str | None = None,
                 code: str | None = None, contains: tuple[str, ...] = ()) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    # A prompt over the context also carries llama-server's counts (errors.context_exceeded).
    counts = {"n_prompt_tokens", "n_ctx"} if error.get("code") == "context_length_exceeded" else set()
    assert set(error) == {"message", "type", "param", "code"} | counts
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert "Traceback" not in response.text
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    for text in contains:
        assert text in error["message"], error["message"]
    return error


def post(server: RunningServer, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    kwargs.setdefault("headers", AUTH)
    if isinstance(body, (bytes, str)):
        headers = {"content-type": "application/json", **kwargs.pop("headers")}
        return httpx.post(server.url + path, content=body, headers=headers, **kwargs)
    return httpx.post(server.url + path, json=body, **kwargs)


# --- 400: client mistakes ----------------------------------------------------------------------

def test_malformed_json(server: RunningServer) -> None:
    error = assert_error(post(server, "/v1/chat/completions", b'{"messages": [}'), 400,
                         code="invalid_json")
    assert error["type"] == "invalid_request_error"
    assert_error(post(server, "/v1/completions", b"[1, 2]"), 400, code="invalid_json")
    assert_error(post(server, "/v1/completions", b'{"prompt": "a", "temperature": NaN}'), 400,
                 code="invalid_json")


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", "hot"), ("max_tokens", "ten"), ("max_tokens", 2.5), ("n", True),
    ("stream", "yes"), ("stop", [1, 2]), ("logit_bias", [1]), ("seed", "x"),
    ("top_p", "high"), ("logprobs", 3),
])
def test_wrong_field_types(server: RunningServer, field: str, value: Any) -> None:
    assert_error(post(server, "/v1/chat/completions", {**CHAT, field: value}), 400,
                 param=field)


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", -1), ("top_p", 1.5), ("max_tokens", 0), ("presence_penalty", 3),
    ("top_logprobs", 21), ("seed", -2),
])
def test_out_of_range_values(server: RunningServer, field: str, value: Any) -> None:
    body = {**CHAT, field: value}
    if field == "top_logprobs":
        body["logprobs"] = True
    assert_error(post(server, "/v1/chat/completions", body), 400, param=field,
                 contains=(field,))


def test_messages_errors(server: RunningServer) -> None:
    url = "/v1/chat/completions"
    assert_error(post(server, url, {"messages": []}), 400, param="messages",
                 contains=("empty",))
    assert_error(post(server, url, {"max_tokens": 1}), 400, param="messages",
                 code="missing_required")
    assert_error(post(server, url, {"messages": "Hi"}), 400, param="messages")
    assert_error(post(server, url, {"messages": [{"content": "Hi"}]}), 400,
                 param="messages[0].role")
    assert_error(post(server, url, {"messages": [{"role": "user", "content": 5}]}), 400,
                 param="messages[0].content")
    audio = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]
    assert_error(post(server, url, {"messages": audio}), 400, param="messages[0].content[0]",
                 code="unsupported_content", contains=("text parts", "image_url"))


def test_prompt_longer_than_context(server: RunningServer) -> None:
    prompt = "Once upon a time " * 200
    n_tokens = post(server, "/tokenize", {"content": prompt}).json()["count"]
    assert n_tokens > 512
    error = assert_error(post(server, "/v1/completions", {"prompt": prompt}), 400,
                         param="prompt", code="context_length_exceeded",
                         contains=(str(n_tokens), "512"))
    assert "context" in error["message"]
    # llama-server's shape beside OpenAI's code: its clients read the type and the counts.
    assert error["type"] == "exceed_context_size_error"
    assert (error["n_prompt_tokens"], error["n_ctx"]) == (n_tokens, 512)
    chat = {"messages": [{"role": "user", "content": prompt}]}
    assert_error(post(server, "/v1/chat/completions", chat), 400, param="messages",
                 code="context_length_exceeded", contains=("512",))


def test_n_too_large(server: RunningServer) -> None:
    assert_error(post(server, "/v1/chat/completions", {**CHAT, "n": 17}), 400, param="n",
                 contains=("17", "16"))
    assert_error(post(server, "/v1/completions", {"prompt": "a", "n": 0}), 400, param="n")


def test_response_format_is_honoured_or_refused(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)
    any_object = {"name": "x", "schema": {"type": "object"}}
    for response_format in ({"type": "json_object"}, {"type": "json_schema", "json_schema": any_object}):
        out = client.chat.completions.create(model="stories", messages=CHAT["messages"], max_tokens=4,
                                             response_format=response_format)  # type: ignore
        assert out.choices[0].message.content.startswith("{")
    for bad in ({"type": "xml"}, {"type": "json_schema", "json_schema": {"schema": {"uniqueItems": True}}}):
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(model="stories", messages=CHAT["messages"],
                                           response_format=bad)  # type: ignore
        assert raised.value.status_code == 400
        assert "response_format" in raised.value.message
    out = client.chat.completions.create(model="stories", messages=CHAT["messages"],
                                         max_tokens=2, response_format={"type": "text"})
    assert out.choices[0].message.content is not None


@pytest.mark.parametrize("field", [{"tools": [{"type": "function", "function": {"name": "f"}}]},
                                   {"suffix": "end"}])
def test_unsupported_options_are_refused(server: RunningServer, field: dict[str, Any]) -> None:
    [name] = field
    body = {"prompt": "a", **field}
    assert_error(post(server, "/v1/completions", body), 400, param=name,
                 code="unsupported_parameter")


def test_a_forced_tool_call_and_another_constraint_are_a_400(server: RunningServer) -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        body = {**CHAT, "tools": tools, "tool_choice": choice,
                "response_format": {"type": "json_object"}}
        assert_error(post(server, "/v1/chat/completions", body), 400, param="tool_choice",
                     code="invalid_value", contains=("response_format",))


def test_any_model_name_is_answered_by_the_served_model(server: RunningServer) -> None:
    """One model served: every name is answered, under the served id (apps hard-code names,
    and llama-server answers them too); GET /v1/models/NAME still says which names exist."""
    client = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)
    out = client.chat.completions.create(model="gpt-4o", messages=CHAT["messages"],
                                         max_tokens=1)
    assert out.model == "stories"
    text = client.completions.create(model="gpt-3.5-turbo-instruct", prompt="a", max_tokens=1)
    assert text.model == "stories"
    assert_error(httpx.get(server.base_url + "/models/gpt-4o", headers=AUTH), 404,
                 code="model_not_found")


def test_bad_prompt_tokens_and_logit_bias(server: RunningServer) -> None:
    assert_error(post(server, "/v1/completions", {"prompt": [1, 99999]}), 400, param="prompt",
                 contains=("99999",))
    assert_error(post(server, "/v1/completions", {"prompt": []}), 400, param="prompt")
    assert_error(post(server, "/v1/completions", {"prompt": "a", "logit_bias": {"600": 1}}),
                 400, param="logit_bias", contains=("600",))
    assert_error(post(server, "/v1/completions", {"prompt": "a", "logit_bias": {"5": 500}}),
                 400, param="logit_bias")
    assert_error(post(server, "/detokenize", {"tokens": [5, 100000]}), 400, param="tokens")
    assert_error(post(server, "/tokenize", {}), 400, param="content")


# --- 401, 404, 405 -----------------------------------------------------------------------------

def _assert_nothing_running(server: RunningServer, wait: float = 0.05) -> None:
    engine = server.server.ctx.engine
    assert engine is not None
    time.sleep(wait)  # anything submitted would be running by now
    stats = engine.stats()
    assert (stats.running, stats.waiting) == (0, 0)
    slots = httpx.get(server.url + "/slots", headers=AUTH).json()
    assert not any(s["is_processing"] for s in slots)
    assert not server.server.ctx.slots.live


def test_a_refused_request_leaves_nothing_running(server: RunningServer) -> None:
    """A request refused after validation started (a stop string that is not valid text, with
    n=16) is a 400, and the engine holds no sequence of it afterwards."""
    body = json.dumps({**CHAT, "n": 16, "max_tokens": 200, "stop": ["ok", "\udc80"]})  # JSON-escaped
    assert_error(post(server, "/v1/chat/completions", body), 400, code="invalid_value",
                 contains=("lone surrogate",))
    _assert_nothing_running(server, wait=0.2)


def test_api_key(server: RunningServer) -> None:
    no_key = httpx.post(server.base_url + "/chat/completions", json=CHAT)
    assert_error(no_key, 401, code="invalid_api_key", contains=("Authorization",))
    wrong = httpx.post(server.base_url + "/chat/completions", json=CHAT,
                       headers={"Authorization": "Bearer sk-wrong"})
    assert_error(wrong, 401, code="invalid_api_key")
    assert_error(httpx.get(server.url + "/metrics"), 401)
    assert_error(httpx.get(server.base_url + "/models",
                           headers={"Authorization": KEY}), 401)  # no Bearer scheme
    assert httpx.get(server.url + "/health").status_code == 200  # public
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base_url, api_key="nope", max_retries=0).models.list()
    assert openai.OpenAI(base_url=server.base_url, api_key=KEY).models.list().data


def test_unknown_route_and_method(server: RunningServer) -> None:
    assert_error(httpx.get(server.url + "/v1/nothing", headers=AUTH), 404, code="not_found")
    assert_error(httpx.post(server.url + "/v2/chat", headers=AUTH), 404)
    assert_error(httpx.get(server.base_url + "/chat/completions", headers=AUTH), 405)


# --- the scripted engine: 413, 503, errors mid-stream, bugs ---------------------------------

@pytest.fixture()
def fake() -> Iterator[tuple[RunningServer, ScriptedEngine]]:
    make, engine = scripted(max_queue=0)
    running = start_server(fake_config(max_body_bytes=4096), make)
    yield running, engine
    running.stop()


def test_body_over_the_limit(fake: tuple[RunningServer, ScriptedEngine]) -> None:
    server, _ = fake
    big = {"messages": [{"role": "user", "content": "x" * 10_000}]}
    assert_error(post(server, "/v1/chat/completions", big), 413, code="request_too_large",
                 contains=("4096",))
    # Without a Content-Length (chunked), the limit holds while reading.
    chunks = iter([b'{"prompt": "', b"x" * 5000, b'"}'])
    assert_error(httpx.post(server.base_url + "/completions", content=chunks,
                            headers={"content-type": "application/json"}), 413)
    assert post(server, "/v1/chat/completions", CHAT).status_code == 200


def test_queue_full_is_503_at_once(fake: tuple[RunningServer, ScriptedEngine]) -> None:
    server, backend = fake
    held: dict[str, Any] = {}

    def hold() -> None:
        held["response"] = post(server, "/v1/chat/completions",
                                {"messages": [{"role": "user", "content": "hold"}]}, timeout=30)

    thread = threading.Thread(target=hold)
    thread.start()
    deadline = time.monotonic() + 10
    while backend.stats().running == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    start = time.monotonic()
    busy = post(server, "/v1/chat/completions", CHAT)
    assert time.monotonic() - start < 1.0
    assert_error(busy, 503, code="queue_full")
    assert busy.headers["retry-after"] == "1"
    with pytest.raises(openai.APIStatusError) as raised:
        openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0) \
            .chat.completions.create(model="fake", messages=CHAT["messages"])
    assert raised.value.status_code == 503
    server.server.ctx.loop.call_soon_threadsafe(backend.release.set)  # type: ignore[union-attr]
    thread.join(10)
    assert held["response"].status_code == 200
    assert held["response"].json()["choices"][0]["message"]["content"] == "ok"


def test_error_after_streaming_started(fake: tuple[RunningServer, ScriptedEngine]) -> None:
    server, _ = fake
    body = {"messages": [{"role": "user", "content": "fail-after-first"}], "stream": True}
    with httpx.stream("POST", server.base_url + "/chat/completions", json=body) as response:
        assert response.status_code == 200
        events = [e for e in response.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert payloads[1]["choices"][0]["delta"] == {"content": "o"}
    error = payloads[-1]["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "the model broke" in error["message"]
    assert error["type"] == "server_error"
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.APIError) as raised:
        for _ in client.chat.completions.create(model="fake", messages=body["messages"],
                                                stream=True):
            pass
    assert "the model broke" in str(raised.value)


def test_bug_is_500_without_details(fake: tuple[RunningServer, ScriptedEngine]) -> None:
    server, _ = fake
    response = post(server, "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": "bug-in-submit"}]})
    error = assert_error(response, 500, code="internal_error")
    assert error["type"] == "server_error"
    assert "RuntimeError" not in response.text and "a bug in the backend" not in response.text


def test_loading_is_503_with_retry_after_then_ok() -> None:
    loaded = threading.Event()
    make, _ = scripted(loaded=loaded)
    server = start_server(fake_config(), make, wait_ready=False)
    try:
        health = httpx.get(server.url + "/health")
        assert health.status_code == 503 and health.headers["retry-after"] == "1"
        assert health.json()["status"] == "loading"
        loading = httpx.post(server.base_url + "/chat/completions", json=CHAT)
        assert_error(loading, 503, code="model_loading")
        assert loading.headers["retry-after"] == "1"
        loaded.set()
        deadline = time.monotonic() + 10
        while httpx.get(server.url + "/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert httpx.get(server.url + "/health").json() == {"status": "ok"}
        assert httpx.post(server.base_url + "/chat/completions", json=CHAT).status_code == 200
    finally:
        server.stop()


# --- validate, then queue: bad input leaves nothing running ----------------------------------

# (path, raw JSON body, the param the 400 names, a text the message holds)
BAD_INPUTS = [
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "Hi"}], "n": 16, '
     '"top_k": 2147483648}', "top_k", "2147483647"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "Hi"}], '
     '"top_k": -2147483649}', "top_k", "-2147483648"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "Hi"}], '
     '"max_tokens": 9223372036854775808}', "max_tokens", "512"),
    ("/v1/completions", '{"prompt": "Hi", "max_tokens": 513}', "max_tokens", "512"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "Hi"}], '
     '"max_completion_tokens": 1000000000000}', "max_completion_tokens", "512"),
    ("/v1/completions", '{"prompt": "Hi", "seed": 18446744073709551616}', "seed", "18446744073709551615"),
    ("/v1/completions", '{"prompt": "Hi", "n": 1000000000000000000000}', "n", "16"),
    ("/v1/completions", '{"prompt": "Hi", "logprobs": 1000000000000000000000}', "logprobs", "20"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "Hi"}], "logprobs": true, '
     '"top_logprobs": 99999999999999999999}', "top_logprobs", "20"),
    ("/v1/completions", '{"prompt": "Hi", "temperature": 1e400}', "temperature", "finite"),
    ("/v1/completions", '{"prompt": "Hi", "top_p": 1e400}', "top_p", "1"),
    ("/v1/completions", '{"prompt": "Hi", "temperature": ' + "9" * 400 + '}', "temperature", "finite"),
    ("/v1/completions", '{"prompt": "Hi", "logit_bias": {"5": ' + "9" * 400 + '}}', "logit_bias", "100"),
    ("/v1/completions", '{"prompt": "Hi", "logit_bias": {"' + "9" * 5000 + '": 1}}', "logit_bias",
     "token ids"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a\\udc80b"}], "n": 16}',
     "messages[0].content", "lone surrogate"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", '
     '"text": "\\ud800"}]}]}', "messages[0].content[0].text", "lone surrogate"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "Hi", "name": "\\udfff"}]}',
     "messages[0].name", "lone surrogate"),
    ("/v1/completions", '{"prompt": "\\udc80", "n": 4}', "prompt", "lone surrogate"),
    ("/v1/completions", '{"prompt": ["ok", "\\udc80"]}', "prompt", "lone surrogate"),
    ("/v1/completions", '{"prompt": "Hi", "stop": "\\ud83d"}', "stop", "lone surrogate"),
    ("/v1/completions", '{"prompt": "Hi", "model": "\\ud83d"}', "model", "lone surrogate"),
    ("/tokenize", '{"content": "x\\udc80"}', "content", "lone surrogate"),
    ("/v1/completions", '{"prompt": "' + "Once upon a time " * 2000 + '"}', "prompt", "certainly"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "' + "Once upon " * 4000
     + '"}], "n": 16}', "messages", "context"),
    ("/v1/chat/completions", '{"messages": ' + "[" * 10_000 + "]" * 10_000 + '}', None, "nested"),
    ("/tokenize", '{"content": ' + "[" * 10_000 + "]" * 10_000 + '}', None, "nested"),
]


@pytest.mark.parametrize(("path", "body", "param", "text"), BAD_INPUTS,
                         ids=[f"{i}-{case[2]}" for i, case in enumerate(BAD_INPUTS)])
def test_bad_input_is_a_400_and_leaves_nothing_running(server: RunningServer, path: str,
                                                       body: str, param: str | None,
                                                       text: str) -> None:
    response = post(server, path, body.encode(), headers={**AUTH, "content-type": "application/json"})
    error = assert_error(response, 400, param=param, contains=(text,))
    assert error["param"] == param
    _assert_nothing_running(server)
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_huge_prompt_is_refused_before_tokenizing(server: RunningServer) -> None:
    """A 7.9 MB prompt: the bounded-cost check refuses it without tokenizing (which takes
    seconds for 7.9 MB), and says how it knows."""
    prompt = "Once upon a time there was a dragon. " * 210_000
    start = time.perf_counter()
    response = post(server, "/v1/completions", {"prompt": prompt})
    elapsed = time.perf_counter() - start
    error = assert_error(response, 400, param="prompt", code="context_length_exceeded",
                         contains=("512 tokens", "bytes"))
    assert "certainly" in error["message"]
    # Never tokenized: n_prompt_tokens is the least count its bytes can make, over the context.
    assert error["type"] == "exceed_context_size_error" and error["n_ctx"] == 512
    assert error["n_prompt_tokens"] > 512
    assert elapsed < 1.0, elapsed
    _assert_nothing_running(server)
