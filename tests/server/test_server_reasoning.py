"""A reasoning model served: a tiny random Qwen3 checkpoint converted by ember convert, with
Qwen3's real chat template (tests/data/chat_templates/qwen3.jinja), through a real server.

A random model never writes <think> on its own, so the tests force its output: the template's
own think block (enable_thinking false), a continued assistant message that opens the thinking,
and the thinking budget's grammar, which forces </think> after N tokens. Also vLLM's fields
(guided_*, structured_outputs, min_tokens, stop_token_ids, chat_template_kwargs)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import transformers
from checkpoints import DATA, N_VOCAB, save_checkpoint
from server_support import RunningServer, assert_400_naming, ok, post, serving
from tiny_models import spread_weights

from ember.convert import convert
from ember.server.config import ServerConfig
from ember.server.reasoning import ReasoningSplitter

QWEN3_TEMPLATE = (DATA / "chat_templates" / "qwen3.jinja").read_text()
EOS = 2  # stories260K's </s>
USER = [{"role": "user", "content": "Why is the sky blue?"}]
THINKING = [*USER, {"role": "assistant", "content": "<think>\nLet me see"}]


@pytest.fixture(scope="module")
def qwen3_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=N_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
        rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=EOS)
    model = transformers.Qwen3ForCausalLM(config).eval()
    spread_weights(model)
    folder = save_checkpoint(model, tmp_path_factory.mktemp("qwen3"))
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config["chat_template"] = QWEN3_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return convert(folder, folder / "qwen3.gguf", "f32", progress=False).path


@pytest.fixture(scope="module")
def server(qwen3_path: Path) -> Iterator[RunningServer]:
    with serving(ServerConfig(model=str(qwen3_path), threads=1, ctx_size=512)) as running:
        yield running


def chat(server: RunningServer, **body) -> dict:
    return ok(server, "/v1/chat/completions",
              {"messages": USER, "temperature": 0, "max_tokens": 12, **body})


def message(server: RunningServer, **body) -> dict:
    return chat(server, **body)["choices"][0]["message"]


def stream(server: RunningServer, **body) -> tuple[str, str]:
    """(reasoning, content) as a stream's deltas spell them."""
    reasoning, content = [], []
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=120, json={
            "messages": USER, "temperature": 0, "max_tokens": 12, "stream": True, **body}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                delta = choice["delta"]
                reasoning.append(delta.get("reasoning_content") or "")
                content.append(delta.get("content") or "")
    return "".join(reasoning), "".join(content)


def tokenize(server: RunningServer, text: str) -> list[int]:
    return ok(server, "/tokenize", {"content": text, "add_special": False})["tokens"]


# --- the splitter -------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "opened", "parts"), [
    ("<think>\nhmm </thi nk> ok</think>\n\nThe answer", False, ("hmm </thi nk> ok", "The answer")),
    ("No thinking <think>here</think>", False, ("", "No thinking <think>here</think>")),
    ("still thinking</think>\n\nDone", True, ("still thinking", "Done")),
    ("<think>\nnever closed  ", False, ("never closed  ", "")),
    ("<thi", False, ("", "<thi")),
])
def test_splitter_gives_the_same_parts_however_the_text_arrives(text, opened, parts) -> None:
    assert ReasoningSplitter(opened).push(text, final=True) == parts
    for size in (1, 2, 3, 5):
        splitter, got = ReasoningSplitter(opened), ["", ""]
        for i in range(0, len(text), size):
            for k, piece in enumerate(splitter.push(text[i:i + size])):
                got[k] += piece
        for k, piece in enumerate(splitter.push("", final=True)):
            got[k] += piece
        assert tuple(got) == parts, size


# --- reasoning ------------------------------------------------------------------------------------


def test_enable_thinking_false_reaches_qwen3s_template(server: RunningServer) -> None:
    on = ok(server, "/apply-template", {"messages": USER})["prompt"]
    off = ok(server, "/apply-template", {"messages": USER,
                                         "chat_template_kwargs": {"enable_thinking": False}})
    assert on.endswith("<|im_start|>assistant\n")
    assert off["prompt"] == on + "<think>\n\n</think>\n\n"


def test_thinking_budget_forces_the_end_of_thinking(server: RunningServer) -> None:
    thoughts = []
    for budget in (3, 6):
        out = chat(server, messages=THINKING, reasoning_budget_tokens=budget, max_tokens=20,
                   logprobs=True)
        answer = out["choices"][0]["message"]
        # The tokens written before </think> (which the grammar forces) are the thinking's.
        pieces = [entry["token"] for entry in out["choices"][0]["logprobs"]["content"]]
        end, n_thinking, offset = "".join(pieces).find("</think>"), 0, 0
        for piece in pieces:
            n_thinking += offset < end
            offset += len(piece)
        assert end > 0 and n_thinking == budget
        # The continued message's opening is the reply's too (as llama-server repeats it).
        assert answer["reasoning_content"] == "Let me see" + "".join(pieces)[:end].rstrip()
        assert "think>" not in answer["content"]
        thoughts.append(answer["reasoning_content"])
    assert thoughts[1].startswith(thoughts[0]) and len(thoughts[1]) > len(thoughts[0])


def test_structured_output_applies_after_the_thinking(server: RunningServer) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    for body in ({"response_format": {"type": "json_schema",
                                      "json_schema": {"name": "n", "schema": schema}}},
                 {"guided_json": schema}, {"structured_outputs": {"json": schema}}):
        answer = message(server, messages=THINKING, reasoning_budget_tokens=4, max_tokens=60,
                         **body)
        assert answer["reasoning_content"]
        assert set(json.loads(answer["content"])) == {"n"}


def test_reasoning_is_streamed_as_its_own_deltas(server: RunningServer) -> None:
    body = {"messages": THINKING, "reasoning_budget_tokens": 5, "guided_choice": ["yes", "no"],
            "max_tokens": 30}
    whole = message(server, **body)
    assert whole["content"] in ("yes", "no") and whole["reasoning_content"]
    assert stream(server, **body) == (whole["reasoning_content"], whole["content"])


def test_reasoning_format_none_leaves_the_thinking_in_the_content(server: RunningServer) -> None:
    body = {"messages": THINKING, "reasoning_budget_tokens": 4, "guided_choice": ["yes"],
            "max_tokens": 30}
    parsed = message(server, **body)
    raw = message(server, **body, reasoning_format="none")
    assert "reasoning_content" not in raw or raw["reasoning_content"] is None
    assert parsed["content"] == "yes"
    assert re.fullmatch("<think>\n" + re.escape(parsed["reasoning_content"]) + r"\s*</think>\n{0,2}yes",
                        raw["content"]), raw["content"]
    legacy = message(server, **body, reasoning_format="deepseek-legacy")
    assert legacy["content"] == raw["content"]
    assert legacy["reasoning_content"] == parsed["reasoning_content"]


def test_the_model_may_open_its_thinking_itself(server: RunningServer) -> None:
    # Qwen3's prompt leaves the think block to the model: the grammar lets it think (within
    # the budget) or answer at once, and the answer is one of the choices either way.
    body = {"guided_choice": ["yes", "no"], "reasoning_budget_tokens": 3, "max_tokens": 30}
    opened = []
    for seed in range(6):
        raw = message(server, **body, temperature=1.0, seed=seed, reasoning_format="none")
        opened.append(raw["content"].startswith("<think>"))
        assert re.fullmatch(r"(<think>(?:(?!</think>).)*</think>\n{0,2})?(yes|no)", raw["content"],
                            re.DOTALL), raw["content"]
        parsed = message(server, **body, temperature=1.0, seed=seed)
        assert parsed["content"] in ("yes", "no") and raw["content"].endswith(parsed["content"])
    assert any(opened) and not all(opened)  # both ways happen among these seeds


def test_thinking_off_applies_the_constraint_to_the_whole_answer(server: RunningServer) -> None:
    for off in ({"chat_template_kwargs": {"enable_thinking": False}},
                {"reasoning_effort": "none"}):
        answer = message(server, guided_choice=["alpha", "beta"], **off)
        assert answer["content"] in ("alpha", "beta") and not answer.get("reasoning_content")


def test_anthropic_thinking_blocks(server: RunningServer) -> None:
    body = {"model": "m", "max_tokens": 30, "temperature": 0, "messages": THINKING,
            "thinking": {"type": "enabled", "budget_tokens": 4}}
    chat_answer = message(server, messages=THINKING, reasoning_budget_tokens=4, max_tokens=30)
    # Messages answers only the continuation of a trailing assistant message, as Anthropic does.
    thought = chat_answer["reasoning_content"].removeprefix("Let me see")
    blocks = ok(server, "/v1/messages", body)["content"]
    assert blocks[0] == {"type": "thinking", "thinking": thought, "signature": ""}
    assert blocks[1] == {"type": "text", "text": chat_answer["content"]}
    events = []
    with httpx.stream("POST", server.url + "/v1/messages", json={**body, "stream": True},
                      timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    thinking = "".join(e["delta"].get("thinking", "") for e in events
                       if e["type"] == "content_block_delta")
    assert starts == ["thinking", "text"] and thinking == thought
    for thinking, text in (({"type": "enabled"}, "'thinking.budget_tokens' is required"),
                           ({"type": "enabled", "budget_tokens": 30}, "less than 'max_tokens'")):
        response = post(server, "/v1/messages", {**body, "thinking": thinking})
        assert response.status_code == 400 and text in response.json()["error"]["message"]


def test_responses_reasoning_items(server: RunningServer) -> None:
    chat_answer = message(server, messages=THINKING, reasoning_budget_tokens=4, max_tokens=30)
    body = {"model": "m", "input": THINKING, "max_output_tokens": 30, "temperature": 0,
            "reasoning_budget_tokens": 4}
    out = ok(server, "/v1/responses", body)["output"]
    assert [item["type"] for item in out] == ["reasoning", "message"]
    assert out[0]["content"] == [{"type": "reasoning_text", "text": chat_answer[
        "reasoning_content"].removeprefix("Let me see")}]
    assert out[1]["content"][0]["text"] == chat_answer["content"]
    off = ok(server, "/v1/responses", {**body, "input": USER, "reasoning": {"effort": "none"},
                                        "max_output_tokens": 5})
    assert [item["type"] for item in off["output"]] == ["message"]


def test_server_flags_set_the_reasoning_defaults(qwen3_path: Path) -> None:
    config = ServerConfig(model=str(qwen3_path), threads=1, ctx_size=512, reasoning_budget=2,
                          reasoning_format="deepseek-legacy")
    with serving(config) as flagged:
        body = {"messages": THINKING, "guided_choice": ["yes"], "max_tokens": 30}
        by_flags = message(flagged, **body)
        asked = {**body, "reasoning_budget_tokens": 2, "reasoning_format": "deepseek-legacy"}
        assert message(flagged, **{**body, "reasoning_budget_tokens": -1}) == by_flags
    with serving(ServerConfig(model=str(qwen3_path), threads=1, ctx_size=512)) as plain:
        assert message(plain, **asked) == by_flags
    assert by_flags["content"].startswith("<think>") and by_flags["content"].endswith("yes")
    for field, value, text in (("reasoning_format", "xml", "reasoning_format must be one of"),
                               ("reasoning_budget", -2, "reasoning_budget must be >= -1")):
        with pytest.raises(ValueError, match=text):
            ServerConfig(model=str(qwen3_path), **{field: value})


# --- vLLM's fields --------------------------------------------------------------------------------


def test_vllm_fields_at_their_neutral_values_are_accepted(server: RunningServer) -> None:
    neutral = {"use_beam_search": False, "include_stop_str_in_output": False,
               "skip_special_tokens": True, "allowed_token_ids": [], "bad_words": [],
               "priority": 0, "return_tokens_as_token_ids": False,
               "guided_decoding_backend": "xgrammar"}
    assert message(server, **neutral) == message(server)


def test_guided_fields_constrain_the_answer(server: RunningServer) -> None:
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    assert message(server, guided_choice=["red", "green"], **off)["content"] in ("red", "green")
    assert message(server, structured_outputs={"choice": ["up", "down"]},
                   **off)["content"] in ("up", "down")
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}",
                        message(server, guided_regex=r"[0-9]{3}-[a-z]{2}", **off)["content"])
    assert message(server, guided_grammar='root ::= "x" "y"+ "z"', max_tokens=6,
                   **off)["content"].startswith("xy")
    assert message(server, guided_grammar='start: "ok" | "no"', **off)["content"] in ("ok", "no")
    # json_object is response_format's: the same grammar, so greedy gives the same text.
    as_vllm = message(server, structured_outputs={"json_object": True}, **off)["content"]
    assert as_vllm.startswith("{") and as_vllm == message(
        server, response_format={"type": "json_object"}, **off)["content"]


def test_min_tokens_holds_back_eos(server: RunningServer) -> None:
    eos_first = {"logit_bias": {str(EOS): 100}, "max_tokens": 20}
    early = chat(server, **eos_first)
    assert early["choices"][0]["finish_reason"] == "stop"
    assert early["usage"]["completion_tokens"] == 0
    held = chat(server, **eos_first, min_tokens=7)
    assert held["choices"][0]["finish_reason"] == "stop"
    assert held["usage"]["completion_tokens"] == 7


def test_min_tokens_holds_back_stop_strings(server: RunningServer) -> None:
    free = message(server, max_tokens=10, ignore_eos=True)["content"]
    stop = free[2:4]  # within the first tokens' text
    early = chat(server, max_tokens=10, ignore_eos=True, stop=[stop])
    assert early["choices"][0]["message"]["content"] == free[:free.index(stop)]
    held = chat(server, max_tokens=10, ignore_eos=True, stop=[stop], min_tokens=10)
    assert held["choices"][0]["message"]["content"] == free
    assert held["choices"][0]["finish_reason"] == "length"


def test_stop_token_ids_end_the_answer(server: RunningServer) -> None:
    free = chat(server, max_tokens=10, ignore_eos=True)
    tokens = tokenize(server, free["choices"][0]["message"]["content"])
    stop_at = tokens[3]
    stopped = chat(server, max_tokens=10, ignore_eos=True, stop_token_ids=[stop_at])
    assert stopped["choices"][0]["finish_reason"] == "stop"
    n = stopped["usage"]["completion_tokens"]
    assert n <= 3 and tokenize(server, stopped["choices"][0]["message"]["content"]) == tokens[:n]


@pytest.mark.parametrize(("body", "param", "text"), [
    ({"stop_token_ids": [N_VOCAB]}, "stop_token_ids", "out of range"),
    ({"stop_token_ids": ["a"]}, "stop_token_ids", "token ids"),
    ({"min_tokens": 50, "max_tokens": 10}, "min_tokens", "at most"),
    ({"min_tokens": -1}, "min_tokens", "between 0 and"),
    ({"guided_choice": []}, "guided_choice", "non-empty"),
    ({"guided_regex": 5}, "guided_regex", "regular expression"),
    ({"guided_json": {"type": "object"}, "guided_regex": "a"}, "guided_regex", "only one"),
    ({"structured_outputs": {"json": {}, "regex": "a"}}, "structured_outputs", "one of"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag",
     "not supported"),
    ({"structured_outputs": {"jsn": {}}}, "structured_outputs.jsn", "not a field"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern", "not supported"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs", "object"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs", "cannot set"),
    ({"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs.enable_thinking",
     "boolean"),
    ({"reasoning_effort": "huge"}, "reasoning_effort", "one of"),
    ({"reasoning_format": "xml"}, "reasoning_format", "one of"),
    ({"reasoning_budget_tokens": -2}, "reasoning_budget_tokens", ">= -1"),
    ({"use_beam_search": True}, "use_beam_search", "beam search"),
    ({"include_stop_str_in_output": True}, "include_stop_str_in_output", "send false"),
    ({"skip_special_tokens": False}, "skip_special_tokens", "send true"),
    ({"allowed_token_ids": [1, 2]}, "allowed_token_ids", "omit the field"),
    ({"bad_words": ["x"]}, "bad_words", "not supported"),
    ({"prompt_logprobs": 1}, "prompt_logprobs", "not supported"),
    ({"truncate_prompt_tokens": 5}, "truncate_prompt_tokens", "not supported"),
    ({"chat_template": "{{ 1 }}"}, "chat_template", "--chat-template"),
    ({"priority": 3}, "priority", "not supported"),
])
def test_bad_vllm_and_reasoning_fields_are_400s(server: RunningServer, body, param,
                                                  text) -> None:
    response = post(server, "/v1/chat/completions", {"messages": USER, **body})
    assert_400_naming(response, param, text)


def test_a_model_that_does_not_think(stories_path: Path) -> None:
    """stories260K's template (ChatML) has no </think>: its answers are not read for thinking,
    and asking it for a thinking budget is a 400."""
    with serving(ServerConfig(model=str(stories_path), threads=1, ctx_size=256)) as plain:
        answer = message(plain, max_tokens=8)
        assert "reasoning_content" not in answer and answer["content"]
        assert_400_naming(post(plain, "/v1/chat/completions", {
            "messages": USER, "reasoning_budget_tokens": 5}), "reasoning_budget_tokens",
            "does not think")
        response = post(plain, "/v1/messages", {
            "model": "m", "max_tokens": 30, "messages": USER,
            "thinking": {"type": "enabled", "budget_tokens": 4}})
        assert response.status_code == 400 and "does not think" in response.text
