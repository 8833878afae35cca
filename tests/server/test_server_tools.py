"""Tool calls through `ember serve` with the official openai client: the whole loop (call ->
tool result -> answer) on a real uvicorn server whose scripted engine answers with recorded
model outputs, streamed tool_calls deltas equal to the non-streamed calls, the bad requests, and
SmolLM2 (a template without tools: the standard tool prompt) behind a real server."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_support import RunningServer, ScriptedEngine, fake_config, scripted, serving, start_server
from tools_support import TIME, WEATHER

from ember.chat.template import ChatTemplate
from ember.server.config import ServerConfig

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
OUTPUTS = {c["name"]: c["output"] for c in json.loads(
    (Path(__file__).parent.parent / "data" / "tool_calls" / "outputs.json").read_text())["cases"]}

QWEN_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
QWEN_TWO_CALLS = (QWEN_CALL + '\n<tool_call>\n{"name": "get_weather", "arguments": '
                  '{"city": "Lyon", "days": [1, 2]}}\n</tool_call>')
ANSWER = "It is 21 degrees and sunny in Paris."


def qwen_reply(prompt: str) -> str:
    """A Qwen2.5 model, recorded: it answers a tool result, calls for both cities when asked
    about two, and calls get_weather otherwise."""
    if "<tool_response>" in prompt:
        return ANSWER
    if "Lyon" in prompt:
        return QWEN_TWO_CALLS
    return "Let me check.\n" + QWEN_CALL if "check" in prompt else QWEN_CALL


def start_qwen(reply: Callable[[str], str]) -> tuple[RunningServer, ScriptedEngine]:
    """A server whose scripted engine has Qwen2.5's template and answers with `reply`."""
    make, engine = scripted()
    engine.n_ctx = 8192
    engine.chat_template = ChatTemplate((TEMPLATES / "qwen2.5.jinja").read_text())
    engine.reply = reply
    return start_server(fake_config(aliases=["m"]), make), engine


@pytest.fixture(scope="module")
def qwen() -> Iterator[tuple[RunningServer, ScriptedEngine]]:
    running, engine = start_qwen(qwen_reply)
    yield running, engine
    running.stop()


@pytest.fixture(scope="module")
def client(qwen: tuple[RunningServer, ScriptedEngine]) -> openai.OpenAI:
    return openai.OpenAI(base_url=qwen[0].base_url, api_key="unused", max_retries=0)


def ask(city: str = "Paris") -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"What is the weather in {city}?"}]


def test_the_whole_tool_loop(client: openai.OpenAI,
                             qwen: tuple[RunningServer, ScriptedEngine]) -> None:
    messages: list[Any] = ask()
    first = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
    [choice] = first.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and len(call.id) == 29
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert "<tools>\n" + json.dumps(WEATHER) in qwen[1].prompts[-1]

    messages.append(choice.message)
    messages.append({"role": "tool", "tool_call_id": call.id,
                     "content": json.dumps({"temperature_c": 21, "sky": "sunny"})})
    second = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == ANSWER
    assert not second.choices[0].message.tool_calls
    # The call and its result went back through the template.
    prompt = qwen[1].prompts[-1]
    assert ("<|im_start|>assistant\n" + QWEN_CALL + "<|im_end|>\n<|im_start|>user\n"
            '<tool_response>\n{"temperature_c": 21, "sky": "sunny"}\n</tool_response>'
            "<|im_end|>\n<|im_start|>assistant\n") in prompt


def reassemble(chunks: list[Any]) -> tuple[str, list[dict[str, Any]], str | None]:
    """content, calls and finish_reason of a streamed answer, put together as OpenAI's docs
    tell clients to: a call's first delta has its index, id and name; later ones add to its
    arguments."""
    content, calls, finish = "", [], None
    for chunk in chunks:
        [choice] = chunk.choices
        delta = choice.delta
        content += delta.content or ""
        for part in delta.tool_calls or []:
            if part.id is not None:
                assert part.index == len(calls) and part.type == "function"
                calls.append({"id": part.id, "name": part.function.name,
                              "arguments": part.function.arguments or ""})
            else:
                assert part.function.name is None
                calls[part.index]["arguments"] += part.function.arguments
        finish = choice.finish_reason or finish
    return content, calls, finish


@pytest.mark.parametrize("question, n_calls, content", [
    ("What is the weather in Paris?", 1, None),
    ("What is the weather in Paris and Lyon?", 2, None),
    ("Please check the weather in Paris.", 1, "Let me check."),
])
def test_streamed_calls_equal_the_non_streamed_ones(client: openai.OpenAI, question: str,
                                                    n_calls: int, content: str | None) -> None:
    messages: Any = [{"role": "user", "content": question}]
    whole = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
    chunks = list(client.chat.completions.create(model="m", messages=messages, tools=[WEATHER],
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed_content, calls, finish = reassemble(chunks)
    message = whole.choices[0].message
    assert finish == whole.choices[0].finish_reason == "tool_calls"
    assert streamed_content == (message.content or "") and message.content == content
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in message.tool_calls]
    assert len(calls) == n_calls and len({c["id"] for c in calls}) == n_calls
    # Arguments arrive in fragments (one per generated character here), never the markup.
    n_fragments = sum(1 for c in chunks for p in (c.choices[0].delta.tool_calls or [])
                      if p.id is None)
    assert n_fragments > 10
    assert all("<tool_call>" not in (c.choices[0].delta.content or "") for c in chunks)


def test_tool_choice_none_answers_without_tools(client: openai.OpenAI,
                                                qwen: tuple[RunningServer, ScriptedEngine]
                                                ) -> None:
    out = client.chat.completions.create(model="m", messages=ask(), tools=[WEATHER],
                                         tool_choice="none")
    assert "<tools>" not in qwen[1].prompts[-1]
    assert out.choices[0].message.content == QWEN_CALL  # not parsed: it is just text
    assert out.choices[0].finish_reason == "stop" and not out.choices[0].message.tool_calls


@pytest.mark.parametrize("body, param, code, text", [
    ({"tool_choice": "required", "json_schema": {"type": "object"}}, "tool_choice",
     "invalid_value", "'json_schema' does too"),
    ({"tool_choice": "required", "messages": [*ask(), {"role": "assistant", "content": "I"}]},
     "tool_choice", "invalid_value", "cannot continue"),
    ({"tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice",
     "invalid_value", "not among"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0]", "invalid_value",
     "letters"),
    ({"tools": {"get_weather": {}}}, "tools", "invalid_type", "array"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls", "invalid_type", "boolean"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"x": 1}]}]},
     "messages", "invalid_messages", "tool_calls[0]"),
])
def test_bad_tool_requests_are_400s(qwen: tuple[RunningServer, ScriptedEngine],
                                    body: dict[str, Any], param: str, code: str,
                                    text: str) -> None:
    request = {"messages": ask(), "tools": [WEATHER], **body}
    response = httpx.post(qwen[0].base_url + "/chat/completions", json=request, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code)
    assert text in error["message"]


def test_tools_on_completions_are_a_400(qwen: tuple[RunningServer, ScriptedEngine]) -> None:
    response = httpx.post(qwen[0].base_url + "/completions", timeout=30,
                          json={"prompt": "x", "tools": [WEATHER]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "tools"


def test_a_template_without_tools_uses_the_generic_format() -> None:
    make, engine = scripted()
    engine.n_ctx = 8192  # the scripted template renders contents only: no tools, no system role
    engine.reply = lambda prompt: (ANSWER if "tool_call_id" in prompt else
                                   OUTPUTS["generic parallel calls"])
    running = start_server(fake_config(aliases=["m"]), make)
    try:
        client = openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0)
        out = client.chat.completions.create(model="m", messages=ask(), tools=[WEATHER])
        assert "You can call these tools" in engine.prompts[-1]
        calls = out.choices[0].message.tool_calls
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Nice", "days": [1, 2]})]
        chunks = list(client.chat.completions.create(model="m", messages=ask(),
                                                     tools=[WEATHER], stream=True))
        _, streamed, finish = reassemble(chunks)
        assert finish == "tool_calls"
        assert [(c["name"], c["arguments"]) for c in streamed] == [
            (c.function.name, c.function.arguments) for c in calls]
        messages: Any = [*ask(), out.choices[0].message,
                         {"role": "tool", "tool_call_id": calls[0].id, "content": "21"},
                         {"role": "tool", "tool_call_id": calls[1].id, "content": "19"}]
        final = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
        assert final.choices[0].message.content == ANSWER
        assert '{"tool_response": {"name": "get_weather", "tool_call_id": "' + calls[1].id + \
            '", "content": "19"}}' in engine.prompts[-1]
    finally:
        running.stop()


# --- a real model --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_server(smollm2_path: Path) -> Iterator[RunningServer]:
    with serving(ServerConfig(model=str(smollm2_path), parallel=2, threads=1,
                              ctx_size=2048, aliases=["m"])) as running:
        yield running


def test_smollm2_tool_request_streams_as_it_answers(smollm2_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=smollm2_server.base_url, api_key="unused", max_retries=0)
    messages: Any = ask()
    kwargs: Any = {"model": "m", "messages": messages, "tools": [WEATHER], "temperature": 0,
                   "max_tokens": 48}
    whole = client.chat.completions.create(**kwargs)
    assert whole.usage.prompt_tokens > 150  # the standard tool prompt is in it
    assert_stream_matches(client, kwargs, whole)
    # A tool result goes back through the template too (as a tool_response user turn).
    messages += [{"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees, sunny"}]
    after = client.chat.completions.create(**{**kwargs, "messages": messages})
    assert after.usage.prompt_tokens > whole.usage.prompt_tokens + 20
    assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")


def assert_stream_matches(client: openai.OpenAI, kwargs: Any, whole: Any) -> None:
    """The streamed answer to `kwargs` reassembles to `whole` (the same request unstreamed)."""
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    content, calls, finish = reassemble(chunks)
    message = whole.choices[0].message
    assert finish == whole.choices[0].finish_reason
    assert content == (message.content or "")
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in message.tool_calls or []]


@pytest.fixture(scope="module")
def smollm2_qwen_server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
                        ) -> Iterator[RunningServer]:
    """SmolLM2 with Qwen2.5's template: a real model whose template renders tools itself."""
    from gguf_template import with_chat_template

    model = with_chat_template(smollm2_path, tmp_path_factory.mktemp("qwen") / "smol-qwen.gguf",
                               (TEMPLATES / "qwen2.5.jinja").read_text())
    with serving(ServerConfig(model=str(model), parallel=1, threads=1, ctx_size=2048,
                              aliases=["m"])) as running:
        yield running


def test_a_real_model_with_a_tool_template(smollm2_qwen_server: RunningServer) -> None:
    url = smollm2_qwen_server.url
    messages = [*ask(), {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees, sunny"}]
    prompt = httpx.post(url + "/tokenize", timeout=30, json={
        "messages": messages, "with_pieces": True}).json()
    # /tokenize renders without tools; the chat request renders them (Qwen's <tools> block).
    text = "".join(p["piece"] for p in prompt["tokens"])
    assert ("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
            "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>"
            "\n21 degrees, sunny\n</tool_response><|im_end|>") in text
    client = openai.OpenAI(base_url=smollm2_qwen_server.base_url, api_key="unused",
                           max_retries=0)
    kwargs: Any = {"model": "m", "messages": messages, "tools": [WEATHER], "temperature": 0,
                   "max_tokens": 32}
    whole = client.chat.completions.create(**kwargs)
    assert whole.usage.prompt_tokens > prompt["count"] + 60  # + the <tools> system block
    assert_stream_matches(client, kwargs, whole)


def test_every_choice_is_parsed(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model="m", messages=ask("Paris and Lyon"),
                                         tools=[WEATHER], n=2)
    assert [c.index for c in out.choices] == [0, 1]
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls"
        assert [json.loads(c.function.arguments)["city"] for c in choice.message.tool_calls] == [
            "Paris", "Lyon"]
    chunks = list(client.chat.completions.create(model="m", messages=ask("Paris and Lyon"),
                                                 tools=[WEATHER], n=2, stream=True))
    for index in (0, 1):
        mine = [c for c in chunks if c.choices and c.choices[0].index == index]
        _, calls, finish = reassemble(mine)
        assert finish == "tool_calls"
        assert [json.loads(c["arguments"])["city"] for c in calls] == ["Paris", "Lyon"]


def test_a_trailing_assistant_call_is_history_not_a_prefill(
        client: openai.OpenAI, qwen: tuple[RunningServer, ScriptedEngine]) -> None:
    # A trailing assistant message is continued (llama-server's prefill), unless it carries
    # tool calls: then it is rendered whole and a new turn opens.
    messages: Any = [*ask(), {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}]
    client.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
    assert qwen[1].prompts[-1].endswith(QWEN_CALL + "<|im_end|>\n<|im_start|>assistant\n")


# --- forced calls (constrained decoding) ---------------------------------------------------------

SCHEMAS = {"get_weather": WEATHER["function"]["parameters"],
           "get_time": TIME["function"]["parameters"]}


@pytest.mark.parametrize("server_name", ["smollm2_server", "smollm2_qwen_server"])
@pytest.mark.parametrize("choice", [
    "required", {"type": "function", "function": {"name": "get_time"}}])
def test_a_forced_call_is_a_valid_call_streamed_or_not(request: pytest.FixtureRequest,
                                                       server_name: str, choice: Any) -> None:
    """SmolLM2 on its own never calls a tool; forced, it must: generic JSON under ChatML, a
    <tool_call> block (opened in the prompt) under Qwen2.5's template."""
    import jsonschema

    server: RunningServer = request.getfixturevalue(server_name)
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    kwargs: Any = {"model": "m", "messages": ask(), "tools": [WEATHER, TIME],
                   "tool_choice": choice, "temperature": 0, "max_tokens": 64,
                   "parallel_tool_calls": False}
    whole = client.chat.completions.create(**kwargs)
    [out] = whole.choices
    assert out.finish_reason == "tool_calls", out
    [call] = out.message.tool_calls
    if isinstance(choice, dict):
        assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    content, calls, finish = reassemble(list(client.chat.completions.create(**kwargs,
                                                                            stream=True)))
    assert finish == "tool_calls" and content == (out.message.content or "")
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (call.function.name, call.function.arguments)]


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_a_forced_call_on_the_other_apis(smollm2_qwen_server: RunningServer, api: str) -> None:
    """The same forced call through Responses and Messages (answer_parts.py): constrained as
    chat's, read back as a function_call item / a tool_use block."""
    import anthropic
    import jsonschema

    if api == "responses":
        client = openai.OpenAI(base_url=smollm2_qwen_server.base_url, api_key="unused",
                               max_retries=0)
        out = client.responses.create(
            model="m", input="What is the weather in Paris?", temperature=0,
            max_output_tokens=64, tool_choice={"type": "function", "name": "get_time"},
            tools=[{"type": "function", **t["function"]} for t in (WEATHER, TIME)])  # type: ignore[misc]
        [item] = out.output
        assert item.type == "function_call" and item.name == "get_time"
        arguments = json.loads(item.arguments)
    else:
        claude = anthropic.Anthropic(base_url=smollm2_qwen_server.url, api_key="unused",
                                     max_retries=0)
        message = claude.messages.create(
            model="m", max_tokens=64, extra_body={"temperature": 0}, tool_choice={"type": "any"},
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in (WEATHER, TIME)])  # type: ignore[misc]
        assert message.stop_reason == "tool_use"
        [block] = message.content
        assert block.type == "tool_use"
        arguments = block.input
        item = block
    jsonschema.validate(arguments, SCHEMAS[item.name])
