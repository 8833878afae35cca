"""gpt-oss's harmony output (ember.tools.harmony) on pinned answers written as the harmony spec
and llama.cpp's gpt-oss tests give them: the analysis channel as reasoning, final as content,
commentary to=functions.NAME as a tool call, and every prefix of an answer parsed as it streams."""

from __future__ import annotations

import json

from ember.tools.harmony import parse

# The prompt ends with "<|start|>assistant", so the answer starts at the channel.
THINK_THEN_ANSWER = ("<|channel|>analysis<|message|>User asks 2+2. Simple: 4.<|end|>"
                     "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>")
TOOL_CALL = ("<|channel|>analysis<|message|>Need the weather; call the tool.<|end|>"
             "<|start|>assistant<|channel|>commentary to=functions.get_weather "
             "<|constrain|>json<|message|>{\"location\": \"Paris\", \"unit\": \"c\"}<|call|>")
# A preamble to the user on commentary, then two calls (the recipient may also come before
# the channel, as the spec allows).
PREAMBLE_TWO_CALLS = ("<|channel|>commentary<|message|>Checking both cities.<|end|>"
                      "<|start|>assistant<|channel|>commentary to=functions.get_weather"
                      "<|constrain|>json<|message|>{\"location\": \"Paris\"}<|call|>"
                      "<|start|>assistant to=functions.get_time<|channel|>commentary json"
                      "<|message|>{\"city\": \"Oslo\"}<|call|>")


def test_analysis_is_reasoning_final_is_content() -> None:
    out = parse(THINK_THEN_ANSWER)
    assert out.reasoning == "User asks 2+2. Simple: 4."
    assert out.content == "2 + 2 = 4."
    assert out.calls == []


def test_commentary_to_a_function_is_a_tool_call() -> None:
    out = parse(TOOL_CALL)
    assert out.reasoning == "Need the weather; call the tool."
    assert out.content == ""
    assert [(c.name, json.loads(c.arguments), c.complete) for c in out.calls] == [
        ("get_weather", {"location": "Paris", "unit": "c"}, True)]


def test_preamble_is_content_and_calls_keep_their_order() -> None:
    out = parse(PREAMBLE_TWO_CALLS)
    assert out.content == "Checking both cities."
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == [
        ("get_weather", {"location": "Paris"}), ("get_time", {"city": "Oslo"})]


def test_text_without_harmony_is_content() -> None:
    assert parse("Just an answer.").content == "Just an answer."


def test_every_prefix_parses_to_a_prefix_of_the_whole() -> None:
    for text in (THINK_THEN_ANSWER, TOOL_CALL, PREAMBLE_TWO_CALLS):
        whole = parse(text)
        for n in range(len(text) + 1):
            part = parse(text[:n], final=False)
            assert whole.reasoning.startswith(part.reasoning.strip()), (text[:n], part)
            assert whole.content.startswith(part.content), (text[:n], part)
            assert len(part.calls) <= len(whole.calls)
            for got, want in zip(part.calls, whole.calls):
                assert got.name == want.name or want.name.startswith(got.name)
                assert want.arguments.startswith(got.arguments)
                if got.complete:
                    assert got.arguments == want.arguments
    # A call still being written is marked incomplete.
    cut = TOOL_CALL[:TOOL_CALL.index("Paris")]
    assert [(c.name, c.complete) for c in parse(cut, final=False).calls] == [("get_weather", False)]
