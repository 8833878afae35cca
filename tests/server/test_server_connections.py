"""Connection hygiene, browser safety and the small contract points, on a scripted engine:
trickling connections are closed after header_timeout (or for newer ones past
--max-connections), bodies that never finish get a 408, idle keep-alive connections close; JSON
endpoints need application/json (415), foreign Host headers get a 403 (DNS rebinding); 503s
carry Retry-After, /v1/models shows no path, and a client hanging up mid-upload is one info
line."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from server_support import RunningServer, fake_config, scripted, serving, wait_until

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}


def assert_openai_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code, error
    return error


def port_of(server: RunningServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except BlockingIOError:
        return False


@pytest.fixture()
def hygienic() -> Iterator[RunningServer]:
    make, _ = scripted()
    with serving(fake_config(max_connections=100, header_timeout=0.5,
                             body_timeout=0.4, idle_timeout=0.3), make) as running:
        yield running


def test_trickling_connections_are_closed(hygienic: RunningServer) -> None:
    state = hygienic.server.server_state
    n_before = len(state.connections)
    tricklers = []
    start = time.monotonic()
    for _ in range(1000):
        sock = socket.create_connection(("127.0.0.1", port_of(hygienic)))
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaa")  # never ends
        sock.setblocking(False)
        tricklers.append(sock)
    try:
        wait_until(lambda: len(state.connections) >= 100, 5, "the server to accept 100")
        # Past --max-connections the longest idle connections are closed, not the newcomer
        # refused (tests/server/test_server_http_edge.py has the 503 and the load).
        assert httpx.get(hygienic.url + "/health", timeout=5).status_code == 200
        assert len(state.connections) <= 101
        # header_timeout (0.5 s), or closed for newer ones: every trickler is closed.
        wait_until(lambda: all(closed_by_server(s) for s in tricklers), 5,
                   "the server to close all 1000 trickling connections")
        elapsed = time.monotonic() - start
        wait_until(lambda: len(state.connections) <= n_before, 2, "no connection left open")
    finally:
        for sock in tricklers:
            sock.close()
    assert elapsed < 5, elapsed
    assert httpx.get(hygienic.url + "/health").status_code == 200


def test_a_body_that_never_finishes_is_a_408(hygienic: RunningServer) -> None:
    with socket.create_connection(("127.0.0.1", port_of(hygienic))) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"messa")
        sock.settimeout(5)
        start = time.monotonic()
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}}"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        elapsed = time.monotonic() - start
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b'"code":"request_timeout"' in answer and b"--body-timeout" in answer
    assert 0.3 < elapsed < 2.0, elapsed


def test_an_idle_keep_alive_connection_is_closed(hygienic: RunningServer) -> None:
    with socket.create_connection(("127.0.0.1", port_of(hygienic))) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        sock.settimeout(5)
        answer = b""
        while not answer.endswith(b'{"status":"ok"}'):  # headers and body may come apart
            answer += sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200 ")
        start = time.monotonic()
        assert sock.recv(4096) == b""  # the server closes it after idle_timeout (0.3 s)
        assert 0.2 < time.monotonic() - start < 2.0


# --- browser safety -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plain() -> Iterator[RunningServer]:
    make, _ = scripted(max_queue=0)
    with serving(fake_config(host_allow=["ember.lan"]), make) as running:
        yield running


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/jsonx"])
def test_json_endpoints_need_application_json(plain: RunningServer,
                                              content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    for path in ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"):
        response = httpx.post(plain.url + path, content=b'{"prompt": "Hi"}', headers=headers)
        error = assert_openai_error(response, 415, "unsupported_media_type")
        assert "application/json" in error["message"]
    for ok_type in ("application/json", "application/json; charset=utf-8", "Application/JSON"):
        response = httpx.post(plain.url + "/v1/chat/completions", json=CHAT,
                              headers={"content-type": ok_type})
        assert response.status_code == 200, response.text


@pytest.mark.parametrize(("host", "allowed"), [
    ("evil.example", False), ("evil.example:8080", False), ("127.0.0.1.evil.example", False),
    ("localhost.evil", False), ("127.0.0.1", True), ("127.0.0.1:8080", True), ("[::1]:8080", True),
    ("localhost", True), ("LOCALHOST:1", True), ("app.localhost", True), ("ember.lan", True),
    ("10.1.2.3", True),
])
def test_the_host_header_must_name_this_server(plain: RunningServer, host: str,
                                               allowed: bool) -> None:
    response = httpx.post(plain.url + "/v1/chat/completions", json=CHAT, headers={"host": host})
    if allowed:
        assert response.status_code == 200, response.text
    else:
        error = assert_openai_error(response, 403, "invalid_host")
        assert "--host-allow" in error["message"]


def test_other_origins_are_refused_by_default(plain: RunningServer) -> None:
    """No --cors-origins: another site's page gets a 403, preflight or not; loopback pages and
    the server's own origin (its chat page) are allowed."""
    preflight = httpx.options(plain.url + "/v1/chat/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert "access-control-allow-origin" not in preflight.headers
    assert_openai_error(preflight, 403, "origin_not_allowed")
    simple = httpx.get(plain.url + "/v1/models", headers={"Origin": "http://evil.example"})
    assert_openai_error(simple, 403, "origin_not_allowed")
    for origin in ("http://localhost:3000", "http://127.0.0.1:5173", "http://[::1]:8000",
                   plain.url):
        allowed = httpx.options(plain.url + "/v1/chat/completions", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization"})
        assert allowed.status_code == 200, (origin, allowed.text)
        assert allowed.headers["access-control-allow-origin"] == origin
        assert "POST" in allowed.headers["access-control-allow-methods"]
        assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
    for origin in ("http://localhost.evil.example", "http://127.0.0.1.evil.example", "null"):
        response = httpx.get(plain.url + "/v1/models", headers={"Origin": origin})
        assert response.status_code == 403, origin
    # Served on a LAN address, the page's own origin is that address.
    lan = {"Host": "192.168.1.5:8080"}
    same = httpx.get(plain.url + "/v1/models", headers={**lan, "Origin": "http://192.168.1.5:8080"})
    assert same.status_code == 200, same.text
    other = httpx.get(plain.url + "/v1/models", headers={**lan, "Origin": "http://192.168.1.6:8080"})
    assert other.status_code == 403


# --- the small ones -----------------------------------------------------------------------------

def test_models_show_the_name_not_the_path(plain: RunningServer) -> None:
    card = httpx.get(plain.base_url + "/models").json()["data"][0]
    assert card["id"] == "fake.gguf"
    assert card["meta"]["file"] == "fake.gguf"
    assert "/models" not in str(card)  # the directory of /models/fake.gguf


def test_a_client_hanging_up_mid_upload_is_one_info_line(plain: RunningServer,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with socket.create_connection(("127.0.0.1", port_of(plain))) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"mes")
        time.sleep(0.2)
    wait_until(lambda: any("disconnected" in r.getMessage() for r in caplog.records), 5,
               "the disconnect to be logged")
    time.sleep(0.1)
    ours = [r for r in caplog.records if r.name.startswith(("ember", "uvicorn"))]
    assert [(r.levelname, r.getMessage()) for r in ours] == [
        ("INFO", "POST /v1/chat/completions: the client disconnected before its request body "
                 "was complete")]
    assert not any(r.exc_info for r in caplog.records)


def test_connections_get_tcp_nodelay_whatever_the_socket() -> None:
    """A listening socket made without IPPROTO_TCP (as socket.socket() makes it) gets no
    TCP_NODELAY from asyncio; the server sets it, or every response body (and streamed token)
    would wait ~40 ms for a delayed ACK."""
    import statistics
    import threading

    from ember.server.run import make_server

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # proto 0
    sock.bind(("127.0.0.1", 0))
    server = make_server(fake_config(), scripted()[0], log_level="warning", access_log=False)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 10, "the server to start")
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with httpx.Client(base_url=url) as client:
            wait_until(lambda: client.get("/health").status_code == 200, 10, "the model")
            times = []
            for _ in range(20):
                start = time.perf_counter()
                client.get("/health")
                times.append(time.perf_counter() - start)
        assert statistics.median(times) < 0.02, times
    finally:
        server.should_exit = True
        thread.join(10)
