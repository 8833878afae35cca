"""`ember serve [MODEL...]`: an OpenAI-compatible HTTP server.

    ember serve model.gguf --port 8080 --parallel 4 --api-key secret
    openai.OpenAI(base_url="http://127.0.0.1:8080/v1", api_key="secret")

    ember serve a.gguf b.gguf --keep-alive 10m --max-memory 8G   # several: `model` picks one
    ember serve --models-dir ~/models

Every option can also come from an EMBER_* environment variable (EMBER_PORT=9000 ...); the
command line wins.
"""

# Typer evaluates these annotations at run time, and ember supports Python 3.9: Optional stays.
# ruff: noqa: UP045

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ember.chat import builtin
from ember.commands.generation_options import CHAT_TEMPLATE_HELP, CONTEXT_OVERFLOW_HELP
from ember.embeddings import POOLINGS
from ember.grammar import BOUNDS, JsonBounds
from ember.options import EngineOptions
from ember.server.config import ServerConfig

_D = ServerConfig()


def _names(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def _sampling_defaults(**values: Any) -> dict[str, Any]:
    """The sampling flags that were given (the rest keep SamplingParams' defaults)."""
    return {name: value for name, value in values.items() if value is not None}


def _seconds(value: str | None) -> float | None:
    from ember.server.models import parse_keep_alive

    if value is None:
        return None
    try:
        return parse_keep_alive(value)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--keep-alive") from None


def _bytes(value: str | None, flag: str = "--max-memory") -> int | None:
    from ember.server.models import parse_bytes

    if value is None:
        return None
    try:
        return parse_bytes(value)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint=flag) from None


def serve(
    model: Annotated[Optional[list[str]], typer.Argument(
        help="a .gguf file or hf://USER/REPO[:QUANT]; several: each is served under its file "
             "name without .gguf, and a request's 'model' picks one (default: $EMBER_MODEL, one "
             "path, else the demo model, SmolLM2-135M-Instruct)",
        show_default=False)] = None,
    models_dir: Annotated[Optional[str], typer.Option(
        "--models-dir", envvar="EMBER_MODELS_DIR",
        help="serve every model in this folder (its .gguf files; a split model's shards are "
             "one model, projector and adapter files are left out), each named by its file name "
             "without .gguf (llama-server's router)", show_default=False)] = None,
    keep_alive: Annotated[Optional[str], typer.Option(
        "--keep-alive", envvar="EMBER_KEEP_ALIVE",
        help="unload a model idle this long, reloaded on its next request: seconds or a "
             "duration (30s, 5m, 1h30m), -1 never, 0 as soon as its requests end (Ollama's "
             "keep_alive) \\[default: 5m with several models, never with one]",
        show_default=False)] = None,
    max_memory: Annotated[Optional[str], typer.Option(
        "--max-memory", envvar="EMBER_MAX_MEMORY",
        help="memory the loaded models may take (weights file + KV cache), e.g. 8G or 512M: "
             "before a load, the least recently used idle models are unloaded to make room; a "
             "model that cannot fit gets a 507 (503 while busy models hold the room) "
             "\\[default: no limit]", show_default=False)] = None,
    host: Annotated[str, typer.Option(
        "--host", envvar="EMBER_HOST", help="address to listen on")] = _D.host,
    port: Annotated[int, typer.Option(
        "--port", envvar="EMBER_PORT", help="port to listen on")] = _D.port,
    parallel: Annotated[int, typer.Option(
        "-np", "--parallel", envvar="EMBER_PARALLEL",
        help="slots: requests generated at the same time, batched together")] = _D.parallel,
    ctx_size: Annotated[Optional[int], typer.Option(
        "-c", "--ctx-size", envvar="EMBER_CTX_SIZE",
        help="context per request in tokens (prompt + completion) \\[default: the model's, at "
             f"most {EngineOptions.default_max_ctx}]", show_default=False)] = None,
    kv_size: Annotated[Optional[int], typer.Option(
        "--kv-size", envvar="EMBER_KV_SIZE",
        help="KV cache tokens shared by all slots \\[default: parallel x ctx-size, at most "
             f"{EngineOptions.default_kv_bytes >> 30} GiB]",
        show_default=False)] = None,
    kv_type: Annotated[str, typer.Option(
        "--kv-type", envvar="EMBER_KV_TYPE",
        help="KV cache element type: 'f16', or 'q8_0' (8-bit blocks: about half the KV memory, "
             "so ~1.9x the tokens fit in the same cache, at slightly less exact attention; the "
             "model's head size must be a multiple of 32)")] = _D.kv_type,
    threads: Annotated[Optional[int], typer.Option(
        "-t", "--threads", envvar="EMBER_THREADS",
        help="CPU threads of the engine \\[default: physical cores]",
        show_default=False)] = None,
    device: Annotated[Optional[str], typer.Option(
        "--device", envvar="EMBER_DEVICE",
        help="device to run on: cpu, cuda[:N] or vulkan[:N] \\[default: the first GPU, else the CPU]",
        show_default=False)] = None,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", envvar="EMBER_API_KEY",
        help="require 'Authorization: Bearer KEY' (all routes but /health)",
        show_default=False)] = None,
    cors_origins: Annotated[Optional[str], typer.Option(
        "--cors-origins", envvar="EMBER_CORS_ORIGINS",
        help="comma-separated web origins (scheme://host[:port]) whose pages may call the "
             "server, '*' for any (llama-server's default), 'localhost' for loopback pages on "
             "any port; the server's own page and loopback origins (localhost, 127.0.0.1, "
             "[::1]) always may, other sites get a 403 \\[default: none]",
        show_default=False)] = None,
    max_queue: Annotated[int, typer.Option(
        "--max-queue", envvar="EMBER_MAX_QUEUE",
        help="requests that may wait for a slot; beyond it the server answers 503")
    ] = _D.max_queue,
    alias: Annotated[Optional[str], typer.Option(
        "-a", "--alias", envvar="EMBER_ALIAS",
        help="model name(s) clients use, comma-separated; the first is listed in /v1/models "
             "\\[default: the file name]", show_default=False)] = None,
    max_body_size: Annotated[int, typer.Option(
        "--max-body-size", envvar="EMBER_MAX_BODY_SIZE",
        help="largest request body in bytes (413 beyond)")] = _D.max_body_bytes,
    shutdown_timeout: Annotated[float, typer.Option(
        "--shutdown-timeout", envvar="EMBER_SHUTDOWN_TIMEOUT",
        help="seconds in-flight requests get to finish on SIGTERM")] = _D.shutdown_timeout,
    max_connections: Annotated[int, typer.Option(
        "--max-connections", envvar="EMBER_MAX_CONNECTIONS",
        help="open connections at most; requests on more get a 503")] = _D.max_connections,
    header_timeout: Annotated[float, typer.Option(
        "--header-timeout", envvar="EMBER_HEADER_TIMEOUT",
        help="seconds a connection has to send a request's headers")] = _D.header_timeout,
    body_timeout: Annotated[float, typer.Option(
        "--body-timeout", envvar="EMBER_BODY_TIMEOUT",
        help="seconds a request's body has to arrive (408 beyond)")] = _D.body_timeout,
    idle_timeout: Annotated[float, typer.Option(
        "--idle-timeout", envvar="EMBER_IDLE_TIMEOUT",
        help="seconds a kept-alive connection may wait between requests")] = _D.idle_timeout,
    host_allow: Annotated[Optional[str], typer.Option(
        "--host-allow", envvar="EMBER_HOST_ALLOW",
        help="comma-separated Host names to answer besides IP addresses, localhost and --host "
             "('*': any); other Host headers get a 403 (DNS rebinding)",
        show_default=False)] = None,
    spec: Annotated[str, typer.Option(
        "--spec", envvar="EMBER_SPEC",
        help="speculative decoding (same output, sooner): 'ngram' drafts from each request's own "
             "prompt and output; 'draft' from --draft-model; requests with a 'prediction' draft "
             "from it in any case")] = _D.spec,
    draft_model: Annotated[Optional[str], typer.Option(
        "--draft-model", envvar="EMBER_DRAFT_MODEL",
        help="a small .gguf with the model's vocabulary that drafts tokens (implies --spec "
             "draft)", show_default=False)] = None,
    draft_max: Annotated[int, typer.Option(
        "--draft-max", envvar="EMBER_DRAFT_MAX",
        help="drafts per request and step at most (fewer when the batch is compute-bound)")
    ] = _D.draft_max,
    cache_dir: Annotated[Optional[str], typer.Option(
        "--cache-dir", envvar="EMBER_CACHE_DIR",
        help="also keep the prefix cache's full KV blocks as files in this directory, so that "
             "after a restart a long prompt seen before is read back instead of recomputed "
             "(files of another model or KV type are ignored) \\[default: memory only]",
        show_default=False)] = None,
    cache_disk_size: Annotated[str, typer.Option(
        "--cache-disk-size", envvar="EMBER_CACHE_DISK_SIZE",
        help="the --cache-dir files at most (K, M, G, T: powers of 1024); the least recently "
             "used go first")] = f"{_D.cache_disk_bytes >> 30}G",
    slot_save_path: Annotated[Optional[str], typer.Option(
        "--slot-save-path", envvar="EMBER_SLOT_SAVE_PATH",
        help="directory of the files POST /slots/{id}?action=save|restore writes and reads "
             "(a slot's prompt and its K/V) \\[default: slot saving off]",
        show_default=False)] = None,
    draft_min: Annotated[int, typer.Option(
        "--draft-min", envvar="EMBER_DRAFT_MIN",
        help="a request given fewer drafts than this gets none")] = _D.draft_min,
    n_predict: Annotated[Optional[int], typer.Option(
        "-n", "--n-predict", envvar="EMBER_N_PREDICT",
        help="tokens to generate when a request sets no max_tokens/n_predict (-1: until the "
             "model stops or the context is full) \\[default: 16 for /v1/completions, else -1]",
        show_default=False)] = None,
    temp: Annotated[Optional[float], typer.Option(
        "--temp", envvar="EMBER_TEMP",
        help="temperature for requests that omit it; 0 is greedy \\[default: 0.8]",
        show_default=False)] = None,
    top_k: Annotated[Optional[int], typer.Option(
        "--top-k", envvar="EMBER_TOP_K", help="top_k for requests that omit it; 0: off "
        "\\[default: 40]", show_default=False)] = None,
    top_p: Annotated[Optional[float], typer.Option(
        "--top-p", envvar="EMBER_TOP_P", help="top_p for requests that omit it; 1: off "
        "\\[default: 0.95]", show_default=False)] = None,
    min_p: Annotated[Optional[float], typer.Option(
        "--min-p", envvar="EMBER_MIN_P", help="min_p for requests that omit it; 0: off "
        "\\[default: 0.05]", show_default=False)] = None,
    seed: Annotated[Optional[int], typer.Option(
        "-s", "--seed", envvar="EMBER_SEED", help="seed for requests that omit it (then equal "
        "requests give equal text) \\[default: a fresh random seed per request]",
        show_default=False)] = None,
    repeat_penalty: Annotated[Optional[float], typer.Option(
        "--repeat-penalty", envvar="EMBER_REPEAT_PENALTY", help="repeat_penalty for requests "
        "that omit it; 1: off \\[default: 1]", show_default=False)] = None,
    webui: Annotated[bool, typer.Option(
        "--webui/--no-webui", envvar="EMBER_WEBUI",
        help="serve the bundled chat page at / (open http://HOST:PORT/ in a browser)")] = True,
    embedding: Annotated[bool, typer.Option(
        "--embedding", "--embeddings", envvar="EMBER_EMBEDDING",
        help="answer /v1/embeddings and /embedding with the model, pooled as its file says or "
        "--pooling: an encoder (bert) serves only those; a decoder (llama, qwen3, "
        "Qwen3-Embedding...) keeps chat and completions beside them, as llama-server's "
        "--embedding (a second copy of its weights embeds)")] = False,
    rerank: Annotated[bool, typer.Option(
        "--rerank", "--reranking", envvar="EMBER_RERANK",
        help="answer /rerank (and /v1/rerank) with a reranking model's head: a bert "
        "cross-encoder, or a decoder classifier (pooling rank: a converted "
        "Qwen3ForSequenceClassification, Qwen3-Reranker); implies --embedding")] = False,
    pooling: Annotated[Optional[str], typer.Option(
        "--pooling", envvar="EMBER_POOLING",
        help="pooling of embeddings, instead of the file's pooling_type: none (every token's "
        "vector, on /embedding only), mean, cls (first token), last (last token: "
        "Qwen3-Embedding, e5-mistral), rank (a reranker's head) \\[default: the file's pooling_type; a "
        "chat model's file has none]", show_default=False)] = None,
    chat_template: Annotated[Optional[str], typer.Option(
        "--chat-template", envvar="EMBER_CHAT_TEMPLATE",
        help=CHAT_TEMPLATE_HELP, show_default=False)] = None,
    reasoning_format: Annotated[str, typer.Option(
        "--reasoning-format", envvar="EMBER_REASONING_FORMAT",
        help="a reasoning model's thinking: none (left in the content), auto or deepseek "
        "(in reasoning_content), deepseek-legacy (both)")] = "auto",
    reasoning_budget: Annotated[int, typer.Option(
        "--reasoning-budget", envvar="EMBER_REASONING_BUDGET",
        help="tokens of thinking a request gets at most, then </think> is forced (-1: no "
        "limit)")] = -1,
    json_int_digits: Annotated[int, typer.Option(
        "--json-int-digits", envvar="EMBER_JSON_INT_DIGITS",
        help="JSON constraints (response_format, json_schema, tool calls): digits before the "
        "point of a number whose schema gives no minimum/maximum (1-18; a weak model can "
        "otherwise write \"1111...\" until max_tokens)")] = BOUNDS.int_digits,
    json_frac_digits: Annotated[int, typer.Option(
        "--json-frac-digits", envvar="EMBER_JSON_FRAC_DIGITS",
        help="JSON constraints: digits after the point of a number whose schema gives no "
        "multipleOf (0-10)")] = BOUNDS.frac_digits,
    json_indent: Annotated[int, typer.Option(
        "--json-indent", envvar="EMBER_JSON_INDENT",
        help="JSON constraints: between two tokens one space, or a line break and at most this "
        "many spaces or tabs (-1: compact JSON, no whitespace)")] = BOUNDS.indent,
    context_overflow: Annotated[str, typer.Option(
        "--context-overflow", envvar="EMBER_CONTEXT_OVERFLOW",
        help=CONTEXT_OVERFLOW_HELP + ". The default answers as OpenAI and llama-server do "
        "(400 context_length_exceeded); what was dropped is in the usage (dropped_tokens, "
        "dropped_messages) and the X-Context-Dropped-Tokens/-Messages headers")] = "error",
    lora: Annotated[Optional[list[str]], typer.Option(
        "--lora", help="NAME=FILE: a LoRA adapter .gguf of the model (ember convert --lora), "
        "picked by a request's model \"<served name>:NAME\" or its lora field; repeatable "
        "(one model served)")] = None,
    mmproj: Annotated[Optional[Path], typer.Option(
        "--mmproj", envvar="EMBER_MMPROJ",
        help="the model's vision projector (an mmproj .gguf, as llama-server's --mmproj): "
        "requests may then carry images (one model served)", show_default=False)] = None,
    allowed_local_media_path: Annotated[Optional[Path], typer.Option(
        "--allowed-local-media-path", envvar="EMBER_ALLOWED_LOCAL_MEDIA_PATH",
        help="requests may name image files under this directory by file:// URL (vLLM's flag; "
        "file://NAME is relative to it); only for trusted clients \\[default: no files]",
        show_default=False)] = None,
    allow_remote_images: Annotated[bool, typer.Option(
        "--allow-remote-images", envvar="EMBER_ALLOW_REMOTE_IMAGES",
        help="fetch http(s) image URLs of requests (within 10 s and --image-max-size; the server "
        "then reaches any address a client names)")] = False,
    image_max_size: Annotated[str, typer.Option(
        "--image-max-size", envvar="EMBER_IMAGE_MAX_SIZE",
        help="an image file's bytes at most (413 beyond; data URLs are also bounded by "
        "--max-body-size)")] = "10M",
    image_max_pixels: Annotated[int, typer.Option(
        "--image-max-pixels", envvar="EMBER_IMAGE_MAX_PIXELS",
        help="an image's width x height at most (checked before it is decoded)")
    ] = _D.image_max_pixels,
    limit_mm_per_prompt: Annotated[str, typer.Option(
        "--limit-mm-per-prompt", envvar="EMBER_LIMIT_MM_PER_PROMPT",
        help="images per request at most: image=N, or vLLM's JSON {\"image\": N}")
    ] = f"image={_D.max_images}",
) -> None:
    """Serve a model, or several, over an OpenAI-compatible HTTP API (/v1/chat/completions,
    ...)."""
    from ember.hub.models import resolve_model
    from ember.server.models import served_models
    from ember.server.run import serve as run_server

    if not model and os.environ.get("EMBER_MODEL"):
        model = [os.environ["EMBER_MODEL"]]  # one path, spaces and all (click would split it)
    # A missing file fails now, not after listening.
    files = [str(resolve_model(m)) for m in model or []]
    if pooling is not None and pooling not in POOLINGS:
        raise typer.BadParameter(f"{pooling!r} is not one of {', '.join(POOLINGS)}",
                                 param_hint="--pooling")
    if chat_template is not None:
        try:  # a bad name or file fails now too
            builtin.resolve(chat_template)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--chat-template") from None
    keep_alive_seconds, max_memory_bytes = _seconds(keep_alive), _bytes(max_memory)
    several = len(files) > 1 or models_dir is not None
    config = ServerConfig(
        model=files[0] if files and not several else None,
        models=files if several else [], models_dir=models_dir,
        keep_alive=keep_alive_seconds, max_memory=max_memory_bytes, host=host, port=port,
        parallel=parallel, ctx_size=ctx_size,
        kv_size=kv_size, kv_type=kv_type, threads=threads, device=device, api_key=api_key,
        cors_origins=_names(cors_origins),
        max_queue=max_queue, aliases=_names(alias), max_body_bytes=max_body_size,
        shutdown_timeout=shutdown_timeout, max_connections=max_connections,
        header_timeout=header_timeout, body_timeout=body_timeout, idle_timeout=idle_timeout,
        host_allow=_names(host_allow), n_predict=n_predict, webui=webui,
        sampling=_sampling_defaults(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                                    seed=seed, repeat_penalty=repeat_penalty),
        spec="draft" if draft_model is not None and spec == "none" else spec,
        draft_model=str(resolve_model(draft_model)) if draft_model is not None else None,
        draft_max=draft_max, draft_min=draft_min, embedding=embedding, rerank=rerank,
        pooling=pooling, chat_template=chat_template, reasoning_format=reasoning_format,
        reasoning_budget=reasoning_budget, context_overflow=context_overflow,
        json_bounds=JsonBounds(json_int_digits, json_frac_digits, json_indent),
        cache_dir=cache_dir, cache_disk_bytes=_bytes(cache_disk_size, "--cache-disk-size"),
        slot_save_path=slot_save_path, lora=_adapters(lora or []),
        mmproj=_mmproj(mmproj),
        allowed_local_media_path=str(allowed_local_media_path) if allowed_local_media_path
        else None, allow_remote_images=allow_remote_images,
        image_max_bytes=_bytes(image_max_size, "--image-max-size"),
        image_max_pixels=image_max_pixels, max_images=_image_limit(limit_mm_per_prompt))
    if len(served_models(config)) > 1 and config.lora:  # also: a folder without models, ...
        raise typer.BadParameter("LoRA adapters go with one served model; this serves several",
                                 param_hint="--lora")
    if len(served_models(config)) > 1 and config.mmproj:
        raise typer.BadParameter("a vision projector goes with one served model; this serves "
                                 "several", param_hint="--mmproj")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s",
                        stream=sys.stderr)
    status = run_server(config)
    if status:
        raise typer.Exit(status)


def _mmproj(path: Path | None) -> str | None:
    if path is not None and not path.expanduser().is_file():
        raise typer.BadParameter(f"{path}: no such file", param_hint="--mmproj")
    return str(path.expanduser()) if path is not None else None


def _image_limit(value: str) -> int:
    """--limit-mm-per-prompt: image=N or {"image": N} (vLLM's), as N."""
    import json

    text = value.strip()
    try:
        limits = json.loads(text) if text.startswith("{") else dict(
            (name.strip(), int(number)) for name, _, number in
            (item.partition("=") for item in text.split(",")))
    except ValueError:
        limits = None
    ok = isinstance(limits, dict) and set(limits) == {"image"} \
        and isinstance(limits["image"], int) and limits["image"] >= 1
    if not ok:
        raise typer.BadParameter(f"{value!r}: expected image=N or {{\"image\": N}} with N >= 1 "
                                 "(ember takes images only)", param_hint="--limit-mm-per-prompt")
    return int(limits["image"])  # type: ignore[index]


def _adapters(values: list[str]) -> dict[str, str]:
    """--lora NAME=FILE flags as {NAME: FILE}; a bad or repeated name, or a missing file, fails
    before the server listens."""
    adapters: dict[str, str] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path or ":" in name:
            raise typer.BadParameter(f"{value!r}: expected NAME=FILE (a name without ':')",
                                     param_hint="--lora")
        if name in adapters:
            raise typer.BadParameter(f"adapter {name!r} is given twice", param_hint="--lora")
        if not Path(path).expanduser().is_file():
            raise typer.BadParameter(f"{path}: no such file", param_hint="--lora")
        adapters[name] = str(Path(path).expanduser())
    return adapters


def register(app: typer.Typer) -> None:
    app.command()(serve)
