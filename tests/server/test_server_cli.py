"""`ember serve` as a command: its flags and EMBER_* variables, a missing model (one line, exit
1, before listening), a model that fails to load in the background (the server stops, exit 1),
and CORS."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
from server_support import fake_config, free_socket, scripted, start_server

FLAGS = ["--host", "--port", "--parallel", "--kv-size", "--kv-type", "--api-key", "--cors-origins",
         "--max-queue", "--alias", "--ctx-size", "--threads", "--max-connections", "--header-timeout",
         "--body-timeout", "--idle-timeout", "--host-allow", "--n-predict", "--temp", "--top-k",
         "--top-p", "--min-p", "--seed", "--repeat-penalty", "--webui",  # --webui/--no-webui
         "--context-overflow", "--models-dir", "--keep-alive", "--max-memory"]


def ember(*args: str, env: dict[str, str] | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ember.cli", *args], check=False,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_help_lists_flags_and_env_vars() -> None:
    out = ember("serve", "--help", env={"COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"})
    assert out.returncode == 0, out.stderr
    for flag in FLAGS:
        assert flag in out.stdout, flag
        assert "EMBER_" + flag.removeprefix("--").replace("-", "_").upper() in out.stdout, flag
    assert "--no-webui" in out.stdout


def test_missing_model_fails_before_listening(tmp_path: Path) -> None:
    out = ember("serve", str(tmp_path / "nope.gguf"), "--port", "1")
    assert out.returncode == 1
    assert "model file not found" in out.stderr
    assert "Traceback" not in out.stderr
    assert "listening on" not in out.stderr


def test_ember_model_is_one_path_spaces_and_all(tmp_path: Path) -> None:
    """$EMBER_MODEL names one file, whatever its path holds (not split at spaces as a list
    argument's environment variable would be)."""
    path = tmp_path / "my models" / "a b.gguf"
    out = ember("serve", "--port", "1", env={"EMBER_MODEL": str(path)})
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == f"error: model file not found: {path}"


def test_bad_flag_value_is_one_line() -> None:
    out = ember("serve", "--parallel", "0")
    assert out.returncode == 1
    assert "parallel must be >= 1" in out.stderr
    assert "Traceback" not in out.stderr


def test_context_overflow_help_and_bad_value() -> None:
    out = ember("serve", "--help", env={"COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"})
    text = " ".join(out.stdout.split())
    for words in ("'shift' drops a chat's oldest whole turns", "'truncate-middle' keeps",
                  "X-Context-Dropped-Tokens", "[default: error]"):
        assert words in text, words
    out = ember("serve", "--context-overflow", "sometimes")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "context_overflow must be one of error, truncate-middle, shift, got 'sometimes'" in out.stderr


def test_kv_type_help_and_bad_values_are_one_line() -> None:
    out = ember("serve", "--help", env={"COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"})
    assert "half the KV memory" in " ".join(out.stdout.split())  # the trade-off is explained
    for args, env in ((["--kv-type", "q4_0"], {}), ([], {"EMBER_KV_TYPE": "q4_0"})):
        out = ember("serve", *args, env=env)
        assert out.returncode == 1, out.stderr
        assert "kv_type must be 'f16' or 'q8_0', got 'q4_0'" in out.stderr
        assert "Traceback" not in out.stderr
    out = ember("serve", "--backend", "llm")  # there is one execution path, and no such flag
    assert out.returncode != 0
    assert "No such option: --backend" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_port_in_use_is_one_line_before_anything_loads(stories_path: Path) -> None:
    taken = free_socket()  # bound and listening: the port is in use
    taken.listen()
    port = taken.getsockname()[1]
    try:
        out = ember("serve", str(stories_path), "--port", str(port), "--device", "cpu", timeout=60)
    finally:
        taken.close()
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use (another server "
        "there? --port picks another port)"), out.stderr
    assert "loaded" not in out.stderr and "Traceback" not in out.stderr
    assert "leaked" not in out.stderr and "terminate called" not in out.stderr


def test_unloadable_model_stops_the_server(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x00" * 64)
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    out = ember("serve", str(junk), "--port", str(port), timeout=60)
    assert out.returncode == 1, out.stderr
    assert "could not load the model" in out.stderr
    assert "listening on http://127.0.0.1:" in out.stderr  # it listened while the model loaded
    assert "Traceback" not in out.stderr


def test_cors() -> None:
    server = start_server(fake_config(cors_origins=["http://app.example"], api_key="k"),
                          scripted()[0])
    try:
        preflight = httpx.options(server.base_url + "/chat/completions", headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert preflight.status_code == 200  # answered before the API key check
        assert preflight.headers["access-control-allow-origin"] == "http://app.example"
        get = httpx.get(server.base_url + "/models", headers={
            "Origin": "http://app.example", "Authorization": "Bearer k"})
        assert get.status_code == 200
        assert get.headers["access-control-allow-origin"] == "http://app.example"
        other = httpx.get(server.url + "/health", headers={"Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in other.headers
    finally:
        server.stop()
