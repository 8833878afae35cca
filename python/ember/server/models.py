"""The models one server serves (ModelRegistry): each a name over a GGUF file, loaded on first
use in a worker thread, unloaded after --keep-alive idle or when --max-memory needs the room.

Names are llama-server's (--models-dir) and Ollama's: the file's name without ".gguf"
(`qwen3-0.6b.Q4_K_M.gguf` is `qwen3-0.6b.Q4_K_M`); a split model is named by its shards' prefix
(`big-00001-of-00003.gguf` ... is `big`). A request may also give the file name with ".gguf".
A name only ever selects from the files the server was started with: `resolve` is a dict
lookup, never a path. With one model served any name selects it (llama-server's single-model
behaviour), so clients that send a placeholder such as "gpt-4o" keep working.

Memory: a model's footprint is its weights' file size plus its KV cache (estimated from the
file's metadata before it loads, the engine's own KV size once loaded). Before a load, the
least recently used idle models are unloaded until the new one fits under --max-memory; a
model with a request running (or being prepared) is never unloaded.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import math
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ember import _core
from ember.chat.template import ChatTemplate
from ember.embeddings import Embedder
from ember.engine import Engine
from ember.options import EngineOptions
from ember.server.config import ServerConfig
from ember.server.errors import APIError, bad_request
from ember.server.fim import FimTokens
from ember.server.prompt_bound import PromptBound
from ember.server.scoring import PromptScorer
from ember.server.slots import Slots

log = logging.getLogger("ember.server")

_SHARD = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_BYTE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _return_freed_memory() -> None:
    """Hands the heap's free pages back to the system (glibc keeps what a closed engine's
    threads freed in their arenas, so the process would stay as large as with the model)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
            pass


def parse_keep_alive(text: str) -> float:
    """Seconds from Ollama's keep_alive syntax: a Go duration ("5m", "30s", "1h30m", "250ms"),
    or a bare number of seconds; any negative value (e.g. "-1") is math.inf (never unload),
    0 unloads as soon as the model is idle."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        sign, body = (-1.0, value[1:]) if value.startswith("-") else (1.0, value)
        parts = _DURATION_PART.findall(body)
        if not body or "".join(n + u for n, u in parts) != body:
            raise ValueError(f"{text!r} is not a duration: give seconds (300), a duration such as "
                             "5m, 30s or 1h30m, or -1 (never unload)") from None
        seconds = sign * sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if math.isnan(seconds):
        raise ValueError(f"{text!r} is not a duration")
    return math.inf if seconds < 0 else seconds


def parse_bytes(text: str) -> int:
    """Bytes from "8G", "512M", "1.5G", "8GiB", "8GB" or a plain number (K, M, G and T are
    binary: 1 G = 2^30 bytes)."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    number, suffix = (value[:-1], value[-1]) if value[-1:] in _BYTE_SUFFIXES else (value, "")
    try:
        n_bytes = float(number) * _BYTE_SUFFIXES[suffix]
    except ValueError:
        raise ValueError(f"{text!r} is not a size: give bytes, or a number with K, M, G or T "
                         "(8G, 512M)") from None
    if not n_bytes > 0 or math.isinf(n_bytes):
        raise ValueError(f"{text!r}: the size must be > 0")
    return int(n_bytes)


def format_bytes(n_bytes: int) -> str:
    return f"{n_bytes / (1 << 20):.1f} MiB" if n_bytes < 1 << 30 else f"{n_bytes / (1 << 30):.2f} GiB"


@dataclass
class ModelFile:
    """One servable model: its name and files (a split model's shards, the first first)."""

    name: str
    files: list[Path]

    @property
    def path(self) -> Path | None:
        """The file the engine opens; None: the demo model (one model served, no file given)."""
        return self.files[0] if self.files else None

    @property
    def file_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.files if f.is_file())


def model_name(path: Path) -> str:
    """A file's model name: its file name without ".gguf" (a shard: without -0000i-of-0000n)."""
    shard = _SHARD.match(path.name)
    if shard is not None:
        return shard["prefix"]
    return path.name[:-5] if path.name.endswith(".gguf") else path.name


def _is_model(path: Path) -> bool:
    """False for a GGUF that is not a model (general.type "mmproj", "adapter", ...)."""
    kind = _core.GGUFFile(str(path)).metadata.get("general.type", "model")
    return kind == "model"


def find_models(paths: list[Path], models_dir: Path | None) -> list[ModelFile]:
    """The models of `paths` (files given one by one) and of every .gguf in `models_dir` (not
    its subfolders), in that order; a split model's shards are one model, projector (mmproj)
    and adapter files are left out. ValueError for two models of one name."""
    candidates = list(paths)
    if models_dir is not None:
        if not models_dir.is_dir():
            raise ValueError(f"--models-dir {models_dir}: no such directory")
        found = sorted(p for p in models_dir.iterdir() if p.name.endswith(".gguf") and p.is_file())
        candidates += [p for p in found if _is_model(p)]
        if not found:
            raise ValueError(f"--models-dir {models_dir} holds no .gguf file")
    out: dict[str, ModelFile] = {}
    for path in candidates:
        name, shard = model_name(path), _SHARD.match(path.name)
        model = out.get(name)
        if model is not None and not (shard and model.path.parent == path.parent
                                      and _SHARD.match(model.path.name)):
            if model.path.resolve() == path.resolve():
                continue
            raise ValueError(f"two models are named '{name}': {model.path} and {path} (a model is "
                             "named by its file name; rename one)")
        if model is None:
            out[name] = model = ModelFile(name, [])
        if path not in model.files:
            model.files.append(path)
    for model in out.values():
        model.files.sort(key=lambda p: p.name)
    return list(out.values())


def served_models(config: ServerConfig) -> list[ModelFile]:
    """The models `config` serves: its model (None: the demo model, found at load), its other
    model files, then those of its models_dir."""
    if not config.several_models:
        files = [Path(config.model)] if config.model is not None else []
        return [ModelFile(model_name(files[0]) if files else "ember", files)]
    paths = [Path(p) for p in ([config.model] if config.model else []) + config.models]
    for path in paths:
        if not path.is_file():
            raise ValueError(f"{path}: no such model file")
    models = find_models(paths, Path(config.models_dir) if config.models_dir else None)
    if not models:
        raise ValueError(f"--models-dir {config.models_dir} holds no model (only projector or "
                         "adapter files)")
    return models


def kv_bytes_per_token(path: Path, kv_type: str) -> int:
    """Bytes one token of KV cache takes over all layers (K and V), from the file's metadata,
    as the engine sizes it (PagedKVCache::bytes_per_token); 0 when the file does not say."""
    meta = _core.GGUFFile(str(path)).metadata
    arch = meta.get("general.architecture", "")
    n_layer = meta.get(f"{arch}.block_count", 0)
    n_head = meta.get(f"{arch}.attention.head_count", 0)
    n_head_kv = meta.get(f"{arch}.attention.head_count_kv", n_head)
    if isinstance(n_head, list):
        n_head = max(n_head, default=0)
    if isinstance(n_head_kv, list):  # per layer (hybrid models): the largest bounds it
        n_head_kv = max(n_head_kv, default=0)
    if not n_head:
        return 0
    head_dim = meta.get(f"{arch}.attention.key_length",
                        meta.get(f"{arch}.embedding_length", 0) // n_head)
    n_kv_dim = n_head_kv * head_dim
    row_bytes = n_kv_dim * 2 if kv_type == "f16" else n_kv_dim // 32 * 34
    return 2 * n_layer * row_bytes


def kv_tokens(path: Path, options: EngineOptions, bytes_per_token: int) -> int:
    """The KV cache's tokens the engine will allocate for `path` (model_engine_config's rule:
    kv_size, else n_ctx x parallel within the default byte budget, at least n_ctx)."""
    if options.kv_size is not None:
        return options.kv_size
    meta = _core.GGUFFile(str(path)).metadata
    n_ctx_train = meta.get(f"{meta.get('general.architecture', '')}.context_length",
                           EngineOptions.default_max_ctx)
    n_ctx = options.n_ctx or min(n_ctx_train, EngineOptions.default_max_ctx)
    budget = options.kv_bytes or EngineOptions.default_kv_bytes
    return max(n_ctx, min(n_ctx * options.parallel, budget // max(1, bytes_per_token)))


@dataclass
class LoadedModel:
    """One loaded model: what the handlers read of it (context.py hands it out per request)."""

    path: Path
    engine: Engine | None                 # None: an encoder, which only embeds
    template: ChatTemplate | None = None
    bound: PromptBound | None = None      # the bounded-cost context check
    fim: FimTokens | None = None          # the model's infill tokens, if it has them
    embedder: Embedder | None = None      # --embedding: an encoder's, or a decoder's beside it
    slots: Slots = field(default_factory=lambda: Slots(1))
    scorer: PromptScorer | None = None    # echo + logprobs; made on first use

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


class ModelEntry:
    """A served model and its state: "unloaded", "loading" or "loaded"."""

    def __init__(self, model: ModelFile) -> None:
        self.name = model.name
        self.model = model
        # Weights + KV cache: estimated before its first load (when --max-memory asks), the
        # loaded engine's figure once loaded.
        self.footprint_bytes: int | None = None
        self.loaded: LoadedModel | None = None
        self.loading: asyncio.Future[LoadedModel] | None = None
        self.error: str | None = None          # why the last load failed
        self.n_active = 0                      # requests that hold it (acquire .. release)
        self.last_used = time.monotonic()

    @property
    def status(self) -> str:
        return "loaded" if self.loaded else "loading" if self.loading else "unloaded"

    @property
    def busy(self) -> bool:
        """A request holds it or runs on its engine: never unloaded then."""
        return self.n_active > 0 or (self.loaded is not None and bool(self.loaded.slots.live))

    def card(self) -> dict[str, Any]:
        """Its status as /v1/models shows it (llama-server's router `status` object)."""
        status: dict[str, Any] = {"value": self.status}
        if self.error is not None and self.loaded is None:
            status["failed"], status["error"] = True, self.error
        return status


class ModelRegistry:
    """Every model the server was started with, by name, and their loading and unloading.
    Runs on the event loop (not thread-safe): only `load` runs in a worker thread."""

    def __init__(self, models: list[ModelFile], load: Callable[[Path | None], LoadedModel],
                 options: Callable[[], EngineOptions], keep_alive: float,
                 max_memory: int | None) -> None:
        self._load = load
        self._options = options  # the engine's options (made when needed: they are C++ objects)
        self.keep_alive = keep_alive
        self.max_memory = max_memory
        self.entries = [ModelEntry(m) for m in models]
        self._by_name: dict[str, ModelEntry] = {}
        for entry in self.entries:
            self._by_name[entry.name] = entry
        for entry in self.entries:  # "NAME.gguf" too, unless it is another model's name
            if entry.model.path is not None:
                self._by_name.setdefault(entry.model.path.name, entry)
        self._admission: asyncio.Lock | None = None  # one load decision at a time
        self._watch: asyncio.Task[None] | None = None

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def estimate_bytes(self, model: ModelFile) -> int:
        """Weights file size + its KV cache's bytes, before it loads."""
        if model.path is None:
            return 0
        try:
            options = self._options()
            per_token = kv_bytes_per_token(model.path, options.kv_type)
            kv = kv_tokens(model.path, options, per_token) * per_token
        except Exception:  # noqa: BLE001 - a bad file fails its load, which says why
            kv = 0
        return model.file_bytes + kv

    def resolve(self, name: str | None) -> ModelEntry:
        """The model a request's `model` names: THE one place names are read. With one model
        served, any name (or none) is it; else the model of that name or its file name; 404
        model_not_found naming the models there are; 400 when a name is needed and missing."""
        if len(self.entries) == 1:
            return self.entries[0]
        if name is None:
            raise bad_request(f"this server serves several models; name one in 'model': "
                              f"{self._listing()}", param="model", code="model_required")
        if not isinstance(name, str):
            raise bad_request(f"'model' must be a string naming one of {self._listing()}",
                              param="model", code="invalid_type")
        entry = self._by_name.get(name)
        if entry is None:
            raise APIError(404, f"the model '{str(name)[:200]}' does not exist; this server "
                           f"serves {self._listing()}", param="model", code="model_not_found")
        return entry

    def _listing(self, most: int = 32) -> str:
        names = self.names
        shown = ", ".join(f"'{n}'" for n in names[:most])
        return shown + (f" and {len(names) - most} more (GET /v1/models lists them)"
                        if len(names) > most else "")

    # --- using a model -------------------------------------------------------------------------

    async def acquire(self, entry: ModelEntry) -> LoadedModel:
        """The loaded model, loading it first if need be (in a worker thread: the event loop
        keeps serving the others); held against unloading until `release`."""
        entry.n_active += 1
        entry.last_used = time.monotonic()
        try:
            while entry.loaded is None:
                if entry.loading is None:
                    await self._start_load(entry)
                if entry.loading is not None:
                    await asyncio.shield(entry.loading)
            return entry.loaded
        except BaseException:
            self.release(entry)
            raise

    def release(self, entry: ModelEntry) -> None:
        entry.n_active -= 1
        entry.last_used = time.monotonic()

    async def _start_load(self, entry: ModelEntry) -> None:
        if self._admission is None:
            self._admission = asyncio.Lock()
        async with self._admission:
            if entry.loaded is not None or entry.loading is not None:
                return  # another request started it meanwhile
            await self._make_room(entry)
            loop = asyncio.get_running_loop()
            entry.loading = loop.create_task(self._load_in_thread(entry))

    async def _load_in_thread(self, entry: ModelEntry) -> LoadedModel:
        log.info("loading model '%s' (%s)", entry.name, entry.model.path)
        started = time.monotonic()
        try:
            loaded = await asyncio.to_thread(self._load, entry.model.path)
        except BaseException as err:
            entry.error = f"loading the model '{entry.name}' failed: {err}"
            log.error("%s", entry.error)
            raise APIError(503, entry.error, param="model", code="model_error") from None
        finally:
            entry.loading = None
        self.set_loaded(entry, loaded)
        log.info("loaded model '%s' in %.2f s (%s)", entry.name, time.monotonic() - started,
                 format_bytes(entry.footprint_bytes))
        return loaded

    def set_loaded(self, entry: ModelEntry, loaded: LoadedModel) -> None:
        entry.loaded, entry.error = loaded, None
        entry.last_used = time.monotonic()
        engine = loaded.engine
        if engine is not None and loaded.path.is_file():
            per_token = kv_bytes_per_token(loaded.path, engine.kv_type)
            entry.footprint_bytes = (entry.model.file_bytes or loaded.path.stat().st_size) \
                + engine.kv_size * per_token

    async def _make_room(self, entry: ModelEntry) -> None:
        """Unloads the least recently used idle models until `entry` fits under max_memory;
        507 when it can never fit, 503 when busy models hold the room."""
        if self.max_memory is None:
            return
        if entry.footprint_bytes is None:
            entry.footprint_bytes = await asyncio.to_thread(self.estimate_bytes, entry.model)
        need = entry.footprint_bytes
        if need > self.max_memory:
            raise APIError(507, f"the model '{entry.name}' needs about {format_bytes(need)} "
                           f"(weights + KV cache), more than --max-memory "
                           f"{format_bytes(self.max_memory)}: raise --max-memory, or shrink its "
                           "KV cache (--ctx-size, --kv-size, --kv-type q8_0)",
                           param="model", code="insufficient_memory")
        for victim in sorted((e for e in self.entries if e.loaded is not None and not e.busy),
                             key=lambda e: e.last_used):
            if self._committed() + need <= self.max_memory:
                break
            if victim.busy or victim.loaded is None:  # taken (or unloaded) while we awaited
                continue
            log.info("unloading model '%s' to make room for '%s' (--max-memory)", victim.name,
                     entry.name)
            await self.unload(victim)
        if self._committed() + need > self.max_memory:
            held = [e for e in self.entries if e.loaded is not None or e.loading is not None]
            raise APIError(503, f"the model '{entry.name}' needs about {format_bytes(need)}, but "
                           f"the models in use hold {format_bytes(self._committed())} of "
                           f"--max-memory {format_bytes(self.max_memory)} ("
                           + ", ".join(f"'{e.name}' {format_bytes(e.footprint_bytes or 0)}"
                                       for e in held)
                           + "); retry when their requests have finished",
                           param="model", code="insufficient_memory")

    def _committed(self) -> int:
        return sum(e.footprint_bytes or 0 for e in self.entries
                   if e.loaded is not None or e.loading is not None)

    async def unload(self, entry: ModelEntry) -> None:
        """Unloads an idle model (its engine closes in a worker thread)."""
        loaded, entry.loaded = entry.loaded, None
        if loaded is not None:
            await asyncio.to_thread(loaded.close)
            del loaded
            _return_freed_memory()
            log.info("unloaded model '%s'", entry.name)

    # --- keep-alive ----------------------------------------------------------------------------

    def start_keep_alive(self) -> None:
        """Starts the task that unloads models idle for keep_alive seconds (none if never)."""
        if math.isfinite(self.keep_alive):
            self._watch = asyncio.get_running_loop().create_task(self._unload_idle())

    async def _unload_idle(self) -> None:
        tick = min(1.0, max(0.05, self.keep_alive / 4))
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for entry in self.entries:
                if entry.loaded is None:
                    continue
                if entry.busy:
                    entry.last_used = now  # idle time counts from the last request's end
                elif now - entry.last_used >= self.keep_alive:
                    log.info("unloading model '%s': idle for %.0f s (--keep-alive)",
                             entry.name, now - entry.last_used)
                    try:
                        await self.unload(entry)
                    except Exception:  # noqa: BLE001 - logged; the others still unload
                        log.exception("unloading model '%s' failed", entry.name)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        for entry in self.entries:
            loaded, entry.loaded = entry.loaded, None
            if loaded is not None:
                loaded.close()
