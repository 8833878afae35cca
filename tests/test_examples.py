"""The scripts in examples/ run as documented against a real `ember serve` (uvicorn on loopback,
stories260K, an API key so the scripts' key handling is exercised too)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_support import RunningServer, start_server

from ember.server.config import ServerConfig

EXAMPLES = Path(__file__).parent.parent / "examples"
KEY = "example-key"


@pytest.fixture(scope="module")
def server(stories_path: Path) -> Iterator[RunningServer]:
    running = start_server(ServerConfig(model=str(stories_path), parallel=4, ctx_size=256,
                                        api_key=KEY))
    yield running
    running.stop()


def run(args: list[str], env: dict[str, str] | None = None) -> str:
    result = subprocess.run(args, check=False, capture_output=True, text=True, timeout=180,
                            env=dict(os.environ, **(env or {})))
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_curl_script(server: RunningServer) -> None:
    out = run(["bash", str(EXAMPLES / "curl.sh")], {"EMBER_URL": server.url, "EMBER_API_KEY": KEY})
    sections = out.split("# ")
    chat = json.loads(next(s for s in sections if s.startswith("POST /v1/chat")).split("\n", 1)[1])
    assert chat["object"] == "chat.completion"
    assert chat["usage"]["completion_tokens"] == 32  # stories260K never stops early in 32 tokens
    models = json.loads(next(s for s in sections if s.startswith("GET /v1/models")).split("\n", 1)[1])
    assert models["data"][0]["object"] == "model"
    stream = next(s for s in sections if s.startswith("POST /v1/completions"))
    events = [line[len("data: "):] for line in stream.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["usage"]["completion_tokens"] == 8


def test_curl_script_without_the_key_is_refused(server: RunningServer) -> None:
    result = subprocess.run(["bash", str(EXAMPLES / "curl.sh")], check=False, capture_output=True, text=True,
                            timeout=60, env=dict(os.environ, EMBER_URL=server.url, EMBER_API_KEY=""))
    assert '"code":"invalid_api_key"' in result.stdout.replace(" ", "")


def test_openai_client_example(server: RunningServer) -> None:
    out = run([sys.executable, str(EXAMPLES / "openai_client.py"), "--base-url", server.base_url,
               "--api-key", KEY])
    assert out.startswith("answer: ")
    assert re.search(r"^\(\d+ tokens\)$", out, re.MULTILINE)
    assert len(re.findall(r"^async: ", out, re.MULTILINE)) == 3


def test_concurrent_load_example(server: RunningServer) -> None:
    out = run([sys.executable, str(EXAMPLES / "concurrent_load.py"), "--base-url", server.base_url,
               "--api-key", KEY, "--clients", "4", "--requests", "10", "--max-tokens", "12"])
    assert "10 requests from 4 clients" in out
    generated = int(re.search(r"generated (\d+) tokens", out).group(1))
    assert 10 <= generated <= 120
