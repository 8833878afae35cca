"""Tools in the prompt (ember.tools.prompt): OpenAI-shaped tools, assistant tool calls and tool
results rendered through real models' templates give the text transformers renders for the same
conversation in Hugging Face's shape; templates without tools get the standard tool prompt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers.utils import chat_template_utils

from ember.chat.template import ChatTemplate
from ember.tools.calls import GENERIC, HERMES, LLAMA3, MISTRAL
from ember.tools.prompt import prepare_chat, standard_tool_prompt, template_support
from ember.tools.request import parse_tools

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Météo d'une ville",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CALL_ID = "a1B2c3D4e"  # Mistral's templates want 9 letters and digits


def openai_chat(arguments: Any) -> list[dict[str, Any]]:
    """A whole tool loop as an OpenAI client sends it back (arguments as a JSON string)."""
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": CALL_ID, "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": CALL_ID, "content": "21 °C, sunny"},
    ]


class NoVocabulary:
    """A tokenizer in which no marker is one token."""

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False
               ) -> list[int]:
        return list(range(len(text)))

    def token_to_piece(self, token: int) -> bytes:
        return b"?"


def render(name: str, messages: list[dict[str, Any]], tools: Any, choice: Any = None
           ) -> tuple[str, Any]:
    template = ChatTemplate((TEMPLATES / f"{name}.jinja").read_text(), bos_token="<BOS>",
                            eos_token="<EOS>")
    chat = prepare_chat(template, NoVocabulary(), messages, parse_tools(tools, choice))
    return template.render(chat.messages, **chat.variables), chat


@pytest.mark.parametrize("name, fmt", [("qwen2.5", HERMES), ("qwen3", HERMES),
                                       ("qwen3-coder", HERMES), ("llama3.1", LLAMA3),
                                       ("mistral-nemo", MISTRAL)])
def test_a_tool_loop_renders_as_transformers_renders_it(name: str, fmt: Any) -> None:
    got, chat = render(name, openai_chat('{"city": "Paris"}'), [WEATHER])
    assert chat.format == fmt
    hf_messages = openai_chat({"city": "Paris"})  # Hugging Face templates take objects
    hf_messages[1]["content"] = ""
    rendered, _ = chat_template_utils.render_jinja_template(
        [hf_messages], chat_template=(TEMPLATES / f"{name}.jinja").read_text(),
        tools=[WEATHER], add_generation_prompt=True, bos_token="<BOS>", eos_token="<EOS>")
    assert got == rendered[0]
    assert "get_weather" in got and "21 °C, sunny" in got
    assert ('"city": "Paris"' in got) != (name == "qwen3-coder")  # its calls are XML


def test_qwen25_tool_loop_text() -> None:
    got, _ = render("qwen2.5", openai_chat('{"city": "Paris"}'), [WEATHER])
    assert got.endswith(
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n21 °C, sunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in got


def test_template_support_is_probed() -> None:
    def support(name: str) -> Any:
        return template_support((TEMPLATES / f"{name}.jinja").read_text(), "<s>", "</s>")

    for name in ("qwen2.5", "qwen3", "qwen3-coder", "llama3.1", "llama3.2", "mistral-nemo"):
        s = support(name)
        assert s.tools and s.tool_calls and s.object_arguments and s.tool_role, name
    for name in ("smollm2", "llama3", "mistral"):
        s = support(name)
        assert not (s.tools or s.tool_calls or s.tool_role), name
    assert support("smollm2").system_role and not support("mistral").system_role


def test_a_template_without_tools_gets_the_standard_prompt() -> None:
    got, chat = render("smollm2", openai_chat('{"city": "Paris"}'), [WEATHER])
    assert chat.format == GENERIC and chat.variables == {}
    prompt = standard_tool_prompt(parse_tools([WEATHER]))  # type: ignore[arg-type]
    assert got == (
        f"<|im_start|>system\n{prompt}<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n{"tool_calls": [{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}]}<|im_end|>\n'
        '<|im_start|>user\n{"tool_response": {"name": "get_weather", "tool_call_id": '
        '"a1B2c3D4e", "content": "21 °C, sunny"}}<|im_end|>\n'
        "<|im_start|>assistant\n")
    assert json.dumps(WEATHER, ensure_ascii=False) in prompt and '{"tool_calls": [' in prompt


def test_the_standard_prompt_joins_a_system_message_or_the_first_user_message() -> None:
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"}]
    got, _ = render("smollm2", messages, [WEATHER])
    assert got.startswith("<|im_start|>system\nBe brief.\n\nYou can call these tools")
    # Mistral's first template has no system role: the prompt opens the first user turn.
    got, _ = render("mistral", messages[1:], [WEATHER])
    assert got.startswith("<BOS>[INST] You can call these tools")
    assert got.endswith("Weather in Paris? [/INST]")


def test_tool_choice_none_leaves_the_tools_out() -> None:
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    got, chat = render("qwen2.5", messages, [WEATHER], "none")
    plain, _ = render("qwen2.5", messages, None)
    assert got == plain and "get_weather" not in got
    assert chat.format is None and chat.keep_tokens == []


def test_a_chat_without_tools_passes_unchanged() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    _, chat = render("qwen2.5", messages, None)
    assert chat.messages == messages and chat.variables == {} and chat.format is None


def test_marker_tokens_of_the_vocabulary_are_kept() -> None:
    class Tekken(NoVocabulary):
        ids = {"[TOOL_CALLS]": 5, "[ARGS]": 32}

        def encode(self, text: str, add_special: bool = True, parse_special: bool = False
                   ) -> list[int]:
            return [self.ids[text]] if parse_special and text in self.ids else [1, 2]

        def token_to_piece(self, token: int) -> bytes:
            return next(k for k, v in self.ids.items() if v == token).encode()

    template = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}"
                            "{% if tools %}{{ tools | tojson }}{% endif %}")
    chat = prepare_chat(template, Tekken(), [{"role": "user", "content": "x"}],
                        parse_tools([WEATHER]))
    assert chat.format == MISTRAL and chat.keep_tokens == [5, 32]


def test_a_forced_call_opens_the_answer_in_the_prompt() -> None:
    # What tool_choice "required" / a named function will do once constrained decoding exists
    # (parse_tools refuses them until then): the prompt ends with the call's opening markup,
    # and the answer is parsed as its continuation.
    from ember.openai_format import Formatter
    from ember.results import Delta, GenerationResult, Timings, Usage
    from ember.tools.request import ToolRequest

    tools = parse_tools([WEATHER]).tools  # type: ignore[union-attr]
    template = ChatTemplate((TEMPLATES / "qwen2.5.jinja").read_text())
    forced = ToolRequest(tools, "function", "get_weather")
    chat = prepare_chat(template, NoVocabulary(), openai_chat('{"city": "Paris"}')[:1], forced)
    assert chat.format == HERMES and chat.answer_prefix == "<tool_call>\n"
    assert chat.constraint is not None
    assert chat.constraint.schema["properties"]["name"] == {"const": "get_weather"}
    answer = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    fmt = Formatter(chat=True, model="m", n_choices=1, logprobs=False, tool_format=chat.format,
                    answer_prefix=chat.answer_prefix)
    result = GenerationResult(answer, [], "stop", Usage(1, 1, 2), Timings(0.0, 0.0, 0.0, 0.0))
    fmt.add(0, Delta(answer, [], [], "stop", result))
    [choice] = fmt.response()["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"] == {
        "name": "get_weather", "arguments": '{"city": "Oslo"}'}


def test_a_template_printing_arguments_as_they_are_gets_the_json_string() -> None:
    source = ("{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}"
              "{{ c.function.name }}({{ c.function.arguments }}){% endfor %}"
              "{% else %}[{{ m.role }}] {{ m.content }}\n{% endif %}{% endfor %}")
    support = template_support(source, "", "")
    assert support.tool_calls and not support.object_arguments and support.tool_role
    template = ChatTemplate(source)
    chat = prepare_chat(template, NoVocabulary(), openai_chat({"city": "Paris"}), None)
    assert template.render(chat.messages) == (
        '[user] Weather in Paris?\nget_weather({"city": "Paris"})[tool] 21 °C, sunny\n')
