"""ServerConfig: everything `ember serve` can be told, with its defaults. The engine's fields
take their defaults from ember.EngineOptions (defined once, in C++) and are checked by its
check(); parallel and max_queue are the server's own defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ember.embeddings import POOLINGS
from ember.grammar import BOUNDS, JsonBounds
from ember.images import ImagePolicy
from ember.options import DEFAULTS as _ENGINE
from ember.options import EngineOptions, engine_options


@dataclass
class ServerConfig:
    model: str | None = None          # a .gguf path; None: the demo model (unless models/models_dir)
    # Several models (server/models.py): more .gguf files, and every model in a folder; each is
    # named by its file name without .gguf, loads on first use and unloads after keep_alive
    # seconds idle (None: 300 with several models, never with one; inf: never) or when
    # max_memory bytes (weights + KV cache) would be exceeded.
    models: list[str] = field(default_factory=list)
    models_dir: str | None = None
    keep_alive: float | None = None
    max_memory: int | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    parallel: int = 1                 # slots: sequences generated at the same time, batched
    ctx_size: int | None = None       # tokens per sequence (prompt + completion)
    kv_size: int | None = None        # KV cache tokens shared by all slots
    kv_type: str = _ENGINE.kv_type    # KV cache rows: "f16" or "q8_0" (about half the memory)
    threads: int | None = None        # CPU threads of the engine
    device: str | None = None         # "cpu", "vulkan[:N]"; None: $EMBER_DEVICE, else "auto"
    chat_template: str | None = None  # a built-in template's name or a Jinja file; None: the model's
    api_key: str | None = None        # required as "Authorization: Bearer KEY" when set
    cors_origins: list[str] = field(default_factory=list)  # origins, "*" (any), "localhost"
    max_queue: int = 128              # sequences waiting for a slot (the engine's limit); more: 503
    aliases: list[str] = field(default_factory=list)       # model names clients may use
    max_body_bytes: int = 8 << 20     # larger request bodies: 413
    max_n: int = 16                   # most choices per request
    shutdown_timeout: float = 10.0    # on SIGTERM: seconds in-flight requests get to finish
    max_connections: int = 512        # open connections; more get a 503 (connections.py)
    header_timeout: float = 10.0      # seconds for a request's headers to arrive
    body_timeout: float = 30.0        # seconds for a request's whole body to arrive (408 beyond)
    idle_timeout: float = 5.0         # seconds a kept-alive connection may wait between requests
    host_allow: list[str] = field(default_factory=list)  # Host names besides the listen address
    # Server-side defaults for requests that omit them (llama-server's --n-predict, --temp, ...):
    # n_predict None keeps each API's own default (16 for /v1/completions, else no limit);
    # `sampling` holds SamplingParams fields (temperature, top_k, top_p, min_p, seed,
    # repeat_penalty), those not set keep SamplingParams' defaults.
    n_predict: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    # Reasoning models (server/reasoning.py): where their thinking goes ("none": left in the
    # content; "auto"/"deepseek": reasoning_content; "deepseek-legacy": both), and the tokens
    # of thinking a request gets at most (-1: no limit), as llama-server's flags.
    reasoning_format: str = "auto"
    reasoning_budget: int = -1
    # JSON constraints' bounds where a schema does not give its own (ember.grammar.JsonBounds):
    # number digits and the whitespace between tokens.
    json_bounds: JsonBounds = BOUNDS
    webui: bool = True                # GET / serves the bundled chat page
    # /v1/embeddings, /embedding: an encoder (bert) serves only those; a decoder keeps its chat
    # routes beside them (llama-server's --embedding, which embeds with any model).
    embedding: bool = False
    rerank: bool = False              # /rerank too, from a reranker's head (implies embedding)
    pooling: str | None = None        # none, mean, cls, last, rank: instead of the file's pooling
    spec: str = _ENGINE.spec          # speculative decoding: "none", "ngram" (prompt lookup)
    draft_model: str | None = None    # a draft model's .gguf (same vocabulary): spec "draft"
    draft_max: int = _ENGINE.draft_max  # drafts per request and step at most
    draft_min: int = _ENGINE.draft_min  # fewer would not pay: none
    cache_dir: str | None = None      # prefix-cache blocks also go to files here (restarts reuse them)
    cache_disk_bytes: int = _ENGINE.cache_disk_bytes  # those files at most
    slot_save_path: str | None = None  # where /slots/{id}?action=save|restore files live
    # A prompt longer than the context (with its answer's room): "error" (a 400), "shift" or
    # "truncate-middle" (ember.context_fit)
    context_overflow: str = "error"
    lora: dict[str, str] = field(default_factory=dict)  # LoRA adapters by name (--lora NAME=FILE)
    # Images (ember.images.ImagePolicy): the model's vision projector; the directory file://
    # images may be read from (vLLM's --allowed-local-media-path; None: no files); http(s)
    # image URLs fetched or refused; an image's bytes and pixels, and images per request, at most.
    mmproj: str | None = None
    allowed_local_media_path: str | None = None
    allow_remote_images: bool = False
    image_max_bytes: int = ImagePolicy.max_bytes
    image_max_pixels: int = ImagePolicy.max_pixels
    max_images: int = ImagePolicy.max_images

    def __post_init__(self) -> None:
        if self.rerank:
            self.embedding = True  # a reranker is served as an embedding model (llama-server's)
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise ValueError(f"pooling {self.pooling!r} is not one of {', '.join(POOLINGS)}")
        # The engine's own check (EngineOptions.check), here so `ember serve` fails before it
        # listens.
        self.engine_options().check()
        checks = [("max_body_bytes", self.max_body_bytes, 1), ("max_n", self.max_n, 1),
                  ("port", self.port, 0), ("max_connections", self.max_connections, 1)]
        for name, value, low in checks:
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        for name, seconds in (("shutdown_timeout", self.shutdown_timeout),
                              ("header_timeout", self.header_timeout),
                              ("body_timeout", self.body_timeout),
                              ("idle_timeout", self.idle_timeout)):
            if not seconds >= 0:
                raise ValueError(f"{name} must be >= 0, got {seconds}")
        if self.keep_alive is not None and not self.keep_alive >= 0:
            raise ValueError(f"keep_alive must be >= 0 seconds (inf: never), got {self.keep_alive}")
        if self.max_memory is not None and self.max_memory <= 0:
            raise ValueError(f"max_memory must be > 0 bytes, got {self.max_memory}")
        if self.aliases and (self.models or self.models_dir):
            raise ValueError("--alias names the one model served; with several, each is named "
                             "by its file name (without .gguf)")
        from ember.server.reasoning import FORMATS

        if self.reasoning_format not in FORMATS:
            raise ValueError(f"reasoning_format must be one of {', '.join(FORMATS)}, got "
                             f"{self.reasoning_format!r}")
        if self.reasoning_budget < -1:
            raise ValueError(f"reasoning_budget must be >= -1 (-1: no limit), got "
                             f"{self.reasoning_budget}")
        from ember.context_fit import check_policy

        check_policy(self.context_overflow)
        if self.n_predict is not None and self.n_predict < -1:
            raise ValueError(f"n_predict must be >= -1 (-1: no limit), got {self.n_predict}")
        from ember.sampling import SamplingParams

        SamplingParams(**self.sampling).check(1)  # ValueError naming a bad default
        from ember.server.browser import cors_origins

        self.cors_origins = cors_origins(self.cors_origins)  # ValueError naming a bad one
        self.image_policy  # noqa: B018  ValueError naming a bad limit or directory
        if self.api_key is not None and not self.api_key:
            self.api_key = None  # an empty key means no key

    @property
    def several_models(self) -> bool:
        return bool(self.models or self.models_dir)

    @property
    def keep_alive_seconds(self) -> float:
        if self.keep_alive is not None:
            return self.keep_alive
        return 300.0 if self.several_models else math.inf

    @cached_property
    def image_policy(self) -> ImagePolicy:
        """Where request images may come from and how large they may be (checked once)."""
        return ImagePolicy(max_bytes=self.image_max_bytes, max_pixels=self.image_max_pixels,
                           max_images=self.max_images, local_dir=self.allowed_local_media_path,
                           remote=self.allow_remote_images)

    def engine_options(self) -> EngineOptions:
        """The engine's options: the fields above under their EngineOptions names."""
        return engine_options(n_ctx=self.ctx_size, parallel=self.parallel, kv_size=self.kv_size,
                              kv_type=self.kv_type, n_threads=self.threads, device=self.device,
                              max_queue=self.max_queue, spec=self.spec,
                              draft_model=self.draft_model, draft_max=self.draft_max,
                              draft_min=self.draft_min, cache_dir=self.cache_dir,
                              cache_disk_bytes=self.cache_disk_bytes, mmproj=self.mmproj)
