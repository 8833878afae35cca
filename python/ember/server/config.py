"""ServerConfig: everything `ember serve` can be told, with its defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KV_TYPES = ("f16", "q8_0")  # what the engine's paged KV cache can store


@dataclass
class ServerConfig:
    model: str | None = None          # a .gguf path; None: the demo model
    host: str = "127.0.0.1"
    port: int = 8080
    parallel: int = 1                 # slots: sequences generated at the same time, batched
    ctx_size: int | None = None       # tokens per sequence (prompt + completion)
    kv_size: int | None = None        # KV cache tokens shared by all slots
    kv_type: str = "f16"              # KV cache rows: "f16" or "q8_0" (about half the memory)
    threads: int | None = None        # CPU threads of the engine
    device: str | None = None         # "cpu", "vulkan[:N]"; None: $EMBER_DEVICE, else "auto"
    chat_template: str | None = None  # a built-in template's name or a Jinja file; None: the model's
    api_key: str | None = None        # required as "Authorization: Bearer KEY" when set
    cors_origins: list[str] = field(default_factory=list)  # "*" allows any origin
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
    webui: bool = True                # GET / serves the bundled chat page
    embedding: bool = False           # serve an embedding model: /v1/embeddings, no generation
    rerank: bool = False              # ... a reranking one (a cross-encoder): /rerank too
    spec: str = "none"                # speculative decoding: "none", "ngram" (prompt lookup)
    draft_model: str | None = None    # a draft model's .gguf (same vocabulary): spec "draft"
    draft_max: int = 16               # drafts per request and step at most
    draft_min: int = 1                # fewer would not pay: none

    def __post_init__(self) -> None:
        if self.rerank:
            self.embedding = True  # a reranker is served as an embedding model (llama-server's)
        # Checked here so `ember serve` fails before it listens; the engine checks them again
        # (its own edge) when it loads.
        checks = [("parallel", self.parallel, 1), ("max_queue", self.max_queue, 0),
                  ("max_body_bytes", self.max_body_bytes, 1), ("max_n", self.max_n, 1),
                  ("port", self.port, 0), ("max_connections", self.max_connections, 1)]
        for name, value, low in checks:
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        for name, value in (("ctx_size", self.ctx_size), ("kv_size", self.kv_size),
                            ("threads", self.threads)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.spec not in ("none", "ngram", "draft"):
            raise ValueError(f"spec must be 'none', 'ngram' or 'draft', got {self.spec!r}")
        if not 0 <= self.draft_min <= self.draft_max or self.draft_max < 1:
            raise ValueError(f"need 1 <= draft_max and 0 <= draft_min <= draft_max, got "
                             f"draft_max {self.draft_max}, draft_min {self.draft_min}")
        if self.kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be 'f16' or 'q8_0', got {self.kv_type!r}")
        for name, seconds in (("shutdown_timeout", self.shutdown_timeout),
                              ("header_timeout", self.header_timeout),
                              ("body_timeout", self.body_timeout),
                              ("idle_timeout", self.idle_timeout)):
            if not seconds >= 0:
                raise ValueError(f"{name} must be >= 0, got {seconds}")
        if self.n_predict is not None and self.n_predict < -1:
            raise ValueError(f"n_predict must be >= -1 (-1: no limit), got {self.n_predict}")
        from ember.sampling import SamplingParams

        SamplingParams(**self.sampling).check(1)  # ValueError naming a bad default
        if self.api_key is not None and not self.api_key:
            self.api_key = None  # an empty key means no key
