"""Several models on one server (server/models.py), on real uvicorn servers with tiny random
models converted by ember: each model answers with its own tokens (those the model gives alone,
in-process), /v1/models lists them with their status, a name only selects (unknown names and
paths are a 404), models load on first use without stalling the loaded ones, unload after
--keep-alive and, under --max-memory, least recently used first."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import gguf
import httpx
import pytest
from checkpoints import N_VOCAB, save_checkpoint, tokens_for_test
from server_support import RunningServer, sample, serving, wait_until
from tiny_models import make_model
from typer.testing import CliRunner

from ember.cli import app
from ember.convert import convert
from ember.engine import Engine
from ember.sampling import SamplingParams
from ember.server.config import ServerConfig
from ember.server.models import (
    find_models,
    kv_bytes_per_token,
    kv_tokens,
    parse_bytes,
    parse_keep_alive,
)

PROMPT = tokens_for_test(6, seed=7)
N_PREDICT = 6
SIZES = {"threads": 1, "parallel": 1, "ctx_size": 128}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """alpha, beta, gamma (tiny llamas of different seeds), big (a 115 MB one, slower to load),
    and a projector file (general.type mmproj) that is no model."""
    out = tmp_path_factory.mktemp("models")
    work = tmp_path_factory.mktemp("checkpoints")
    for name, seed, sizes in (("alpha", 1, {}), ("beta", 2, {}), ("gamma", 3, {}),
                              ("big", 4, {"hidden_size": 1024, "intermediate_size": 3072})):
        folder = save_checkpoint(make_model("llama", vocab_size=N_VOCAB, seed=seed, **sizes),
                                 work / name)
        convert(folder, out / f"{name}.gguf", "f32", progress=False)
    w = gguf.GGUFWriter(str(out / "mmproj-alpha.gguf"), "clip")
    w.add_type("mmproj")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return out


def alone(path: Path) -> list[int]:
    """The greedy tokens `path` gives for PROMPT on its own, in-process."""
    with Engine(path, n_ctx=128, parallel=1, n_threads=1) as engine:
        return engine.submit(PROMPT, SamplingParams(temperature=0, max_tokens=N_PREDICT)
                             ).result().tokens


def complete(server: RunningServer, model: object, timeout: float = 60) -> httpx.Response:
    return httpx.post(server.url + "/completion", timeout=timeout, json={
        "model": model, "prompt": PROMPT, "n_predict": N_PREDICT, "temperature": 0,
        "return_tokens": True})


def tokens_of(server: RunningServer, model: str) -> list[int]:
    r = complete(server, model)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def statuses(server: RunningServer, client: httpx.Client | None = None) -> dict[str, str]:
    r = (client or httpx).get(server.url + "/v1/models")
    assert r.status_code == 200, r.text
    return {m["id"]: m["status"]["value"] for m in r.json()["data"]}


def start_loading(server: RunningServer, name: str) -> tuple[threading.Thread, list]:
    """Sends a request for `name` from a thread and returns once the server says it is loading
    (polled on a kept-alive connection: big loads for about a second, the poll takes ms)."""
    answers: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answers.append(complete(server, name)))
    with httpx.Client() as client:
        assert statuses(server, client)[name] == "unloaded"
        thread.start()
        wait_until(lambda: statuses(server, client)[name] != "unloaded", 10, f"{name} to load")
        assert statuses(server, client)[name] == "loading", "loaded before a poll saw it loading"
    return thread, answers


def footprint(path: Path) -> int:
    """What the server should count for `path`: file size + KV bytes of the engine's cache."""
    options = ServerConfig(**SIZES).engine_options()
    per_token = kv_bytes_per_token(path, options.kv_type)
    return path.stat().st_size + kv_tokens(path, options, per_token) * per_token


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    with serving(ServerConfig(models_dir=str(model_dir), **SIZES)) as running:
        yield running


def test_each_model_answers_with_its_own_tokens(server: RunningServer, model_dir: Path) -> None:
    assert statuses(server) == {"alpha": "unloaded", "beta": "unloaded", "big": "unloaded",
                                "gamma": "unloaded"}  # the projector is no model
    alpha, beta = tokens_of(server, "alpha"), tokens_of(server, "beta")
    assert alpha == alone(model_dir / "alpha.gguf")
    assert beta == alone(model_dir / "beta.gguf")
    assert alpha != beta
    assert tokens_of(server, "alpha.gguf") == alpha  # the file name names it too
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": "beta", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "beta", r.text
    listed = statuses(server)
    assert listed["alpha"] == listed["beta"] == "loaded" and listed["gamma"] == "unloaded"
    card = httpx.get(server.url + "/v1/models/alpha").json()
    assert card["id"] == "alpha" and card["memory_bytes"] == footprint(model_dir / "alpha.gguf")
    assert httpx.get(server.url + "/models").json() == httpx.get(server.url + "/v1/models").json()


@pytest.mark.parametrize("name", ["nope", "../../etc/passwd", "/etc/passwd", "models/alpha.gguf",
                                  "ALPHA", "alpha.gguf/", ""])
def test_an_unknown_name_is_a_404_listing_the_models(server: RunningServer, name: str) -> None:
    r = complete(server, name)
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "'alpha', 'beta', 'big', 'gamma'" in error["message"]


def test_paths_never_select(server: RunningServer, model_dir: Path) -> None:
    for name in (str(model_dir / "alpha.gguf"), f"{model_dir.name}/alpha.gguf", "./alpha",
                 "../alpha.gguf"):
        r = complete(server, name)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", name


def test_model_missing_or_not_a_string(server: RunningServer) -> None:
    r = httpx.post(server.url + "/completion", json={"prompt": PROMPT, "n_predict": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
    assert "several models" in r.json()["error"]["message"]
    assert complete(server, 7).status_code == 400
    r = httpx.get(server.url + "/props")
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    props = httpx.get(server.url + "/props", params={"model": "alpha"})
    assert props.status_code == 200 and props.json()["model_alias"] == "alpha"
    assert httpx.get(server.url + "/slots", params={"model": "nope"}).status_code == 404


def test_health_and_metrics(server: RunningServer) -> None:
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    tokens_of(server, "alpha")
    r = httpx.get(server.url + "/health", params={"model": "alpha"})
    assert r.json() == {"status": "ok", "model": "alpha", "state": "loaded"}
    assert httpx.get(server.url + "/health", params={"model": "x"}).status_code == 404
    assert sample(server.url, "ember_model_loaded", 'model="alpha"') == 1
    assert sample(server.url, "ember_model_loaded", 'model="gamma"') == 0


def test_loading_never_blocks_a_loaded_model(server: RunningServer) -> None:
    """While big loads (115 MB: about a second), alpha answers: requests to alpha
    start and end while /v1/models still says big is loading. (A load that held the event loop
    or the GIL would let none through until big had loaded.)"""
    tokens_of(server, "alpha")
    body = {"model": "alpha", "prompt": PROMPT, "n_predict": 2, "temperature": 0}
    n_answered_while_loading = 0
    with httpx.Client(base_url=server.url, timeout=60) as client:
        client.post("/completion", json=body)  # the connection, opened before the window
        loader, big = start_loading(server, "big")
        while True:
            assert client.post("/completion", json=body).status_code == 200
            if statuses(server, client)["big"] != "loading":
                break
            n_answered_while_loading += 1
    loader.join(60)
    assert n_answered_while_loading >= 1, "no request to alpha completed while big loaded"
    assert big[0].status_code == 200 and statuses(server)["big"] == "loaded"


def header_only(path: Path) -> Path:
    """A GGUF of metadata and no tensors: a file `find_models` takes, no model to load."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


def test_keep_alive_unloads_and_reloads(model_dir: Path, tmp_path: Path) -> None:
    broken = header_only(tmp_path / "broken.gguf")
    config = ServerConfig(models=[str(model_dir / "alpha.gguf"), str(model_dir / "beta.gguf"),
                                  str(broken)], keep_alive=0.5, **SIZES)
    with serving(config) as s:
        for _ in range(2):  # a failed load is reported, and tried again on the next request
            r = complete(s, "broken")
            assert r.status_code == 503 and r.json()["error"]["code"] == "model_error", r.text
            assert "loading the model 'broken' failed" in r.json()["error"]["message"]
        card = httpx.get(s.url + "/v1/models/broken").json()["status"]
        assert card["value"] == "unloaded" and card["failed"] is True
        first = tokens_of(s, "alpha")
        assert statuses(s)["alpha"] == "loaded"
        wait_until(lambda: statuses(s)["alpha"] == "unloaded", 10, "alpha to unload")
        assert sample(s.url, "ember_model_loaded", 'model="alpha"') == 0
        assert tokens_of(s, "alpha") == first  # loaded again on use
        assert statuses(s)["alpha"] == "loaded"


def test_max_memory_unloads_the_least_recently_used(model_dir: Path) -> None:
    small = footprint(model_dir / "alpha.gguf")
    assert footprint(model_dir / "beta.gguf") == footprint(model_dir / "gamma.gguf") == small
    names = ("alpha", "beta", "gamma", "big")
    config = ServerConfig(models=[str(model_dir / f"{n}.gguf") for n in names],
                          max_memory=2 * small + small // 2, **SIZES)  # two fit, not three
    with serving(config) as s:
        tokens_of(s, "alpha")
        tokens_of(s, "beta")
        tokens_of(s, "alpha")  # beta is now the least recently used
        tokens_of(s, "gamma")
        assert statuses(s) == {"alpha": "loaded", "beta": "unloaded", "gamma": "loaded",
                               "big": "unloaded"}
        tokens_of(s, "beta")  # alpha's turn
        assert statuses(s) == {"alpha": "unloaded", "beta": "loaded", "gamma": "loaded",
                               "big": "unloaded"}
        r = complete(s, "big")  # can never fit
        assert r.status_code == 507, r.text
        error = r.json()["error"]
        assert error["code"] == "insufficient_memory" and "--max-memory" in error["message"]
        assert statuses(s)["gamma"] == "loaded"  # nothing was unloaded for it


def test_max_memory_held_by_a_loading_model_is_a_503(model_dir: Path) -> None:
    small, large = footprint(model_dir / "alpha.gguf"), footprint(model_dir / "big.gguf")
    config = ServerConfig(models=[str(model_dir / "alpha.gguf"), str(model_dir / "big.gguf")],
                          max_memory=large + small // 2, **SIZES)
    with serving(config) as s:
        loader, big = start_loading(s, "big")
        r = complete(s, "alpha")
        loader.join(60)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "insufficient_memory"
        assert "'big'" in r.json()["error"]["message"]
        assert big[0].status_code == 200
        assert tokens_of(s, "alpha")  # big is idle now: unloaded to make room
        assert statuses(s) == {"alpha": "loaded", "big": "unloaded"}


def test_one_model_answers_to_any_name(model_dir: Path) -> None:
    with serving(ServerConfig(model=str(model_dir / "alpha.gguf"), **SIZES)) as s:
        assert tokens_of(s, "gpt-4o") == tokens_of(s, "../../etc/passwd") == \
            alone(model_dir / "alpha.gguf")
        assert [m["id"] for m in httpx.get(s.url + "/v1/models").json()["data"]] == ["alpha.gguf"]


def test_find_models_names_and_shards(tmp_path: Path, model_dir: Path) -> None:
    """A split model's shards are one model, named by their prefix; two files of one name are
    refused at start-up."""
    for name in ("m-00002-of-00002.gguf", "m-00001-of-00002.gguf", "solo.gguf", "alpha.gguf"):
        header_only(tmp_path / name)
    found = find_models([], tmp_path)
    assert [(m.name, [f.name for f in m.files]) for m in found] == [
        ("alpha", ["alpha.gguf"]), ("m", ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]),
        ("solo", ["solo.gguf"])]
    with pytest.raises(ValueError, match="two models are named 'alpha'"):
        find_models([model_dir / "alpha.gguf"], tmp_path)


def test_durations_and_sizes() -> None:
    assert parse_keep_alive("5m") == 300 and parse_keep_alive("30s") == 30
    assert parse_keep_alive("1h30m") == 5400 and parse_keep_alive("250ms") == 0.25
    assert parse_keep_alive("0") == 0 and parse_keep_alive("45") == 45
    assert parse_keep_alive("-1") == parse_keep_alive("-5m") == float("inf")
    for bad in ("5 minutes", "m", "", "1x"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_keep_alive(bad)
    assert parse_bytes("8G") == 8 << 30 and parse_bytes("512M") == 512 << 20
    assert parse_bytes("1.5GiB") == 3 << 29 and parse_bytes("100") == 100
    for bad in ("8X", "-1G", "0", "G"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_cli_refuses_bad_values_before_listening(tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(app, ["serve", "--max-memory", "lots", "--keep-alive", "5m"])
    assert out.exit_code == 2 and "'lots' is not a size" in out.output, out.output
    out = runner.invoke(app, ["serve", "--keep-alive", "5 minutes"])
    assert out.exit_code == 2 and "is not a duration" in out.output, out.output
    out = runner.invoke(app, ["serve", "--models-dir", str(tmp_path / "none")])
    assert isinstance(out.exception, ValueError)  # ember.cli.main: one line, exit 1
    assert "no such directory" in str(out.exception)
    header_only(tmp_path / "alpha.gguf")
    out = runner.invoke(app, ["serve", str(tmp_path / "alpha.gguf"), "--models-dir",
                              str(tmp_path), "--alias", "x"])
    assert isinstance(out.exception, ValueError) and "--alias" in str(out.exception)
