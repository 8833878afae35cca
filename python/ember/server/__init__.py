"""ember.server: an OpenAI-compatible HTTP server (Starlette + uvicorn) on ember's
continuous-batching engine.

    from ember.server import ServerConfig, serve
    serve(ServerConfig(model="model.gguf", port=8080))

Layout: app.py (the route table; its module doc says which room owns what), context.py
(AppContext: the engine, slots, request helpers), config.py, run.py (uvicorn). A request goes
route -> translate (fields.py, protocol.py, prompts.py) -> respond.py -> the engine.
"""

from __future__ import annotations

from ember.server.app import create_app
from ember.server.config import ServerConfig
from ember.server.run import serve

__all__ = ["ServerConfig", "create_app", "serve"]
