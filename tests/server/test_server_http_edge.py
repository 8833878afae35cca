"""The HTTP edge under faults, on a real uvicorn server over raw sockets: malformed requests
(bad chunk sizes, before and after an early answer, garbage request lines, huge or illegal
headers, bad Content-Length, truncated bodies) get a 4xx naming the fault, or a closed
connection, and never a 5xx or a traceback in the server's log; 1,000 idle and trickling
connections held open do not keep normal requests from being served; the 503 past
--max-connections comes only when every connection has a request in flight; and --max-queue
admits exactly parallel + max_queue requests when a crowd arrives at once (SmolLM2, the real
engine)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_support import RunningServer, fake_config, scripted, serving, wait_until

from ember.server.config import ServerConfig

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}
POST_CHAT = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
             b"Content-Type: application/json\r\n")


class LogRecords(logging.Handler):
    """Every record the server's loggers emit (uvicorn's do not reach the root logger)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def faults(self, records: list[logging.LogRecord]) -> list[str]:
        """The records that show a fault: an error, a traceback, h11's LocalProtocolError."""
        return [self.format(r) for r in records
                if r.exc_info or r.levelno >= logging.ERROR
                or "LocalProtocolError" in r.getMessage() or "Traceback" in r.getMessage()]


@pytest.fixture(scope="module")
def log() -> Iterator[LogRecords]:
    handler = LogRecords()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn")]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler
    for logger in loggers:
        logger.removeHandler(handler)


@pytest.fixture(scope="module")
def server(log: LogRecords) -> Iterator[RunningServer]:
    make, _ = scripted()
    with serving(fake_config(header_timeout=2, body_timeout=1), make) as running:
        yield running


@pytest.fixture(autouse=True)
def no_fault_logged(log: LogRecords) -> Iterator[None]:
    n_before = len(log.records)
    yield
    time.sleep(0.05)  # a callback's error is logged after the connection closed
    faults = log.faults(log.records[n_before:])
    assert not faults, "\n".join(faults)


def port_of(server: RunningServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


def exchange(server: RunningServer, *parts: bytes, pause: float = 0.1, wait: float = 3.0
             ) -> bytes:
    """Sends `parts` (pausing between them, so the server answers in between), then reads
    until the server closes the connection or `wait` seconds pass."""
    with socket.create_connection(("127.0.0.1", port_of(server))) as sock:
        for i, part in enumerate(parts):
            if i:
                time.sleep(pause)
            try:
                sock.sendall(part)
            except (BrokenPipeError, ConnectionResetError):
                break  # closed after its answer: what was read stands
        sock.settimeout(wait)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            received += b"<open>"
        except ConnectionResetError:
            received += b"<reset>"
        return received


def status_of(received: bytes) -> int:
    assert received.startswith(b"HTTP/1.1 "), received[:200]
    return int(received[9:12])


@pytest.mark.parametrize(("request_bytes", "reason"), [
    (POST_CHAT + b"Transfer-Encoding: chunked\r\n\r\nZZ\r\n{}\r\n0\r\n\r\n", b"illegal chunk header"),
    (POST_CHAT + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{\"\r\nZZ\r\n", b"illegal chunk header"),
    (b"GARBAGE\r\n\r\n", b"illegal request line"),
    (b"GET /\xff\xfe HTTP/1.1\r\nHost: localhost\r\n\r\n", b"illegal request line"),
    (b"GET /health HTTP/1.1\r\nHost: localhost\r\nBad Name: x\r\n\r\n", b"illegal header line"),
    (b"GET /health HTTP/1.1\r\nHost: localhost\r\nHost: evil\r\n\r\n", b"multiple Host"),
    (POST_CHAT + b"Content-Length: abc\r\n\r\n{}", b"bad Content-Length"),
    (POST_CHAT + b"Content-Length: -1\r\n\r\n", b"bad Content-Length"),
    (POST_CHAT + b"Transfer-Encoding: gzip\r\n\r\n{}", b"Transfer-Encoding"),
    (b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n",
     b"the request line and headers are larger than 16384 bytes"),
], ids=["bad-chunk-size", "bad-chunk-size-later", "garbage-line", "non-ascii-target",
        "illegal-header-name", "two-hosts", "bad-content-length", "negative-content-length",
        "unknown-transfer-coding", "huge-header"])
def test_malformed_http_is_a_4xx_naming_the_fault(server: RunningServer, request_bytes: bytes,
                                                  reason: bytes) -> None:
    received = exchange(server, request_bytes)
    assert status_of(received) == (431 if b"X-Big" in request_bytes else 400), received[:300]
    head, _, body = received.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head and b"connection: close" in head
    assert b'"code": "invalid_http"' in body and b"malformed HTTP request: " in body
    assert reason in body, body
    assert body.endswith(b"}}") or body.endswith(b"}}<reset>")  # then closed


@pytest.mark.parametrize(("head", "status"), [
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\n", 415),
    (b"POST /no/such/route HTTP/1.1\r\nHost: localhost\r\n", 404),
    (POST_CHAT + b"Origin: http://evil.example\r\n", 403),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: evil.example\r\n", 403),
], ids=["415", "404", "403-origin", "403-host"])
def test_a_bad_chunk_after_an_early_answer_only_closes(server: RunningServer, head: bytes,
                                                       status: int) -> None:
    """The app answers before reading the body; the body's next chunk size is garbage. uvicorn
    used to answer a second time there, which h11 refuses (LocalProtocolError in the log)."""
    received = exchange(server, head + b"Transfer-Encoding: chunked\r\n\r\n", b"ZZ\r\n{}\r\n")
    assert status_of(received) == status
    assert received.count(b"HTTP/1.1 ") == 1 and not received.endswith(b"<open>"), received


def test_truncated_and_stalled_bodies(server: RunningServer) -> None:
    # A body cut short by the client's half-close: nothing to answer, the connection closes.
    with socket.create_connection(("127.0.0.1", port_of(server))) as sock:
        sock.sendall(POST_CHAT + b"Content-Length: 100\r\n\r\n{\"mess")
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(3)
        assert sock.recv(65536) == b""
    # A chunked body that stops mid-chunk: a 408 after body_timeout (1 s here).
    received = exchange(server, POST_CHAT + b"Transfer-Encoding: chunked\r\n\r\n10\r\n{\"me")
    assert status_of(received) == 408 and b'"code":"request_timeout"' in received
    # A chunk size too large for anyone to send: the same.
    received = exchange(server, POST_CHAT + b"Transfer-Encoding: chunked\r\n\r\n"
                        b"FFFFFFFFFFFFFFFF\r\n{}")
    assert status_of(received) == 408


def test_odd_but_valid_requests_are_served(server: RunningServer) -> None:
    chat = b'{"messages":[{"role":"user","content":"Hi"}]}'
    chunked = (POST_CHAT + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x;ext=1\r\n" % len(chat)
               + chat + b"\r\n0\r\nX-Trailer: 1\r\n\r\n")
    for request_bytes in (chunked, POST_CHAT + b"Expect: 100-continue\r\nContent-Length: %d"
                          b"\r\n\r\n" % len(chat) + chat, b"GET /health HTTP/1.0\r\n\r\n"):
        received = exchange(server, request_bytes, wait=0.5)
        assert b"HTTP/1.1 200 OK\r\n" in received, received[:300]
        assert b'"content":"ok"' in received or b'{"status":"ok"}' in received


# --- many connections ---------------------------------------------------------------------------

def test_idle_and_trickling_connections_do_not_starve_requests(log: LogRecords) -> None:
    """1,000 held connections (half idle, half sending a header line now and then, as a
    slowloris client does) against --max-connections 512: the longest idle ones are closed
    as new ones arrive, so every normal request is served, and open sockets stay at the limit."""
    make, _ = scripted()
    with serving(fake_config(max_connections=512), make) as running:
        state = running.server.server_state
        held: list[socket.socket] = []

        def hold(n: int) -> None:
            for i in range(n):
                sock = socket.create_connection(("127.0.0.1", port_of(running)))
                if i % 2:
                    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")
                sock.setblocking(False)
                held.append(sock)

        try:
            hold(1000)
            wait_until(lambda: len(state.connections) >= 500, 10, "the server to accept them")
            statuses = []
            with httpx.Client(base_url=running.url, timeout=10) as http:
                for _ in range(20):
                    hold(25)  # more keep arriving
                    for sock in held[-200:]:
                        try:
                            sock.sendall(b"X-Slow: a\r\n")
                        except OSError:
                            pass  # closed by the server: it was the longest idle
                    statuses.append(http.post("/v1/chat/completions", json=CHAT,
                                              headers={"connection": "close"}).status_code)
            assert statuses == [200] * 20
            assert len(state.connections) <= 513
        finally:
            for sock in held:
                sock.close()


def test_the_limit_answers_503_only_when_every_connection_is_busy() -> None:
    make, engine = scripted(max_queue=8)
    with serving(fake_config(max_connections=3), make) as running:

        async def crowd() -> tuple[list[int], httpx.Response]:
            async with httpx.AsyncClient(base_url=running.url, timeout=10,
                                         limits=httpx.Limits(max_connections=10)) as http:
                held = [asyncio.create_task(http.post("/v1/completions", json={
                    "prompt": "hold", "max_tokens": 2})) for _ in range(3)]
                while len(engine.live) < 3:
                    await asyncio.sleep(0.01)
                async with httpx.AsyncClient(base_url=running.url, timeout=10) as other:
                    busy = await other.get("/health")
                engine.release.set()
                return [r.status_code for r in await asyncio.gather(*held)], busy

        held_statuses, busy = asyncio.run(crowd())
        assert held_statuses == [200] * 3
        assert busy.status_code == 503, busy.text
        error = busy.json()["error"]
        assert error["code"] == "too_many_connections" and "--max-connections" in error["message"]
        assert busy.headers["retry-after"] == "1" and busy.headers["connection"] == "close"
        assert httpx.get(running.url + "/health").status_code == 200


# --- the queue ----------------------------------------------------------------------------------

def test_a_crowd_gets_exactly_parallel_plus_max_queue_admitted(smollm2_path: Path) -> None:
    """24 chat clients at once, 4 slots and a queue of 8: 12 are served and 12 refused. The
    queue used to count the requests a long first step was admitting to slots as waiting, so
    more were refused (64 clients, 16 slots, queue 32: 31 refusals)."""
    config = ServerConfig(model=str(smollm2_path), parallel=4, max_queue=8, threads=1,
                          ctx_size=1024)
    with serving(config) as running:

        statuses: list[int] = []

        async def one(http: httpx.AsyncClient, i: int, answered: asyncio.Event) -> None:
            body = {"messages": [{"role": "user", "content": f"Count to {i}"}],
                    "max_tokens": 800, "stream": True}
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                statuses.append(response.status_code)
                if len(statuses) == 24:
                    answered.set()
                await answered.wait()  # a 200 keeps its slot until every client has its answer

        async def crowd() -> None:
            answered = asyncio.Event()
            limits = httpx.Limits(max_connections=64)
            async with httpx.AsyncClient(base_url=running.url, timeout=60,
                                         limits=limits) as http:
                await asyncio.wait_for(
                    asyncio.gather(*(one(http, i, answered) for i in range(24))), 60)

        asyncio.run(crowd())
    assert sorted(statuses) == [200] * 12 + [503] * 12, statuses
