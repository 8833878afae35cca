"""Chat templates: real models' templates (stored in tests/data/chat_templates, as their
tokenizer_config.json has them) rendered to the exact prompt strings those models expect."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from transformers.utils import chat_template_utils

from ember.chat import builtin
from ember.chat.template import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"

PIRATE = [
    {"role": "system", "content": "You are a pirate."},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Ahoy!"},
    {"role": "user", "content": "Where is the treasure?"},
]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Météo d'une ville",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def template(name: str, bos: str = "", eos: str = "") -> ChatTemplate:
    return ChatTemplate((TEMPLATES / f"{name}.jinja").read_text(), bos_token=bos, eos_token=eos)


# --- Llama 3 -------------------------------------------------------------------------------------

def llama3_turn(role: str, text: str) -> str:
    return f"<|start_header_id|>{role}<|end_header_id|>\n\n{text}<|eot_id|>"


def test_llama3() -> None:
    got = template("llama3", bos="<|begin_of_text|>").render(PIRATE)
    assert got == (
        "<|begin_of_text|>"
        + llama3_turn("system", "You are a pirate.")
        + llama3_turn("user", "Hi!")
        + llama3_turn("assistant", "Ahoy!")
        + llama3_turn("user", "Where is the treasure?")
        + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_llama3_trims_content_and_can_leave_out_the_generation_prompt() -> None:
    got = template("llama3", bos="<|begin_of_text|>").render(
        [{"role": "user", "content": "  Hi!\n"}], add_generation_prompt=False)
    assert got == "<|begin_of_text|>" + llama3_turn("user", "Hi!")


LLAMA32_HEAD = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    "Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n"
)


def test_llama32_with_a_given_date() -> None:
    got = template("llama3.2", bos="<|begin_of_text|>").render(PIRATE, date_string="26 Jul 2024")
    assert got == (
        LLAMA32_HEAD.format(date="26 Jul 2024") + "You are a pirate.<|eot_id|>"
        + llama3_turn("user", "Hi!")
        + llama3_turn("assistant", "Ahoy!")
        + llama3_turn("user", "Where is the treasure?")
        + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_llama32_takes_todays_date_from_strftime_now() -> None:
    before = datetime.now().strftime("%d %b %Y")
    got = template("llama3.2", bos="<|begin_of_text|>").render([{"role": "user", "content": "Hi!"}])
    after = datetime.now().strftime("%d %b %Y")
    assert got in {
        LLAMA32_HEAD.format(date=day) + "<|eot_id|>" + llama3_turn("user", "Hi!")
        + "<|start_header_id|>assistant<|end_header_id|>\n\n"
        for day in (before, after)
    }


def test_llama32_tools_go_into_the_first_user_message_as_indented_json() -> None:
    tool = WEATHER_TOOL["function"]
    got = template("llama3.2", bos="<|begin_of_text|>").render(
        [{"role": "user", "content": "Weather in Paris?"}], tools=[tool], date_string="1 Jan 2025")
    assert got == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 1 Jan 2025\n\n"
        "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
        "Given the following functions, please respond with a JSON for a function call "
        "with its proper arguments that best answers the given prompt.\n\n"
        'Respond in the format {"name": function name, "parameters": dictionary of argument '
        'name and its value}.Do not use variables.\n\n'
        + json.dumps(tool, indent=4, ensure_ascii=False) + "\n\n"
        "Weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert "Météo d'une ville" in got  # tojson keeps non-ASCII text and quotes as they are


def test_llama32_raise_exception_becomes_chat_template_error() -> None:
    with pytest.raises(ChatTemplateError, match="Cannot put tools in the first user message"):
        template("llama3.2").render([{"role": "system", "content": "x"}], tools=[{"name": "f"}])


# --- Qwen2.5 -------------------------------------------------------------------------------------

def test_qwen25_with_a_system_message() -> None:
    got = template("qwen2.5").render(PIRATE)
    assert got == (
        "<|im_start|>system\nYou are a pirate.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nAhoy!<|im_end|>\n"
        "<|im_start|>user\nWhere is the treasure?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_qwen25_default_system_message() -> None:
    got = template("qwen2.5").render([{"role": "user", "content": "Hi!"}])
    assert got == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
        "<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )


def test_qwen25_tools_tool_calls_and_tool_results() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        ]},
        {"role": "tool", "content": '{"temp": 21}'},
    ]
    got = template("qwen2.5").render(messages, tools=[WEATHER_TOOL])
    assert got == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(WEATHER_TOOL, ensure_ascii=False) +
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )


# --- Mistral -------------------------------------------------------------------------------------

def test_mistral() -> None:
    got = template("mistral", bos="<s>", eos="</s>").render(PIRATE[1:])
    assert got == "<s>[INST] Hi! [/INST]Ahoy!</s>[INST] Where is the treasure? [/INST]"


def test_mistral_refuses_a_system_message() -> None:
    with pytest.raises(ChatTemplateError, match="Conversation roles must alternate"):
        template("mistral", bos="<s>", eos="</s>").render(PIRATE)


# --- SmolLM2 (the template inside the demo model's GGUF) -----------------------------------------

SMOLLM2_FRANCE = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
)


def test_smollm2() -> None:
    got = template("smollm2").render([{"role": "user", "content": "What is the capital of France?"}])
    assert got == SMOLLM2_FRANCE
    got = template("smollm2").render(PIRATE[:2], add_generation_prompt=False)
    assert got == "<|im_start|>system\nYou are a pirate.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"


def test_smollm2_template_comes_from_the_gguf(smollm2_path: Path) -> None:
    t = ChatTemplate.from_gguf(smollm2_path)
    assert not t.is_default
    assert t.source == (TEMPLATES / "smollm2.jinja").read_text()
    assert (t.bos_token, t.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert t.render([{"role": "user", "content": "What is the capital of France?"}]) == SMOLLM2_FRANCE


# --- ChatML fallback and the environment -------------------------------------------------------

def test_chatml_when_the_model_has_no_template(stories_path: Path) -> None:
    t = ChatTemplate.from_gguf(stories_path)
    assert t.is_default and t.source == CHATML_TEMPLATE
    assert (t.bos_token, t.eos_token) == ("<s>", "</s>")
    assert t.render(PIRATE[:2]) == (
        "<|im_start|>system\nYou are a pirate.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_loop_controls_and_generation_tag() -> None:
    t = ChatTemplate(
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% generation %}[{{ m.content }}]{% endgeneration %}"
        "{% if loop.index >= 3 %}{% break %}{% endif %}{% endfor %}")
    assert t.render(PIRATE) == "[Hi!][Ahoy!]"


def test_content_given_as_text_parts() -> None:
    parts = [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]
    assert ChatTemplate().render([{"role": "user", "content": parts}], add_generation_prompt=False) \
        == "<|im_start|>user\nHi\n!<|im_end|>\n"  # joined with "\n", as llama.cpp joins them
    with pytest.raises(ChatTemplateError, match="not supported"):
        ChatTemplate().render([{"role": "user", "content": [{"type": "image_url"}]}])


def test_the_sandbox_blocks_python_internals_and_mutation() -> None:
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render(PIRATE)
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{% set _ = messages.append({'role': 'x'}) %}").render(PIRATE)


def test_bad_templates_and_messages() -> None:
    with pytest.raises(ChatTemplateError, match="line 1"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="messages is empty"):
        ChatTemplate().render([])
    with pytest.raises(ChatTemplateError, match="must be a dict with a 'role'"):
        ChatTemplate().render([{"content": "x"}])


# --- against transformers, the reference renderer ------------------------------------------------

CASES = [
    ("llama3", PIRATE, {}),
    ("llama3.2", PIRATE, {"date_string": "26 Jul 2024"}),
    ("llama3.2", PIRATE[1:2], {"tools": [WEATHER_TOOL["function"]], "date_string": "1 Jan 2025"}),
    ("qwen2.5", PIRATE, {}),
    ("qwen2.5", PIRATE[1:2], {"tools": [WEATHER_TOOL]}),
    ("mistral", PIRATE[1:], {}),
    ("smollm2", PIRATE[1:], {}),
]


@pytest.mark.parametrize("name, messages, variables", CASES)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_same_text_as_transformers(name: str, messages: list, variables: dict,
                                   add_generation_prompt: bool) -> None:
    source = (TEMPLATES / f"{name}.jinja").read_text()
    rendered, _ = chat_template_utils.render_jinja_template(
        [messages], chat_template=source, add_generation_prompt=add_generation_prompt,
        bos_token="<BOS>", eos_token="<EOS>", **variables)
    got = ChatTemplate(source, bos_token="<BOS>", eos_token="<EOS>").render(
        messages, add_generation_prompt=add_generation_prompt, **variables)
    assert got == rendered[0]


# --- hostile templates (tests/data/chat_templates/hostile): fail fast, bounded ---------------

HOSTILE = TEMPLATES / "hostile"
# file -> (the error's kind: "time", "size" or None for a plain ChatTemplateError, a message part)
HOSTILE_CASES = {
    "loop.jinja": ("time", "longer than 1 s"),            # 10^10 empty iterations
    "huge_range.jinja": ("size", "10000000000"),          # range(10**10)
    "recurse.jinja": (None, "recursed too deeply"),        # a macro calling itself
    "doubling.jinja": ("size", "'~'"),                    # a string doubled 64 times
    "repeat.jinja": ("size", "'*'"),                      # 'x' * 10**10
    "macro_buffer.jinja": ("size", "in all"),             # 10^7 writes into a macro's buffer
    "output_flood.jinja": ("size", "output passes"),      # 10^8 writes of the output
    "padding.jinja": ("size", "center"),                  # 'x'.center(10**9)
    "format_width.jinja": ("size", "format width"),       # '{:>1000000000}'.format(...)
    "bigint.jinja": ("size", "bits"),                     # 10 ** (10 ** 8)
    "internals.jinja": (None, "unsafe"),                  # ''.__class__.__mro__ ...
}


@pytest.mark.parametrize("name", sorted(HOSTILE_CASES))
def test_hostile_template_fails_within_its_limits(name: str) -> None:
    import time
    import tracemalloc

    from ember.chat.template import ChatTemplateLimitError

    kind, text = HOSTILE_CASES[name]
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(ChatTemplateError) as raised:
            ChatTemplate((HOSTILE / name).read_text()).check()
        elapsed = time.monotonic() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert text in str(raised.value)
    assert getattr(raised.value, "kind", None) == kind
    assert isinstance(raised.value, ChatTemplateLimitError) == (kind is not None)
    assert elapsed < 1.5, elapsed
    assert peak < 200 << 20, peak  # 16 M characters in all, at most 4 bytes each, plus copies


def test_the_watchdog_never_fires_after_a_render() -> None:
    """Renders that end just around their deadline: a timeout is either the render's error or
    nothing, never an exception raised later in unrelated code."""
    import time

    from ember.chat.limits import RenderLimits

    busy = ChatTemplate("{% for i in range(3000) %}{{ i }}{% endfor %}")
    # Deadlines around the render's own time (about 1 ms here), plus one no render can meet and
    # one every render meets, so both outcomes occur on a machine of any speed.
    deadlines = [1e-6, 0.0005, 0.001, 0.0015, 0.002, 0.003, 10.0]
    outcomes = set()
    for i in range(210):
        limits = RenderLimits(max_seconds=deadlines[i % len(deadlines)])
        try:
            busy.render(PIRATE, limits=limits)
            outcomes.add("rendered")
        except ChatTemplateError as err:
            assert "longer than" in str(err)
            outcomes.add("timeout")
    time.sleep(0.02)  # a stray asynchronous exception would land in this loop
    for _ in range(100_000):
        pass
    assert outcomes == {"rendered", "timeout"}


def test_request_time_limits_stop_a_long_render() -> None:
    from ember.chat.limits import RenderLimits
    from ember.chat.template import ChatTemplateLimitError

    long_chat = [{"role": "user", "content": "word " * 2000}]
    with pytest.raises(ChatTemplateLimitError) as raised:
        ChatTemplate().render(long_chat, limits=RenderLimits(max_chars=4000))
    assert raised.value.kind == "size" and "4000" in str(raised.value)
    assert len(ChatTemplate().render(long_chat, limits=RenderLimits(max_chars=20_000))) > 10_000


def test_a_template_that_refuses_the_sample_still_loads() -> None:
    strict = ChatTemplate("{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system "
                          "role') }}{% endif %}{{ messages[0]['content'] }}")
    strict.check()
    with pytest.raises(ChatTemplateError, match="no system role"):
        strict.render([{"role": "system", "content": "x"}])


# --- built-in templates (ember.chat.builtin) ----------------------------------------------------

def test_builtin_llama3_renders_as_the_real_llama3_template() -> None:
    ours = ChatTemplate(builtin.resolve("llama3"), bos_token="<|begin_of_text|>")
    real = template("llama3", bos="<|begin_of_text|>")
    for messages in (PIRATE, PIRATE[1:2], PIRATE[:3]):
        assert ours.render(messages) == real.render(messages)


def test_builtin_chatml_is_the_fallback() -> None:
    assert builtin.resolve("chatml") == CHATML_TEMPLATE


def test_builtin_gemma_turns() -> None:
    """Gemma's format (as its tokenizer_config.json template and llama.cpp's built-in "gemma"
    write it): the assistant is "model", the system message opens the first user turn."""
    t = ChatTemplate(builtin.resolve("gemma"), bos_token="<bos>")
    assert t.render(PIRATE) == (
        "<bos><start_of_turn>user\nYou are a pirate.\n\nHi!<end_of_turn>\n"
        "<start_of_turn>model\nAhoy!<end_of_turn>\n"
        "<start_of_turn>user\nWhere is the treasure?<end_of_turn>\n<start_of_turn>model\n")
    assert t.render(PIRATE[1:2], add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nHi!<end_of_turn>\n")


def test_architecture_default_and_override() -> None:
    gemma = {"general.architecture": "gemma3", "tokenizer.ggml.tokens": ["<pad>", "<eos>", "<bos>"],
             "tokenizer.ggml.bos_token_id": 2}
    t = ChatTemplate.from_metadata(gemma)
    assert t.is_default and t.source == builtin.GEMMA and t.bos_token == "<bos>"
    assert ChatTemplate.from_metadata({**gemma, "general.architecture": "llama"}).source == CHATML_TEMPLATE
    assert ChatTemplate.from_metadata(gemma, builtin.resolve("chatml")).source == CHATML_TEMPLATE


def test_template_from_a_file_or_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0]['content'] }}")
    assert builtin.resolve(str(path)) == "{{ messages[0]['content'] }}"
    with pytest.raises(ValueError, match=r"'nope' is neither a built-in template \(chatml, gemma, llama3\)"):
        builtin.resolve("nope")
