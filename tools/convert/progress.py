"""A one-line progress bar on stderr, redrawn in place on a terminal and silent elsewhere."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f}" if n >= 1e8 else f"{n / 1e6:.1f}M"


class ProgressBar:
    """Counts bytes written out of a known total; `enabled=None` means "when stderr is a tty"."""

    def __init__(self, total_bytes: int, label: str, *, enabled: bool | None = None,
                 stream: TextIO | None = None, width: int = 28) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total = max(total_bytes, 1)
        self.label = label
        self.width = width
        self.done = 0
        self.start = time.monotonic()
        self._last_len = 0

    def update(self, n_bytes: int, note: str = "") -> None:
        self.done += n_bytes
        if not self.enabled:
            return
        frac = min(self.done / self.total, 1.0)
        filled = int(frac * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = time.monotonic() - self.start
        unit = "GB" if self.total >= 1e8 else "B"
        line = (f"{self.label} [{bar}] {frac * 100:5.1f}% {_gb(self.done)}/{_gb(self.total)} "
                f"{unit} {elapsed:5.1f}s {note}")
        pad = " " * max(self._last_len - len(line), 0)
        self.stream.write("\r" + line + pad)
        self.stream.flush()
        self._last_len = len(line)

    def close(self) -> None:
        if self.enabled and self._last_len:
            self.stream.write("\n")
            self.stream.flush()
            self._last_len = 0
