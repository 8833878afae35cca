"""ember.server: an OpenAI-compatible HTTP server (Starlette + uvicorn) on ember's
continuous-batching engine.

    from ember.server import ServerConfig, serve
    serve(ServerConfig(model="model.gguf", port=8080))

Layout: app.py (routes, auth), context.py (AppContext: the engine, slots, request helpers),
generation.py (the completion endpoints), protocol.py (request validation), metrics.py,
errors.py, config.py, run.py (uvicorn). Responses are shaped by ember.openai_format.
"""

from __future__ import annotations

from ember.server.app import create_app
from ember.server.config import ServerConfig
from ember.server.run import serve

__all__ = ["ServerConfig", "create_app", "serve"]
