"""OpenAI's Responses API with the official `openai` client and Anthropic's Messages API with the
official `anthropic` client, on stories260K: the same greedy answer as chat completions, the
streams' event sequences, stored responses, and 400s naming what ember lacks (hosted and server
tools; function tools are test_server_tools_apis.py's)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from server_support import RunningServer, serving

from ember.server.config import ServerConfig

KEY = "sk-test"
NO_EOS = {"2": -100}
SYSTEM = "You are a storyteller."
USER = "Tell me a story."


@pytest.fixture(scope="module")
def server(stories_path: Path) -> Iterator[RunningServer]:
    config = ServerConfig(model=str(stories_path), threads=1, ctx_size=256, api_key=KEY,
                          sampling={"temperature": 0.0}, aliases=["stories"])
    with serving(config) as running:
        yield running


@pytest.fixture(scope="module")
def oai(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def claude(server: RunningServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


def chat_text(oai: openai.OpenAI, messages: list[dict[str, str]], max_tokens: int,
              stop: list[str] | None = None) -> tuple[str, str]:
    out = oai.chat.completions.create(model="x", messages=messages,  # type: ignore[arg-type]
                                      max_tokens=max_tokens, stop=stop)
    return out.choices[0].message.content or "", out.choices[0].finish_reason


# --- Responses ---------------------------------------------------------------------------------

def test_responses_with_the_openai_client(oai: openai.OpenAI) -> None:
    expected, _ = chat_text(oai, [{"role": "system", "content": SYSTEM},
                                  {"role": "user", "content": USER}], 12)
    out = oai.responses.create(model="gpt-4.1", input=USER, instructions=SYSTEM,
                               max_output_tokens=12)
    assert out.id.startswith("resp_") and out.object == "response"
    assert out.model == "stories"
    assert out.output_text == expected
    assert out.status in ("completed", "incomplete")
    assert out.usage is not None and out.usage.output_tokens <= 12
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    items = oai.responses.create(model="x", max_output_tokens=12, input=[
        {"role": "system", "content": SYSTEM},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": USER}]}])
    assert items.output_text == expected


def test_responses_stream_event_sequence(oai: openai.OpenAI) -> None:
    whole = oai.responses.create(model="x", input=USER, max_output_tokens=10)
    events = list(oai.responses.create(model="x", input=USER, max_output_tokens=10,
                                       stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", f"response.{whole.status}"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    assert events[-1].response.output_text == whole.output_text  # type: ignore[union-attr]


def test_responses_store_and_previous_response_id(oai: openai.OpenAI) -> None:
    first = oai.responses.create(model="x", input=USER, max_output_tokens=8, store=True)
    follow = oai.responses.create(model="x", input="And then?", max_output_tokens=8,
                                  previous_response_id=first.id)
    expected, _ = chat_text(oai, [{"role": "user", "content": USER},
                                  {"role": "assistant", "content": first.output_text},
                                  {"role": "user", "content": "And then?"}], 8)
    assert follow.output_text == expected
    assert oai.responses.retrieve(first.id).output_text == first.output_text
    unstored = oai.responses.create(model="x", input=USER, max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as raised:
        oai.responses.create(model="x", input="?", previous_response_id=unstored.id)
    assert "store" in raised.value.message
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(unstored.id)


def test_responses_structured_output_and_tools_refused(oai: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    out = oai.responses.create(model="x", input="Is it ok?", max_output_tokens=40, text={
        "format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}})
    assert set(json.loads(out.output_text)) == {"ok"}  # constrained decoding, as chat's
    with pytest.raises(openai.BadRequestError) as raised:
        oai.responses.create(model="x", input=USER, text={"format": {"type": "yaml"}})
    assert "text.format" in raised.value.message
    with pytest.raises(openai.BadRequestError) as raised:  # function tools work (tools tests)
        oai.responses.create(model="x", input=USER, tools=[{"type": "web_search"}])
    assert "hosted tools" in raised.value.message


# --- Anthropic Messages ------------------------------------------------------------------------

def test_messages_with_the_anthropic_client(claude: anthropic.Anthropic,
                                            oai: openai.OpenAI) -> None:
    expected, _ = chat_text(oai, [{"role": "system", "content": SYSTEM},
                                  {"role": "user", "content": USER}], 12)
    out = claude.messages.create(model="claude-sonnet-4-5", max_tokens=12, system=SYSTEM,
                                 messages=[{"role": "user", "content": USER}])
    assert out.id.startswith("msg_") and out.type == "message" and out.role == "assistant"
    assert out.model == "stories"
    [block] = out.content
    assert block.type == "text" and block.text == expected
    assert out.stop_reason in ("end_turn", "max_tokens")
    assert out.usage.output_tokens <= 12
    # Text blocks, and a trailing assistant message continued (prefill).
    blocks = claude.messages.create(model="x", max_tokens=12, system=[
        {"type": "text", "text": SYSTEM}], messages=[
        {"role": "user", "content": [{"type": "text", "text": USER}]}])
    assert blocks.content[0].text == expected  # type: ignore[union-attr]
    prefilled = claude.messages.create(model="x", max_tokens=6, messages=[
        {"role": "user", "content": USER}, {"role": "assistant", "content": "Once upon"}])
    by_chat, _ = chat_text(oai, [{"role": "user", "content": USER},
                                 {"role": "assistant", "content": "Once upon"}], 6)
    # Anthropic's reply is the continuation; OpenAI chat's (as llama-server) includes the prefill.
    assert "Once upon" + prefilled.content[0].text == by_chat  # type: ignore[union-attr]


def test_messages_stop_sequences_and_stream(claude: anthropic.Anthropic) -> None:
    whole = claude.messages.create(model="x", max_tokens=20,
                                   messages=[{"role": "user", "content": USER}])
    text = whole.content[0].text  # type: ignore[union-attr]
    word = text.split()[2]
    stopped = claude.messages.create(model="x", max_tokens=20, stop_sequences=[word],
                                     messages=[{"role": "user", "content": USER}])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert stopped.content[0].text == text[:text.index(word)]  # type: ignore[union-attr]
    with claude.messages.stream(model="x", max_tokens=20,
                                messages=[{"role": "user", "content": USER}]) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    events = list(claude.messages.create(model="x", max_tokens=5, stream=True,
                                         messages=[{"role": "user", "content": USER}]))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_messages_errors_auth_and_count_tokens(server: RunningServer,
                                               claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as raised:
        claude.messages.create(model="x", max_tokens=5, messages=[{"role": "user", "content": USER}],
                               tools=[{"type": "bash_20250124", "name": "bash"}])
    assert "server tools" in raised.value.message
    body = raised.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    no_max = httpx.post(server.url + "/v1/messages", headers={"x-api-key": KEY},
                        json={"model": "x", "messages": [{"role": "user", "content": "hi"}]})
    assert no_max.status_code == 400
    assert no_max.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in no_max.json()["error"]["message"]
    wrong_key = anthropic.Anthropic(base_url=server.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong_key.messages.create(model="x", max_tokens=5,
                                  messages=[{"role": "user", "content": USER}])
    count = claude.messages.count_tokens(model="x", messages=[{"role": "user", "content": USER}])
    tokens = httpx.post(server.url + "/tokenize", headers={"x-api-key": KEY}, json={
        "messages": [{"role": "user", "content": USER}]}).json()["tokens"]
    assert count.input_tokens == len(tokens)
