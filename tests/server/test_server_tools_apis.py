"""Function tools on OpenAI's Responses API (the official `openai` client) and Anthropic's
Messages API (the official `anthropic` client), on a real uvicorn server whose scripted engine
answers with a recorded Qwen2.5 output (test_server_tools.qwen_reply): the whole loop (call ->
result -> answer) through the model's template, streams that add up to the whole answer (as
each SDK's own stream helper puts it together), tool_choice, and the bad requests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from server_support import RunningServer, ScriptedEngine
from test_server_tools import ANSWER, QWEN_CALL, WEATHER, qwen_reply, start_qwen

FORCED_BODY = '{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
# Responses' flat function tool; Anthropic's tool, with its input_schema.
RESP_WEATHER = {"type": "function", **WEATHER["function"]}
CLAUDE_WEATHER = {"name": "get_weather", "description": WEATHER["function"]["description"],
                  "input_schema": WEATHER["function"]["parameters"]}
TIME = {"name": "get_time", "description": "The time",
        "input_schema": {"type": "object", "properties": {}}}


def reply(prompt: str) -> str:
    """qwen_reply, and a forced call's body when the prompt opens the call (<tool_call>)."""
    return FORCED_BODY if prompt.endswith("<tool_call>\n") else qwen_reply(prompt)


@pytest.fixture(scope="module")
def qwen() -> Iterator[tuple[RunningServer, ScriptedEngine]]:
    pair = start_qwen(reply)
    try:
        yield pair
    finally:
        pair[0].stop()


@pytest.fixture(scope="module")
def server(qwen: tuple[RunningServer, ScriptedEngine]) -> RunningServer:
    return qwen[0]  # conftest's `client` is its OpenAI client


@pytest.fixture(scope="module")
def claude(qwen: tuple[RunningServer, ScriptedEngine]) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=qwen[0].url, api_key="unused", max_retries=0)


# The call and its result, as the template renders them back (the same text chat's loop gives).
RENDERED_LOOP = ("<|im_start|>assistant\n" + QWEN_CALL + "<|im_end|>\n<|im_start|>user\n"
                 '<tool_response>\n{"temperature_c": 21, "sky": "sunny"}\n</tool_response>'
                 "<|im_end|>\n<|im_start|>assistant\n")
RESULT = json.dumps({"temperature_c": 21, "sky": "sunny"})


# --- Responses ---------------------------------------------------------------------------------

def test_responses_the_whole_tool_loop(client: openai.OpenAI,
                                       qwen: tuple[RunningServer, ScriptedEngine]) -> None:
    question = "What is the weather in Paris?"
    first = client.responses.create(model="m", input=question, tools=[RESP_WEATHER])  # type: ignore[list-item]
    assert "<tools>\n" + json.dumps(WEATHER) in qwen[1].prompts[-1]  # chat's shape, in order
    assert first.status == "completed"
    [call] = first.output
    assert call.type == "function_call" and call.status == "completed"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert first.output_text == ""
    assert [t.name for t in first.tools] == ["get_weather"]  # type: ignore[union-attr]
    assert first.tool_choice == "auto"

    # As the Agents SDK does: the output items go back, then the call's output.
    items: list[Any] = [{"role": "user", "content": question}, *first.output,
                        {"type": "function_call_output", "call_id": call.call_id,
                         "output": RESULT}]
    second = client.responses.create(model="m", input=items, tools=[RESP_WEATHER])  # type: ignore[list-item]
    assert second.output_text == ANSWER
    assert [item.type for item in second.output] == ["message"]
    assert RENDERED_LOOP in qwen[1].prompts[-1]


def test_responses_stream_adds_up_to_the_whole_response(client: openai.OpenAI) -> None:
    kwargs: Any = {"model": "m", "input": "Please check the weather in Paris.",
                   "tools": [RESP_WEATHER]}
    whole = client.responses.create(**kwargs)
    assert [item.type for item in whole.output] == ["message", "function_call"]
    assert whole.output_text == "Let me check."
    events = list(client.responses.create(**kwargs, stream=True))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    n_text = kinds.count("response.output_text.delta")
    n_args = kinds.count("response.function_call_arguments.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert text == "Let me check." and n_text > 5 and n_args > 10  # as it was generated
    # The message, closed before the call opens; the call, then the response.
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * n_text,
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", *["response.function_call_arguments.delta"] * n_args,
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [(e.output_index, e.item.type) for e in added] == [(0, "message"),
                                                              (1, "function_call")]
    fc = added[1].item
    assert fc.arguments == "" and fc.status == "in_progress"  # type: ignore[union-attr]
    arguments = "".join(e.delta for e in events  # type: ignore[union-attr]
                        if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert arguments == done.arguments == whole.output[1].arguments  # type: ignore[union-attr]
    assert done.item_id == fc.id and done.output_index == 1  # type: ignore[union-attr]

    # The SDK's stream helper checks every index and id as it puts the response together.
    with client.responses.stream(**kwargs) as stream:
        final = stream.get_final_response()
    def strip(items: list[Any]) -> list[tuple[Any, ...]]:
        return [(i.type, i.status, i.content[0].text) if i.type == "message" else
                (i.type, i.status, i.name, i.arguments) for i in items]
    assert strip(final.output) == strip(whole.output)


def test_responses_store_continues_a_call(client: openai.OpenAI,
                                          qwen: tuple[RunningServer, ScriptedEngine]) -> None:
    first = client.responses.create(model="m", input="What is the weather in Paris?",
                                 tools=[RESP_WEATHER], store=True)  # type: ignore[list-item]
    [call] = first.output
    second = client.responses.create(
        model="m", previous_response_id=first.id, tools=[RESP_WEATHER],  # type: ignore[list-item]
        input=[{"type": "function_call_output", "call_id": call.call_id,  # type: ignore[union-attr]
                "output": [{"type": "input_text", "text": RESULT}]}])
    assert second.output_text == ANSWER
    assert RENDERED_LOOP in qwen[1].prompts[-1]


def test_responses_tool_choice(client: openai.OpenAI,
                               qwen: tuple[RunningServer, ScriptedEngine]) -> None:
    none = client.responses.create(model="m", input="What is the weather in Paris?",
                                tools=[RESP_WEATHER], tool_choice="none")  # type: ignore[list-item]
    assert "<tools>" not in qwen[1].prompts[-1]
    assert none.output_text == QWEN_CALL and none.tool_choice == "none"  # just text
    # A forced call opens the call in the prompt; the answer is read from there.
    forced = client.responses.create(model="m", input="Hello", tools=[RESP_WEATHER],  # type: ignore[list-item]
                                  tool_choice={"type": "function", "name": "get_weather"},
                                  parallel_tool_calls=False)
    assert qwen[1].prompts[-1].endswith("<|im_start|>assistant\n<tool_call>\n")
    [call] = forced.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Rome"}
    assert forced.parallel_tool_calls is False


@pytest.mark.parametrize("body, param, text", [
    ({"tools": [{"type": "web_search"}]}, "tools[0]", "hosted tools"),
    ({"tools": [{"type": "function", "name": "a b"}]}, "tools[0]", "1-64 letters"),
    ({"tool_choice": {"type": "function", "name": "other"}}, "tool_choice", "not among"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice", "must be"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments",
     "must be a string"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]},
     "input[0].output", "string or an array"),
    ({"input": [{"type": "web_search_call", "id": "ws"}]}, "input[0]", "not supported"),
])
def test_responses_bad_tool_requests_are_400s(qwen: tuple[RunningServer, ScriptedEngine],
                                              body: dict[str, Any], param: str,
                                              text: str) -> None:
    request = {"model": "m", "input": "What is the weather?", "tools": [RESP_WEATHER], **body}
    response = httpx.post(qwen[0].base_url + "/responses", json=request, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and text in error["message"], error


# --- Anthropic Messages ------------------------------------------------------------------------

def test_messages_the_whole_tool_loop(claude: anthropic.Anthropic,
                                      qwen: tuple[RunningServer, ScriptedEngine]) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = claude.messages.create(model="m", max_tokens=200, messages=messages,
                                   tools=[CLAUDE_WEATHER])  # type: ignore[list-item]
    assert "<tools>\n" + json.dumps(WEATHER) in qwen[1].prompts[-1]
    assert first.stop_reason == "tool_use"
    [block] = first.content
    assert block.type == "tool_use" and block.id.startswith("toolu_")
    assert block.name == "get_weather" and block.input == {"city": "Paris"}

    messages += [{"role": "assistant", "content": first.content},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id,
                                               "content": RESULT}]}]
    second = claude.messages.create(model="m", max_tokens=200, messages=messages,
                                    tools=[CLAUDE_WEATHER])  # type: ignore[list-item]
    assert second.stop_reason == "end_turn"
    assert [(b.type, b.text) for b in second.content] == [  # type: ignore[union-attr]
        ("text", ANSWER)]
    assert RENDERED_LOOP in qwen[1].prompts[-1]
    # A tool_result's content may be text blocks, and text may follow it in the same turn.
    messages[-1]["content"] = [{"type": "tool_result", "tool_use_id": block.id,
                                "content": [{"type": "text", "text": RESULT}]},
                               {"type": "text", "text": "Thanks."}]
    claude.messages.create(model="m", max_tokens=200, messages=messages, tools=[CLAUDE_WEATHER])  # type: ignore[list-item]
    assert (RENDERED_LOOP.removesuffix("<|im_start|>assistant\n")
            + "<|im_start|>user\nThanks.<|im_end|>\n") in qwen[1].prompts[-1]


def test_messages_stream_adds_up_to_the_whole_message(claude: anthropic.Anthropic) -> None:
    kwargs: Any = {"model": "m", "max_tokens": 200, "tools": [CLAUDE_WEATHER],
                   "messages": [{"role": "user", "content": "Please check the weather in Paris."}]}
    whole = claude.messages.create(**kwargs)
    assert [b.type for b in whole.content] == ["text", "tool_use"]
    assert whole.content[0].text == "Let me check."  # type: ignore[union-attr]
    events = list(claude.messages.create(**kwargs, stream=True))
    kinds = [e.type for e in events]
    starts = [e for e in events if e.type == "content_block_start"]
    assert [(e.index, e.content_block.type) for e in starts] == [(0, "text"), (1, "tool_use")]
    assert kinds[:3] == ["message_start", "content_block_start", "content_block_delta"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert kinds.count("content_block_stop") == 2
    partial = "".join(e.delta.partial_json for e in events  # type: ignore[union-attr]
                      if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
    assert json.loads(partial) == whole.content[1].input  # type: ignore[union-attr]
    message_delta = next(e for e in events if e.type == "message_delta")
    assert message_delta.delta.stop_reason == "tool_use"  # type: ignore[union-attr]
    # The SDK's stream helper, which parses the input as its JSON arrives.
    with claude.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    def strip(blocks: list[Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in b.model_dump().items() if k != "id"} for b in blocks]
    assert strip(final.content) == strip(whole.content)
    assert final.stop_reason == "tool_use"


def test_messages_stream_pings_after_the_first_block(
        qwen: tuple[RunningServer, ScriptedEngine]) -> None:
    # The SDK drops pings; Anthropic sends one after the first content_block_start.
    body = {"model": "m", "max_tokens": 200, "stream": True, "tools": [CLAUDE_WEATHER],
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}
    with httpx.stream("POST", qwen[0].url + "/v1/messages", json=body, timeout=30) as r:
        names = [line.removeprefix("event: ") for line in r.iter_lines()
                 if line.startswith("event: ")]
    assert names[:4] == ["message_start", "content_block_start", "ping", "content_block_delta"]
    assert names.count("ping") == 1 and names[-1] == "message_stop"


def test_messages_tool_choice_and_count_tokens(claude: anthropic.Anthropic,
                                               qwen: tuple[RunningServer, ScriptedEngine]) -> None:
    ask: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    none = claude.messages.create(model="m", max_tokens=200, messages=ask,
                                  tools=[CLAUDE_WEATHER], tool_choice={"type": "none"})  # type: ignore[list-item]
    assert "<tools>" not in qwen[1].prompts[-1]
    assert none.stop_reason == "end_turn" and none.content[0].text == QWEN_CALL  # type: ignore[union-attr]
    for choice in ({"type": "tool", "name": "get_weather"}, {"type": "any"}):
        forced = claude.messages.create(model="m", max_tokens=200, messages=[
            {"role": "user", "content": "Hello"}], tools=[CLAUDE_WEATHER, TIME],  # type: ignore[list-item]
            tool_choice={**choice, "disable_parallel_tool_use": True})  # type: ignore[typeddict-item]
        assert qwen[1].prompts[-1].endswith("<|im_start|>assistant\n<tool_call>\n")
        [block] = forced.content
        assert block.type == "tool_use" and block.input == {"city": "Rome"}
        assert forced.stop_reason == "tool_use"
    n_submitted = len(qwen[1].prompts)
    plain = claude.messages.count_tokens(model="m", messages=ask)
    with_tools = claude.messages.count_tokens(model="m", messages=ask, tools=[CLAUDE_WEATHER])  # type: ignore[list-item]
    # One token per character here: the <tools> block adds at least the tool's JSON.
    assert with_tools.input_tokens > plain.input_tokens + len(json.dumps(WEATHER))
    assert len(qwen[1].prompts) == n_submitted  # counted, not generated


@pytest.mark.parametrize("body, text", [
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
    ({"tools": [{"name": "get_weather"}]}, "'tools[0].input_schema' must be a JSON schema"),
    ({"tools": [{"name": "a b", "input_schema": {}}]}, "1-64 letters"),
    ({"tool_choice": {"type": "tool", "name": "other"}}, "not among"),
    ({"tool_choice": "auto"}, "'tool_choice' must be"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": "Paris"}]}]},
     "'messages[1].content[0].input' must be an object"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
     "'messages[0].content[0].tool_use_id' must be a string"),
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "tool_use", "id": "t", "name": "f",
                                         "input": {}}]}]},
     "'messages[0].content[1]': only text blocks"),
])
def test_messages_bad_tool_requests_are_400s(qwen: tuple[RunningServer, ScriptedEngine],
                                             body: dict[str, Any], text: str) -> None:
    request = {"model": "m", "max_tokens": 10, "tools": [CLAUDE_WEATHER],
               "messages": [{"role": "user", "content": "What is the weather?"}], **body}
    response = httpx.post(qwen[0].url + "/v1/messages", json=request, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert text in error["error"]["message"], error
