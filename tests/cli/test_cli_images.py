"""Images on the command line: `ember run --image FILE` and `ember chat`'s `/image FILE`, on
stories260K (a text model: the clear one-line error, no traceback), and the image flags of
`ember serve` refused before it listens."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

FAST = ["-t", "1"]


def ember(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ember.cli", *args], input=stdin, check=False,
                          capture_output=True, text=True, timeout=300, env=os.environ.copy())


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def png(path: Path, width: int = 8, height: int = 6) -> Path:
    out = io.BytesIO()
    Image.fromarray(np.zeros((height, width, 3), np.uint8)).save(out, "PNG")
    path.write_bytes(out.getvalue())
    return path


def test_run_image_errors_are_one_line(stories_path: Path, tmp_path: Path) -> None:
    cat = png(tmp_path / "cat.png")
    line = one_error_line(ember("run", str(stories_path), "-p", "What is it?", "--image", str(cat),
                                *FAST))
    assert line == ("error: 'images[0]': this model takes no images; load it with mmproj=FILE "
                    "(its vision projector; ember run/chat --mmproj)")
    line = one_error_line(ember("run", str(stories_path), "-p", "x", "--image",
                                str(tmp_path / "missing.png")))
    assert line == f"error: --image {tmp_path / 'missing.png'}: no such file"
    tiny = png(tmp_path / "tiny.png", 1, 1)
    line = one_error_line(ember("run", str(stories_path), "-p", "x", "--image", str(tiny), *FAST))
    assert line == (f"error: {tiny}: the image is 1x1 pixels; each side must have at least 2")
    text = tmp_path / "notes.png"
    text.write_text("not a picture")
    assert "not an image of a known format" in one_error_line(
        ember("run", str(stories_path), "-p", "x", "--image", str(text), *FAST))
    assert one_error_line(ember("run", str(stories_path), "-p", "x", "--mmproj",
                                str(tmp_path / "none.gguf"))).endswith("none.gguf: no such file")


def test_chat_image_command_on_a_text_model(stories_path: Path, tmp_path: Path) -> None:
    cat = png(tmp_path / "cat.png")
    proc = ember("chat", str(stories_path), "--temp", "0", "-n", "4", *FAST,
                 stdin=f"/image {cat}\n/image\nHello\n")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "(this model takes no images; start ember chat with --mmproj FILE" in proc.stderr
    assert "(/image FILE attaches a picture to the next message)" in proc.stderr
    assert len(proc.stdout.strip().splitlines()) == 1  # "Hello" was answered, without the image


def test_serve_image_flags_fail_before_listening(stories_path: Path, tmp_path: Path) -> None:
    cases = {("--limit-mm-per-prompt", "video=2"): "expected image=N",
             ("--allowed-local-media-path", str(tmp_path / "none")): "no such directory",
             ("--mmproj", str(tmp_path / "none.gguf")): "none.gguf: no such file"}
    for args, message in cases.items():
        proc = ember("serve", str(stories_path), *args)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
        said = " ".join(proc.stderr.replace("│", " ").split())  # typer's box, lines joined
        assert message in said, proc.stderr
