"""ember.server: an OpenAI-compatible HTTP server (Starlette + uvicorn) for ember models.

    from ember.server import ServerConfig, serve
    serve(ServerConfig(model="model.gguf", port=8080))

Layout: app.py (routes, auth, lifespan), generation.py (the completion endpoints),
protocol.py (request validation), responses.py (response shapes), backend.py (the interface to
the engine), llm_backend.py (that interface on ember.LLM), metrics.py, run.py (uvicorn).
"""

from __future__ import annotations

from ember.server.app import create_app
from ember.server.backend import GenerationBackend
from ember.server.config import ServerConfig
from ember.server.run import serve

__all__ = ["GenerationBackend", "ServerConfig", "create_app", "serve"]
