"""Built-in chat templates, by name, for GGUF files that carry none (`--chat-template NAME`), and
the one each architecture gets by default, as llama.cpp's `--chat-template gemma|chatml|llama3`
and its detection by architecture give them.

The turn formats are the models' own (Gemma's <start_of_turn>/<end_of_turn> with the assistant
as "model" and the system message opening the first user turn; Llama 3's header ids and
<|eot_id|>; ChatML's <|im_start|>/<|im_end|>), written as Jinja for ember.chat.template.ChatTemplate.
"""

from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

GEMMA = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set prefix = messages[0]['content'] | trim + '\\n\\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
    "{% for message in turns %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '')"
    " + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)

LLAMA3 = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

BUILTIN: dict[str, str] = {"chatml": CHATML, "gemma": GEMMA, "llama3": LLAMA3}

# general.architecture -> the built-in template a file of it gets when it carries none.
ARCH_DEFAULTS: dict[str, str] = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma"}


def default_for_arch(architecture: object) -> str:
    """The built-in template for a GGUF file without one: its architecture's, else ChatML."""
    return BUILTIN[ARCH_DEFAULTS.get(str(architecture), "chatml")]


def resolve(name_or_file: str) -> str:
    """`--chat-template` NAME (a built-in) or FILE (a Jinja template): its source. ValueError,
    naming the choices, when it is neither."""
    if name_or_file in BUILTIN:
        return BUILTIN[name_or_file]
    path = Path(name_or_file)
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"--chat-template {name_or_file!r}: cannot read it ({err})") from None
    raise ValueError(f"--chat-template {name_or_file!r} is neither a built-in template "
                     f"({', '.join(sorted(BUILTIN))}) nor a file")
