"""The half that the Responses and Messages shapes share: an answer as a list of parts — text,
and one part per tool call (read by ember.tools.calls' ToolCallStream when the request offered
tools, as chat completions read them) — in the order the model writes them.

The parts are built delta by delta, for a stream and for a whole response alike, so both hold
the same parts. A part opens when its first text arrives (the one before it closes then), grows,
and closes when the next opens or the answer ends; an empty answer is one empty text part.
Subclasses say what each of those steps sends (responses_api.py, anthropic_api.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ember.openai_format import call_id
from ember.results import Delta, GenerationResult
from ember.server.prompts import ChatPrompt
from ember.tools.calls import ToolCallStream


@dataclass
class Part:
    kind: str          # "text", "call" or "reasoning" (a reasoning model's thinking)
    id: str
    text: str = ""     # the text; a call's arguments (JSON text, as the model wrote it)
    name: str = ""     # a call's function
    call_id: str = ""  # a call's id, which its result names when it comes back
    done: bool = False


class PartsShape:
    """A respond.Shape whose answer is Parts; subclasses implement the hooks below."""

    def __init__(self, prompt: ChatPrompt) -> None:
        self._format = prompt.tool_format
        self._tools = ToolCallStream(prompt.tool_format, prompt.answer_prefix) \
            if prompt.tool_format is not None else None
        self._thinking = prompt.thinking.splitter() if prompt.thinking is not None else None
        self.parts: list[Part] = []
        self.calls: list[Part] = []  # the call parts, by call index
        self.result: GenerationResult | None = None

    # --- hooks -----------------------------------------------------------------------------

    def new_text(self) -> Part:
        raise NotImplementedError

    def new_call(self, name: str) -> Part:
        raise NotImplementedError

    def new_reasoning(self) -> Part:
        raise NotImplementedError

    def opened(self, part: Part) -> list[bytes]:
        raise NotImplementedError

    def grew(self, part: Part, text: str) -> list[bytes]:
        raise NotImplementedError

    def closed(self, part: Part) -> list[bytes]:
        raise NotImplementedError

    def ended(self) -> list[bytes]:
        """After the last part closed (self.result is set)."""
        raise NotImplementedError

    # --- the parts, as the answer grows ----------------------------------------------------

    def fresh_call_id(self) -> str:
        """A call id in the model's tool format (Mistral's templates need theirs back)."""
        assert self._format is not None
        return call_id(self._format)

    def index(self, part: Part) -> int:
        return self.parts.index(part)

    def _open(self, part: Part) -> list[bytes]:
        out = self._close()
        self.parts.append(part)
        return out + self.opened(part)

    def _close(self) -> list[bytes]:
        if not self.parts or self.parts[-1].done:
            return []
        self.parts[-1].done = True
        return self.closed(self.parts[-1])

    def _grow(self, part: Part, text: str) -> list[bytes]:
        part.text += text
        return self.grew(part, text)

    def feed(self, delta: Delta) -> list[bytes]:
        """The events of one Delta of the answer."""
        final = delta.result is not None
        text, out = delta.text, []
        if self._thinking is not None:
            thought, text = self._thinking.push(text, final)
            if thought:
                if not self.parts or self.parts[-1].kind != "reasoning":
                    out += self._open(self.new_reasoning())
                out += self._grow(self.parts[-1], thought)
        content, calls = self._tools.push(text, final) if self._tools is not None \
            else (text, [])
        if content:
            if not self.parts or self.parts[-1].kind != "text":
                out += self._open(self.new_text())
            out += self._grow(self.parts[-1], content)
        for call in calls:
            if call.name is not None:
                self.calls.append(self.new_call(call.name))
                out += self._open(self.calls[-1])
            if call.arguments:
                out += self._grow(self.calls[call.index], call.arguments)
        if final:
            self.result = delta.result
            if not self.parts:
                out += self._open(self.new_text())
            out += self._close()
            out += self.ended()
        return out

    # --- respond.Shape ---------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.result is not None

    def add(self, index: int, delta: Delta) -> None:
        self.feed(delta)

    def stream_delta(self, index: int, delta: Delta) -> list[bytes]:
        return self.feed(delta)

    def stream_end(self) -> list[bytes]:
        return []

    def response(self) -> Any:
        raise NotImplementedError
