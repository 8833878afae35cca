"""CORS as a browser drives it, on a real server with a scripted engine: the preflight (OPTIONS
with Origin, Access-Control-Request-Method and -Headers) and then the actual request, on every
kind of route (OpenAI's, llama-server's unprefixed ones, Anthropic's, /health, an unknown
path), for each --cors-origins value llama-server's users give: none (loopback pages and the
server's own page only), `localhost`, `*`, and a list of origins; with an API key the preflight
needs none, and errors carry the CORS headers so the page can read them."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from server_support import RunningServer, fake_config, scripted, serving

from ember.server.config import ServerConfig

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}
PROMPT = {"prompt": "Hi", "max_tokens": 2}
# (method, path, body) of the actual request after the preflight.
ROUTES = [
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/chat/completions", CHAT),
    ("POST", "/v1/completions", PROMPT),
    ("POST", "/completions", PROMPT),
    ("POST", "/completion", PROMPT),
    ("POST", "/v1/embeddings", {"input": "Hi"}),
    ("POST", "/v1/messages", {"model": "m", "max_tokens": 2, **CHAT}),
    ("POST", "/tokenize", {"content": "Hi"}),
    ("GET", "/health", None),
    ("GET", "/v1/models", None),
    ("GET", "/props", None),
    ("GET", "/no/such/route", None),
]
LOOPBACK = ["http://localhost:3000", "http://127.0.0.1:5173", "http://[::1]:8000",
            "https://localhost"]
SITES = ["http://a.example", "https://b.example:8443", "https://evil.example", "null"]
ASKED_HEADERS = "content-type, authorization, x-api-key"

# --cors-origins -> the web sites (besides loopback pages) it allows.
POLICIES = {
    "default": ([], []),
    "localhost": (["localhost"], []),
    "any": (["*"], SITES),
    "list": (["http://a.example", "https://B.example:8443/"],
             ["http://a.example", "https://b.example:8443"]),
}


@pytest.fixture(scope="module", params=sorted(POLICIES))
def policy(request: pytest.FixtureRequest) -> Iterator[tuple[RunningServer, list[str]]]:
    values, sites = POLICIES[request.param]
    make, _ = scripted()
    with serving(fake_config(cors_origins=values), make) as running:
        yield running, sites


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    """One kept-alive connection for all the requests (a new one each is most of the time)."""
    with httpx.Client(timeout=30) as client:
        yield client


def preflight(http: httpx.Client, server: RunningServer, method: str, path: str, origin: str
              ) -> httpx.Response:
    return http.options(server.url + path, headers={
        "Origin": origin, "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": ASKED_HEADERS})


def actual(http: httpx.Client, server: RunningServer, method: str, path: str, body: object,
           headers: dict[str, str]) -> httpx.Response:
    return http.request(method, server.url + path, json=body, headers=headers)


def assert_cors_answer(response: httpx.Response, origin: str) -> None:
    assert response.headers["access-control-allow-origin"] == origin
    assert response.headers["access-control-allow-credentials"] == "true"
    assert "Origin" in [v.strip() for v in response.headers["vary"].split(",")]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[p for _, p, _ in ROUTES])
def test_every_route_answers_the_preflight_sequence_alike(
        http: httpx.Client, policy: tuple[RunningServer, list[str]], method: str, path: str,
        body: object) -> None:
    server, sites = policy
    plain = actual(http, server, method, path, body, {})  # no Origin: curl, SDKs
    for origin in [*LOOPBACK, server.url, *SITES]:
        allowed = origin in LOOPBACK or origin == server.url or origin in sites
        answer = preflight(http, server, method, path, origin)
        request = actual(http, server, method, path, body, {"Origin": origin})
        if not allowed:
            for response in (answer, request):
                assert response.status_code == 403, (origin, response.text)
                assert response.json()["error"]["code"] == "origin_not_allowed"
                assert "--cors-origins" in response.json()["error"]["message"]
                assert not any(k.startswith("access-control-") for k in response.headers)
            continue
        assert answer.status_code == 200, (origin, answer.text)
        assert_cors_answer(answer, origin)
        assert answer.headers["access-control-allow-methods"] == "GET, POST, OPTIONS"
        assert answer.headers["access-control-allow-headers"] == ASKED_HEADERS
        assert answer.headers["access-control-max-age"] == "600"
        # The actual request: what it gets without an Origin, with the CORS headers.
        assert request.status_code == plain.status_code, (origin, request.text)
        assert request.content == plain.content or request.status_code == 200
        assert_cors_answer(request, origin)
        assert "access-control-allow-methods" not in request.headers


def test_the_preflight_needs_no_api_key_and_errors_are_readable(http: httpx.Client) -> None:
    make, _ = scripted()
    origin = "http://127.0.0.1:3000"
    with serving(fake_config(api_key="k3y"), make) as server:
        answer = preflight(http, server, "POST", "/v1/chat/completions", origin)
        assert answer.status_code == 200, answer.text
        assert_cors_answer(answer, origin)
        refused = actual(http, server, "POST", "/v1/chat/completions", CHAT, {"Origin": origin})
        assert refused.status_code == 401
        assert_cors_answer(refused, origin)  # the page can read why
        ok = actual(http, server, "POST", "/v1/chat/completions", CHAT,
                    {"Origin": origin, "Authorization": "Bearer k3y"})
        assert ok.status_code == 200, ok.text
        assert_cors_answer(ok, origin)
        assert ok.json()["choices"][0]["message"]["content"] == "ok"


@pytest.mark.parametrize("value", ["example.com", "localhost:3000", "http://a.example/app",
                                   "*.example.com"])
def test_a_value_that_is_no_origin_is_refused_at_start(value: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"cors_origins: '{value}' is not an origin")):
        ServerConfig(model="/models/fake.gguf", cors_origins=[value])
