"""Helpers for the server tests (no tests here): a real uvicorn server on a free loopback port in
a thread, and a scripted GenerationBackend without a model for the HTTP layer's error paths."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from ember.generate import Usage
from ember.server.backend import (
    BackendStats,
    GenerationEvent,
    GenerationFailed,
    GenerationRequest,
    GenerationStream,
    Health,
    SlotInfo,
    Unavailable,
)
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
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def wait_healthy(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url}/health did not answer 200 within {timeout} s")


def sample(url: str, name: str, labels: str = "") -> float:
    """The value of one Prometheus sample at url/metrics (0 when absent)."""
    key = f"{name}{{{labels}}}" if labels else name
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.split(" ")[0] == key:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_until(condition: Any, timeout: float, what: str) -> None:
    """Polls condition() until it holds; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def start_server(config: ServerConfig, backend: Any = None, wait_ready: bool = True
                 ) -> RunningServer:
    """Runs the app under uvicorn in a thread, listening on 127.0.0.1 at a free port."""
    sock = free_socket()
    port = sock.getsockname()[1]
    server = make_server(config, backend, log_level="warning", access_log=False)
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


class ScriptedBackend:
    """A GenerationBackend without a model. Tokens are characters (id = code point % 256 + 1);
    what a request generates depends on its prompt's text:
    "hold" waits until `release` is set, then answers "ok"; "fail-after-first" sends one token,
    then fails; "bug-in-submit" raises a RuntimeError in submit (an internal error); anything
    else answers "ok" (two tokens)."""

    model_path = "/models/fake.gguf"
    n_ctx = 64
    n_vocab = 300
    n_slots = 1

    def __init__(self, max_queue: int = 4, loaded: bool = True) -> None:
        self.max_queue = max_queue
        self.load_done = threading.Event()
        if loaded:
            self.load_done.set()
        self.release = asyncio.Event()
        self._health = Health("loading", "the model is loading")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._active: list[GenerationStream] = []
        self._accepting = True
        self.cancelled: list[str] = []

    def load(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.load_done.wait()
        self._health = Health("ok")

    def health(self) -> Health:
        return self._health

    async def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return [ord(c) % 256 + 1 for c in text]

    async def detokenize(self, tokens: Sequence[int]) -> str:
        return "".join(chr(t - 1) for t in tokens)

    def token_piece(self, token: int) -> bytes:
        return chr(token - 1).encode()

    async def encode_chat(self, messages: Sequence[Any]) -> list[int]:
        return await self.tokenize("".join(m["content"] for m in messages), True, True)

    def submit(self, requests: Sequence[GenerationRequest]) -> list[GenerationStream]:
        if not self._accepting:
            raise Unavailable("the server is shutting down", "shutting_down")
        if len(self._active) + len(requests) > self.n_slots + self.max_queue:
            raise Unavailable("the queue is full", "queue_full")
        assert self._loop is not None
        streams = []
        for request in requests:
            text = "".join(chr(t - 1) for t in request.prompt_tokens)
            if "bug-in-submit" in text:
                raise RuntimeError("a bug in the backend")
            stream = GenerationStream(request.request_id, self._loop, self._on_cancel)
            self._active.append(stream)
            self._loop.create_task(self._run(stream, text, len(request.prompt_tokens)))
            streams.append(stream)
        return streams

    def _on_cancel(self, stream: GenerationStream) -> None:
        self.cancelled.append(stream.request_id)

    async def _run(self, stream: GenerationStream, text: str, n_prompt: int) -> None:
        try:
            if "hold" in text:
                await self.release.wait()
            stream.put(GenerationEvent("o", [ord("o") + 1]))
            if "fail-after-first" in text:
                await asyncio.sleep(0.01)
                stream.fail(GenerationFailed("generation failed: the model broke"))
                return
            stream.put(GenerationEvent("k", [ord("k") + 1], finish_reason="stop",
                                       usage=Usage(n_prompt, 2, n_prompt + 2, 0)))
        finally:
            self._active.remove(stream)

    def slots(self) -> list[SlotInfo]:
        return []

    def stats(self) -> BackendStats:
        return BackendStats(len(self._active), 0, 0.0)

    def stop_accepting(self) -> None:
        self._accepting = False

    def cancel_all(self, reason: str) -> None:
        for stream in list(self._active):
            stream.fail(Unavailable(reason, "shutting_down"))

    def close(self, timeout: float) -> None:
        pass


def fake_config(**overrides: Any) -> ServerConfig:
    return ServerConfig(model="/models/fake.gguf", **overrides)
