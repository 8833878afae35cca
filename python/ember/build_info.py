"""What build of ember this is, as one string: `b<version>-<build id>`, llama.cpp's `b<build>-<commit>`
shape. The build id is the first 8 hex digits of the SHA-256 of the compiled core (ember._core),
so two installs answer the same string exactly when they run the same code. The server answers it
as `system_fingerprint` (OpenAI's field: clients compare it to tell backend changes apart) and as
/props' `build_info`, as llama-server does with its own.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from ember import _core


@functools.cache
def build_info() -> str:
    from ember import __version__  # set once ember/__init__.py has run, which imports this module

    digest = hashlib.sha256(Path(_core.__file__).read_bytes()).hexdigest()
    return f"b{__version__}-{digest[:8]}"
