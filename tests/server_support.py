"""Helpers for the server tests (no tests here): a real uvicorn server on a free loopback port in
a thread, and a scripted engine without a model (the public ember.engine.Engine API the server
uses) for the HTTP layer's failure paths that a real model cannot be made to take on cue."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ember.chat.template import ChatTemplate
from ember.context_fit import Dropped
from ember.engine import EngineBusy, EngineError, EngineStats
from ember.results import Delta, GenerationResult, Timings, Usage
from ember.sampling import SamplingParams
from ember.server.config import ServerConfig
from ember.server.run import EmberServer, make_server


@dataclass
class RunningServer:
    server: EmberServer
    thread: threading.Thread
    url: str

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive(), "the server did not stop"


def free_socket() -> socket.socket:
    # IPPROTO_TCP, as getaddrinfo gives: asyncio then sets TCP_NODELAY on accepted connections
    # (with proto 0 it does not, and every response waits 40 ms for a delayed ACK).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def wait_healthy(url: str, timeout: float = 120.0) -> None:
    def healthy() -> bool:
        try:
            return httpx.get(url + "/health", timeout=5).status_code == 200
        except httpx.TransportError:  # not listening yet
            return False

    wait_until(healthy, timeout, f"{url}/health to answer 200")


def sample(url: str, name: str, labels: str = "") -> float:
    """The value of one Prometheus sample at url/metrics (0 when absent)."""
    key = f"{name}{{{labels}}}" if labels else name
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.split(" ")[0] == key:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def post(server: RunningServer, path: str, body: Any, timeout: float = 120) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=timeout)


def ok(server: RunningServer, path: str, body: Any, timeout: float = 120) -> Any:
    """The JSON answer of a POST that must succeed."""
    response = post(server, path, body, timeout)
    assert response.status_code == 200, response.text
    return response.json()


def assert_400_naming(response: httpx.Response, param: str, text: str) -> dict[str, Any]:
    """A client mistake: a 400 whose error names `param` and says `text`."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and text in error["message"], error
    return error


def read_data_events(response: httpx.Response, n: int) -> Iterator[str]:
    """Reads a streamed response's first `n` `data:` lines; returns its line iterator, which
    the caller must keep referenced while the stream should stay open (closing the iterator,
    as a for loop's temporary one is closed at `break`, makes httpcore drop the connection)."""
    lines = response.iter_lines()
    n_data = 0
    for line in lines:
        n_data += line.startswith("data: ")
        if n_data == n:
            break
    return lines


def wait_until(condition: Any, timeout: float, what: str) -> None:
    """Polls condition() until it holds; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


@contextlib.contextmanager
def serve_process(model: Path, args: list[str], log_dir: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """`ember serve MODEL ARGS` as a child process on a free loopback port, healthy: (its URL,
    the process). On exit it is terminated, and its stderr must hold no traceback."""
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    # A file, not a pipe: the server logs a line per request, and a pipe nobody reads while
    # it runs fills up (64 KiB) and blocks its event loop on a write to stderr.
    log_path = log_dir / "stderr.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "ember.cli", "serve", str(model), "--port", str(port), *args],
            stdout=subprocess.DEVNULL, stderr=log, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, timeout=60)
            yield url, process
        finally:
            process.terminate()
            process.wait(timeout=30)
    stderr = log_path.read_text()
    assert "Traceback" not in stderr, stderr[-3000:]


@contextlib.contextmanager
def serving(config: ServerConfig, make_engine: Callable[[], Any] | None = None
            ) -> Iterator[RunningServer]:
    """start_server for the length of a `with` block (a module fixture's body)."""
    running = start_server(config, make_engine)
    try:
        yield running
    finally:
        running.stop()


def start_server(config: ServerConfig, make_engine: Callable[[], Any] | None = None,
                 wait_ready: bool = True) -> RunningServer:
    """Runs the app under uvicorn in a thread, listening on 127.0.0.1 at a free port."""
    sock = free_socket()
    port = sock.getsockname()[1]
    server = make_server(config, make_engine, log_level="warning", access_log=False)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name="uvicorn-test")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    running = RunningServer(server, thread, f"http://127.0.0.1:{port}")
    if wait_ready:
        wait_healthy(running.url)
    return running


class _Tokenizer:
    """Tokens are characters: id = code point % 256 + 1."""

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return [ord(c) % 256 + 1 for c in text]

    def decode(self, tokens: Sequence[int], skip_special: bool = True) -> str:
        return "".join(chr(t - 1) for t in tokens)

    def token_to_piece(self, token: int) -> bytes:
        return chr(token - 1).encode() if token > 0 else b""


class ScriptedRequest:
    """What ScriptedEngine.submit returns: the async-iterable part of ember.engine.Request."""

    def __init__(self, engine: ScriptedEngine, request_id: int, prompt: list[int]) -> None:
        self.engine = engine
        self.id = request_id
        self.prompt_tokens = prompt
        self.tokens: list[int] = []
        self.done = False

    def cancel(self) -> None:
        if not self.done:
            self.engine.cancelled.append(self.id)
        self.done = True

    async def __aiter__(self) -> AsyncIterator[Delta]:
        text = "".join(chr(t - 1) for t in self.prompt_tokens)
        reply = self.engine.reply(text) if self.engine.reply is not None else None
        try:
            if reply is not None:
                for i, c in enumerate(reply):  # one character (token) per Delta
                    self.tokens.append(ord(c) % 256 + 1)
                    if i + 1 < len(reply):
                        yield Delta(c, [self.tokens[-1]], [])
                        await asyncio.sleep(0)
                n, m = len(self.prompt_tokens), len(self.tokens)
                self.done = True
                yield Delta(reply[-1:], self.tokens[-1:], [], "stop", GenerationResult(
                    reply, list(self.tokens), "stop", Usage(n, m, n + m, 0),
                    Timings(0.0, 0.0, 0.0, 0.0)))
                return
            if "hold" in text:
                await self.engine.release.wait()
            self.tokens.append(ord("o") + 1)
            yield Delta("o", [ord("o") + 1], [])
            if "fail-after-first" in text:
                await asyncio.sleep(0.01)
                raise EngineError("the model broke")
            self.tokens.append(ord("k") + 1)
            n = len(self.prompt_tokens)
            result = GenerationResult("ok", list(self.tokens), "stop", Usage(n, 2, n + 2, 0),
                                      Timings(0.0, 0.0, 0.0, 0.0))
            self.done = True
            yield Delta("k", [ord("k") + 1], [], "stop", result)
        finally:
            self.done = True
            self.engine.live.discard(self)


class ScriptedEngine:
    """The engine API the server uses, without a model. What a request generates depends on
    its prompt's text: "hold" waits until `release` is set, then answers "ok";
    "fail-after-first" sends one token, then fails; "bug-in-submit" raises a RuntimeError in
    submit (an internal error); anything else answers "ok" (two tokens), unless `reply` is set:
    then it answers reply(prompt text) one character at a time when that is not None (a
    recorded model output). Past `max_queue` requests beyond the one running, submit raises
    EngineBusy."""

    path = Path("/models/fake.gguf")
    n_ctx = 64
    n_vocab = 300
    parallel = 1
    kv_size = 64
    kv_type = "f16"
    max_queue = 4

    def __init__(self) -> None:
        self.tokenizer = _Tokenizer()
        self.chat_template = ChatTemplate("{% for m in messages %}{{ m['content'] }}{% endfor %}")
        self.release = asyncio.Event()
        self.live: set[ScriptedRequest] = set()
        self.cancelled: list[int] = []
        self.reply: Callable[[str], str | None] | None = None
        self.prompts: list[str] = []  # the text of every prompt submitted
        self._next_id = 1

    def tokenize(self, prompt: Any, add_special: bool = True, parse_special: bool = False
                 ) -> list[int]:
        return self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)

    vision = False  # takes no images (a subclass may)

    def submit(self, prompt_tokens: Sequence[int], params: SamplingParams | None = None, *,
               keep_tokens: Sequence[int] = (), dropped: Dropped | None = None,
               images: Sequence[Any] = ()) -> ScriptedRequest:
        text = "".join(chr(t - 1) for t in prompt_tokens)
        self.prompts.append(text)
        if "bug-in-submit" in text:
            raise RuntimeError("a bug in the backend")
        if len(self.live) >= self.parallel + self.max_queue:
            raise EngineBusy("the queue is full")
        request = ScriptedRequest(self, self._next_id, list(prompt_tokens))
        self._next_id += 1
        self.live.add(request)
        return request

    def cancel(self, request_id: int) -> None:
        for request in list(self.live):
            if request.id == request_id:
                request.cancel()

    def stats(self) -> EngineStats:
        return EngineStats(len(self.live), 0, 0.0, 0, 0, 0, 0, 0, 0)

    def close(self) -> None:
        pass


def scripted(max_queue: int = 4, loaded: threading.Event | None = None
             ) -> tuple[Callable[[], ScriptedEngine], ScriptedEngine]:
    """A make_engine for start_server and the engine it returns; with `loaded`, loading
    waits until the event is set."""
    engine = ScriptedEngine()
    engine.max_queue = max_queue

    def make() -> ScriptedEngine:
        if loaded is not None:
            loaded.wait()
        return engine

    return make, engine


def fake_config(**overrides: Any) -> ServerConfig:
    return ServerConfig(model="/models/fake.gguf", **overrides)
