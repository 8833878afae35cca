"""Tools through the Python API (ember.LLM): create_chat_completion with tools, streamed and
not, on SmolLM2 (whose template has no tools: the standard tool prompt), and control tokens
kept in the decoded text for formats whose markers are control tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from tools_support import TIME, WEATHER

from ember import LLM
from ember.tools.prompt import vocabulary_lookup
from ember.tools.request import ToolsError

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> LLM:
    return LLM(smollm2_path, n_threads=1, n_ctx=1024, parallel=2)


def test_tools_reach_the_prompt(smollm2: LLM) -> None:
    plain = smollm2.detokenize(smollm2.tokenize_chat(ASK), skip_special=False)
    with_tools = smollm2.detokenize(smollm2.tokenize_chat(ASK, tools=[WEATHER]),
                                    skip_special=False)
    assert "get_weather" not in plain
    assert with_tools.startswith("<|im_start|>system\nYou can call these tools")
    assert '"name": "get_weather"' in with_tools and with_tools.endswith(
        "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n")


def test_create_chat_completion_with_tools_streams_what_it_answers(smollm2: LLM) -> None:
    kwargs: Any = {"tools": [WEATHER], "temperature": 0, "max_tokens": 40}
    whole = smollm2.create_chat_completion(ASK, **kwargs)
    assert isinstance(whole, dict)
    [choice] = whole["choices"]
    chunks = list(smollm2.create_chat_completion(ASK, stream=True, **kwargs))
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    calls = [p for c in chunks for p in c["choices"][0]["delta"].get("tool_calls", [])]
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    assert content == (choice["message"]["content"] or "")
    assert len([p for p in calls if "id" in p]) == len(choice["message"].get("tool_calls", []))
    # The same prompt without tools answers differently: the tools were in the prompt.
    plain = smollm2.create_chat_completion(ASK, temperature=0, max_tokens=40)
    assert whole["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 100


def test_a_forced_call_is_a_valid_call(smollm2: LLM) -> None:
    # One call each (parallel_tool_calls=False): allowed more, SmolLM2 keeps adding calls.
    out = smollm2.create_chat_completion(ASK, tools=[WEATHER, TIME], tool_choice="required",
                                         temperature=0, max_tokens=60, parallel_tool_calls=False)
    assert isinstance(out, dict)
    [choice] = out["choices"]
    assert choice["finish_reason"] == "tool_calls", choice
    [call] = choice["message"]["tool_calls"]
    tool = {"get_weather": WEATHER, "get_time": TIME}[call["function"]["name"]]
    jsonschema.validate(json.loads(call["function"]["arguments"]),
                        tool["function"]["parameters"])
    named = smollm2.create_chat_completion(ASK, tools=[WEATHER, TIME], temperature=0.8, seed=3,
                                           max_tokens=60, parallel_tool_calls=False, tool_choice={
                                               "type": "function",
                                               "function": {"name": "get_time"}})
    assert isinstance(named, dict)
    [call] = named["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_time"
    jsonschema.validate(json.loads(call["function"]["arguments"]),
                        TIME["function"]["parameters"])
    with pytest.raises(ValueError, match="give one of them"):
        smollm2.create_chat_completion(ASK, tools=[WEATHER], tool_choice="required",
                                       json_schema={"type": "object"})
    with pytest.raises(ToolsError, match="not among"):
        smollm2.create_chat_completion(ASK, tools=[WEATHER], tool_choice={
            "type": "function", "function": {"name": "nope"}})


def test_kept_control_tokens_stay_in_the_text(stories_path: Path) -> None:
    llm = LLM(stories_path, n_threads=1, parallel=1)
    try:
        bos = 1  # stories260K's <s>: a control token, so decoding hides it
        assert llm.tokenizer.token_to_piece(bos) == b"<s>"
        forced: Any = {"max_tokens": 3, "temperature": 0, "logit_bias": {bos: 100}}
        hidden = llm.generate("Once upon a time", **forced)
        assert hidden.tokens == [bos] * 3 and hidden.text == ""
        kept = list(llm.stream_deltas("Once upon a time", keep_tokens=[bos], **forced))
        assert "".join(d.text for d in kept) == "<s><s><s>"
        assert kept[-1].result is not None and kept[-1].result.text == "<s><s><s>"
        # How a format's markers are found in a vocabulary: one token with exactly that text.
        lookup = vocabulary_lookup(llm.tokenizer)
        assert lookup("<s>") == bos and lookup("[TOOL_CALLS]") is None
        # A token decoding shows anyway is not doubled.
        once = llm.tokenize("Once", add_special=False)[0]
        forced["logit_bias"] = {once: 100}
        plain = llm.generate("Once upon a time", **forced)
        shown = list(llm.stream_deltas("Once upon a time", keep_tokens=[once], **forced))
        assert plain.tokens == [once] * 3 and plain.text.count("Once") == 3
        assert "".join(d.text for d in shown) == plain.text
    finally:
        llm.close()
