"""A model file's chat template is untrusted code: on the server, one that loops, recurses or
builds huge strings on the sample conversation stops the server at load with one line (as an
unloadable model does), and one that runs away only on some request's messages is a 400 for that
request, rendered off the event loop, while /health keeps answering."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gguf_template import with_chat_template
from server_support import RunningServer, free_socket, serving
from test_server_cli import ember

from ember.server.config import ServerConfig

HOSTILE = Path(__file__).parent.parent / "data" / "chat_templates" / "hostile"

# Renders the sample conversation fine; spins (10^10 empty iterations) on a message "spin".
SPIN_ON_REQUEST = ("{% for m in messages %}{% if m['content'] == 'spin' %}"
                   "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                   "{% endfor %}{% endif %}{{ m['content'] }}\n{% endfor %}")


@pytest.mark.parametrize("name", ["loop.jinja", "doubling.jinja", "recurse.jinja",
                                  "internals.jinja"])
def test_a_hostile_template_stops_the_server_at_load(stories_path: Path, tmp_path: Path,
                                                     name: str) -> None:
    model = with_chat_template(stories_path, tmp_path / "hostile.gguf",
                               (HOSTILE / name).read_text())
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    start = time.monotonic()
    out = ember("serve", str(model), "--port", str(port), "--threads", "1", timeout=60)
    assert out.returncode == 1, out.stderr
    lines = [line for line in out.stderr.splitlines() if "could not load the model" in line]
    assert len(lines) == 1, out.stderr
    assert "chat template" in lines[0]
    assert "Traceback" not in out.stderr
    assert time.monotonic() - start < 30


@pytest.fixture(scope="module")
def spin_server(stories_path: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[RunningServer]:
    model = with_chat_template(stories_path, tmp_path_factory.mktemp("t") / "spin.gguf",
                               SPIN_ON_REQUEST)
    with serving(ServerConfig(model=str(model), parallel=1, threads=1, ctx_size=256)) as running:
        yield running


def test_a_runaway_render_is_a_400_and_the_loop_keeps_answering(spin_server: RunningServer
                                                                ) -> None:
    url = spin_server.url
    result: dict[str, httpx.Response] = {}

    def spin() -> None:
        result["r"] = httpx.post(url + "/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "spin"}], "max_tokens": 2})

    thread = threading.Thread(target=spin)
    start = time.monotonic()
    thread.start()
    latencies = []
    while thread.is_alive():
        t0 = time.perf_counter()
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        latencies.append(time.perf_counter() - t0)
        time.sleep(0.02)
    thread.join()
    elapsed = time.monotonic() - start
    response = result["r"]
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "chat_template_timeout" and error["param"] == "messages"
    assert "longer than 1 s" in error["message"]
    assert 0.9 < elapsed < 3.0, elapsed
    # The spinning render holds the GIL between switch intervals, and this test's client shares
    # the process: /health slows (~0.1-0.2 s here) but never stalls.
    assert len(latencies) >= 3 and max(latencies) < 0.5, latencies
    ok = httpx.post(url + "/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 2})
    assert ok.status_code == 200, ok.text
