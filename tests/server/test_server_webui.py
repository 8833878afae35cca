"""The chat page at GET /, in a real browser: headless Chromium (Debian's `chromium` package),
driven over the DevTools protocol, types a question, sees the answer stream in piece by piece,
and saves a screenshot (tmp_path/chat-page.png); --no-webui turns the page off.

Without a browser the browser test is skipped, unless EMBER_REQUIRE_BROWSER=1 (CI sets it), where
that is a failure. EMBER_CHROMIUM names the browser's binary where it is not on PATH."""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_support import RunningServer, fake_config, scripted, start_server
from websockets.sync.client import ClientConnection, connect

from ember.server.config import ServerConfig

QUESTION = "What is the capital of France?"
SYSTEM = "You are a helpful assistant."


class DevTools:
    """A Chromium page over the DevTools protocol (JSON over a websocket)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    def call(self, method: str, timeout: float = 30, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:  # events arrive in between; the answer carries our id
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == call_id:
                assert "error" not in message, message
                return message.get("result", {})

    def eval(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# Where Chromium or Chrome lives when it is not on PATH: macOS keeps its apps out of PATH.
MACOS_BROWSERS = ("/Applications/Chromium.app/Contents/MacOS/Chromium",
                  "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome")


def find_browser() -> str:
    """The browser's binary: EMBER_CHROMIUM, else chromium / chromium-browser / google-chrome on
    PATH, else a macOS app. None there is a skip, or with EMBER_REQUIRE_BROWSER=1 a failure."""
    named = os.environ.get("EMBER_CHROMIUM")
    if named:
        if shutil.which(named) is None:
            pytest.fail(f"EMBER_CHROMIUM={named} is not an executable browser")
        return named
    for name in ("chromium", "chromium-browser", "google-chrome"):
        binary = shutil.which(name)
        if binary is not None:
            return binary
    for binary in MACOS_BROWSERS:
        if os.access(binary, os.X_OK):
            return binary
    why = ("no Chromium on PATH: apt-get install chromium (macOS: brew install --cask google-chrome), "
           "or set EMBER_CHROMIUM to the browser's binary")
    if os.environ.get("EMBER_REQUIRE_BROWSER") == "1":
        pytest.fail(f"EMBER_REQUIRE_BROWSER=1 but {why}")
    pytest.skip(f"{why}; EMBER_REQUIRE_BROWSER=1 makes this a failure")


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[DevTools]:
    binary = find_browser()
    process = subprocess.Popen(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-extensions", "--remote-debugging-port=0", "--window-size=1100,760",
         f"--user-data-dir={tmp_path / 'profile'}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        deadline, port = time.monotonic() + 60, None
        while port is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            match = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if match:
                port = int(match.group(1))
            elif not line and process.poll() is not None:
                break
        assert port is not None, "Chromium did not start its DevTools endpoint"
        pages = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(p for p in pages if p["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=64 << 20) as ws:
            yield DevTools(ws)
    finally:
        process.kill()
        process.wait(timeout=30)


@pytest.fixture()
def smollm2_server(smollm2_path: Path) -> Iterator[RunningServer]:
    running = start_server(ServerConfig(model=str(smollm2_path), threads=1, ctx_size=512,
                                        aliases=["SmolLM2-135M-Instruct"]))
    yield running
    running.stop()


def test_chat_page_in_chromium(browser: DevTools, smollm2_server: RunningServer,
                               tmp_path: Path) -> None:
    url = smollm2_server.url + "/"
    browser.call("Page.enable")
    browser.call("Page.navigate", url=url)
    browser.wait_for("document.getElementById('model')?.textContent.startsWith('model: ')",
                     30, "the page to load and name the model")
    assert browser.eval("document.getElementById('model').textContent") == \
        "model: SmolLM2-135M-Instruct"
    # Greedy, so the answer can be compared with the API's; count the answer's updates.
    browser.eval("document.getElementById('temperature').value = '0';"
                 "document.getElementById('system').value = " + json.dumps(SYSTEM) + ";"
                 "window.updates = 0; new MutationObserver((records) => {"
                 "  for (const r of records) if (r.target.closest?.('.assistant') ||"
                 "      r.target.parentElement?.closest('.assistant')) window.updates++;"
                 "}).observe(document.getElementById('log'),"
                 "  {childList: true, subtree: true, characterData: true}); true")
    browser.eval("document.getElementById('prompt').focus()")
    browser.call("Input.insertText", text=QUESTION)
    for kind in ("keyDown", "keyUp"):
        browser.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                     windowsVirtualKeyCode=13, nativeVirtualKeyCode=13)
    browser.wait_for("document.querySelector('.assistant')?.dataset.state === 'done'", 90,
                     "the streamed answer to finish")
    answer = browser.eval("document.querySelector('.assistant').firstChild.textContent")
    meta = browser.eval("document.querySelector('.assistant .meta').textContent")
    updates = browser.eval("window.updates")
    user = browser.eval("document.querySelector('.user').textContent")
    shot = browser.call("Page.captureScreenshot", format="png")
    path = tmp_path / "chat-page.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    print(f"screenshot: {path}")

    assert user == QUESTION
    client = openai.OpenAI(base_url=smollm2_server.base_url, api_key="x", max_retries=0)
    expected = client.chat.completions.create(
        model="x", messages=[{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": QUESTION}],
        temperature=0, top_p=0.95, max_tokens=512)
    assert answer == expected.choices[0].message.content
    assert "Paris" in answer
    assert expected.usage is not None
    n_tokens = expected.usage.completion_tokens
    assert meta.startswith(f"{n_tokens} tokens · ") and meta.endswith("stop"), meta
    assert "tokens/s" in meta
    assert updates > 2, "the answer arrived in one piece, not streamed"
    png = path.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000

    # Stop: a long answer is cut off once it has begun, and the server lets go of it.
    browser.eval("document.getElementById('max_tokens').value = '400';"
                 "document.getElementById('prompt').value = 'Write a long story about a dragon.';"
                 "document.getElementById('form').requestSubmit(); true")
    browser.wait_for("document.querySelectorAll('.assistant')[1]?.textContent.length > 0", 60,
                     "the second answer to start")
    browser.eval("document.getElementById('stop').click(); true")
    browser.wait_for("document.querySelectorAll('.assistant')[1].dataset.state === 'done'", 30,
                     "the stopped answer to settle")
    assert browser.eval("document.querySelectorAll('.assistant')[1]"
                        ".querySelector('.meta').textContent").endswith("stopped")
    engine = smollm2_server.server.ctx.engine
    assert engine is not None
    deadline = time.monotonic() + 30
    while engine.stats().running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats().running == 0  # the disconnect cancelled it


def test_page_is_bundled_and_can_be_turned_off() -> None:
    make, _ = scripted()
    on = start_server(fake_config(api_key="k"), make)
    try:
        page = httpx.get(on.url + "/")  # no key needed for the page itself
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "connect-src 'self'" in page.headers["content-security-policy"]
        assert "v1/chat/completions" in page.text and "<script" in page.text
        assert "src=" not in page.text.split("<script")[1].split(">")[0]  # nothing fetched
    finally:
        on.stop()
    make, _ = scripted()
    off = start_server(fake_config(webui=False), make)
    try:
        assert httpx.get(off.url + "/").status_code == 404
    finally:
        off.stop()
