"""`ember serve --spec ngram` on stories260K: Predicted Outputs through the openai client
(the same text as without a prediction, usage.completion_tokens_details as OpenAI reports it),
a bad prediction refused with a 400 naming the field, and the /metrics draft counters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from server_support import RunningServer, sample, serving

from ember.server.config import ServerConfig

MESSAGES = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def server(stories_path: Path) -> Iterator[RunningServer]:
    config = ServerConfig(model=str(stories_path), parallel=2, threads=1, ctx_size=512,
                          spec="ngram", aliases=["stories"])
    with serving(config) as running:
        yield running



def test_prediction_gives_the_same_text_and_reports_its_tokens(client: openai.OpenAI,
                                                               server: RunningServer) -> None:
    plain = client.chat.completions.create(model="stories", messages=MESSAGES, max_tokens=60,
                                           temperature=0)
    text = plain.choices[0].message.content
    assert plain.usage.completion_tokens_details is None  # no prediction: no details
    before = sample(server.url, "ember_spec_accepted_tokens_total", 'source="prediction"')
    middle = len(text) // 2  # a word the output will not have, mid-way: drafts there are wrong
    edited = text[:middle] + " zebra" + text[middle:]
    out = client.chat.completions.create(
        model="stories", messages=MESSAGES, max_tokens=60, temperature=0,
        prediction={"type": "content", "content": edited})
    assert out.choices[0].message.content == text
    details = out.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 20
    assert details.rejected_prediction_tokens >= 1  # the edit was guessed wrong
    after = sample(server.url, "ember_spec_accepted_tokens_total", 'source="prediction"')
    assert after - before == details.accepted_prediction_tokens
    # Streamed, with text parts: the same text, the same usage details.
    stream = client.chat.completions.create(
        model="stories", messages=MESSAGES, max_tokens=60, temperature=0, stream=True,
        stream_options={"include_usage": True},
        prediction={"type": "content", "content": [{"type": "text", "text": edited}]})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    # (How many drafts a step verifies follows the measured step times, so the counts of two
    # runs may differ; the text may not.)
    assert chunks[-1].usage.completion_tokens_details.accepted_prediction_tokens > 20


@pytest.mark.parametrize("prediction", [
    "just text", {"type": "image", "content": "x"}, {"type": "content", "content": 5},
    {"type": "content", "content": [{"type": "text", "text": 1}]},
])
def test_bad_prediction_is_a_400_naming_it(server: RunningServer, prediction: object) -> None:
    r = httpx.post(server.base_url + "/chat/completions",
                   json={"messages": MESSAGES, "max_tokens": 4, "prediction": prediction})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("prediction")


def test_metrics_count_drafts_per_source(client: openai.OpenAI, server: RunningServer) -> None:
    client.chat.completions.create(model="stories", messages=MESSAGES, max_tokens=80, temperature=0)
    text = httpx.get(server.url + "/metrics").text
    for source in ("ngram", "prediction", "draft_model"):
        assert f'ember_spec_draft_tokens_total{{source="{source}"}}' in text
        assert f'ember_spec_accepted_tokens_total{{source="{source}"}}' in text
    drafted = sample(server.url, "ember_spec_draft_tokens_total", 'source="ngram"')
    accepted = sample(server.url, "ember_spec_accepted_tokens_total", 'source="ngram"')
    assert drafted > 0 and 0 < accepted <= drafted
