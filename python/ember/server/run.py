"""Running the app under uvicorn, with ember's shutdown rules.

SIGTERM (or the first Ctrl-C): uvicorn stops accepting connections and waits for open ones;
ember refuses new requests at once and gives in-flight ones shutdown_timeout seconds before it
cancels them, then the process exits 0. A model that fails to load stops the server (exit 1).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Callable
from types import FrameType

import uvicorn

from ember.engine import Engine
from ember.server.app import create_app
from ember.server.config import ServerConfig
from ember.server.connections import protocol_class
from ember.server.context import AppContext

log = logging.getLogger("ember.server")

LISTEN_BACKLOG = 2048  # connections the kernel queues before accept (uvicorn's default)


class EmberServer(uvicorn.Server):
    """uvicorn.Server that also tells the app when a shutdown signal arrives, so requests
    still running get a deadline instead of an open-ended wait."""

    def __init__(self, config: uvicorn.Config, ctx: AppContext) -> None:
        super().__init__(config)
        self.ctx = ctx
        ctx.on_load_error = self._stop

    def _stop(self) -> None:
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        loop = self.ctx.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.ctx.begin_shutdown)


def make_server(config: ServerConfig, make_engine: Callable[[], Engine] | None = None,
                log_level: str = "info", access_log: bool = True) -> EmberServer:
    app = create_app(config, make_engine)
    uv_config = uvicorn.Config(
        app, host=config.host, port=config.port, log_level=log_level, access_log=access_log,
        lifespan="on", loop="asyncio",
        http=protocol_class(config.max_connections, config.header_timeout),
        timeout_keep_alive=config.idle_timeout,  # type: ignore[arg-type]  # a float works
        # A backstop: ember cancels what is left after shutdown_timeout itself.
        timeout_graceful_shutdown=int(config.shutdown_timeout) + 5)
    return EmberServer(uv_config, app.state.ctx)


def _ignore_signal(sig: int, frame: FrameType | None) -> None:
    pass


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything starts: a port in use is one error (OSError
    naming the address), not a failure of uvicorn's start-up while the model loads."""
    # IPPROTO_TCP, as uvicorn's own bind has it: asyncio sets TCP_NODELAY on the accepted
    # connections only then (with proto 0 every response would wait for a delayed ACK).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM,
                         socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(LISTEN_BACKLOG)
        return sock
    except OSError as err:
        sock.close()
        reason = os.strerror(err.errno) if err.errno else str(err)
        raise OSError(f"cannot listen on {host}:{port}: {reason} (another server there? --port "
                      "picks another port)") from None


def serve(config: ServerConfig, sock: socket.socket | None = None) -> int:
    """Serves until SIGTERM/SIGINT on `sock` (default: config's host and port); returns the exit
    status (0, or 1 when the model failed to load)."""
    sock = sock if sock is not None else listen(config.host, config.port)
    server = make_server(config)
    # uvicorn re-raises the signal that stopped it once it has shut down; with the default
    # SIGTERM action that would kill the process (status -15) after a clean shutdown.
    previous = signal.signal(signal.SIGTERM, _ignore_signal)
    host, port = sock.getsockname()[:2]
    # uvicorn announces only the sockets it binds itself.
    log.info("listening on http://%s:%d (Ctrl-C stops)", f"[{host}]" if ":" in host else host, port)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    return 1 if server.ctx.load_error else 0
