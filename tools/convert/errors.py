"""The one error type the converter raises for bad input; its message says what, where, expected, got."""

from __future__ import annotations


class ConvertError(ValueError):
    """A checkpoint, tokenizer, GGUF file or option the converter cannot use. The CLI prints the
    message on one line (it is a ValueError, which ember.cli reports without a traceback)."""
