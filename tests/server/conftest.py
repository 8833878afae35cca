"""Fixtures every server test module may use: `client`, the OpenAI client of the module's
`server` fixture."""

from __future__ import annotations

import openai
import pytest
from server_support import RunningServer


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
