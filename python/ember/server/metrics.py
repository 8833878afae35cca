"""Prometheus metrics of one server, in a registry of its own (never the process-global one, so
two apps in one process, as in tests, count separately).

Gauges (running, waiting, KV usage) are read from the engine when /metrics is scraped; the
counters and histograms are fed per generated sequence by a RequestTimer. prefix_cache_hits
counts prompt tokens served from the KV cache instead of being evaluated (as vLLM's
prefix_cache_hits does). The speculative-decoding counters (drafted and accepted tokens per
draft source: ngram, prediction, draft_model) are the engine's own totals, read at the scrape.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

from ember.engine import EngineStats
from ember.results import Delta

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
                    160.0)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5,
                  1.0, 2.5)


class _SpeculationCollector:
    """ember_spec_draft_tokens_total / ember_spec_accepted_tokens_total{source}: the engine's
    counts at the last scrape."""

    def __init__(self) -> None:
        self.stats: EngineStats | None = None

    def collect(self):  # noqa: ANN201 (prometheus_client's collector protocol)
        drafted = CounterMetricFamily(
            "ember_spec_draft_tokens", "Speculative draft tokens verified, by draft source.",
            labels=["source"])
        accepted = CounterMetricFamily(
            "ember_spec_accepted_tokens", "Of the draft tokens verified, those accepted.",
            labels=["source"])
        if self.stats is not None:
            for source, n in self.stats.drafted_tokens.items():
                drafted.add_metric([source], n)
                accepted.add_metric([source], self.stats.accepted_tokens[source])
        yield drafted
        yield accepted


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._speculation = _SpeculationCollector()
        r.register(self._speculation)
        self.requests_running = Gauge(
            "ember_requests_running", "Sequences being generated now.", registry=r)
        self.requests_waiting = Gauge(
            "ember_requests_waiting", "Sequences queued for a slot.", registry=r)
        self.kv_cache_usage = Gauge(
            "ember_kv_cache_usage_ratio", "Fraction of KV cache tokens in use (0 to 1).",
            registry=r)
        self.device_memory_total = Gauge(
            "ember_device_memory_total_bytes", "Memory of the GPU the model runs on (0 on the CPU).",
            registry=r)
        self.model_loaded = Gauge(
            "ember_model_loaded", "1 while the model is loaded, 0 while it is not.", ["model"],
            registry=r)
        self.device_memory_free = Gauge(
            "ember_device_memory_free_bytes", "GPU memory the driver says is left (0 on the CPU).",
            registry=r)
        # prometheus_client adds the _total suffix to counters.
        self.prefix_cache_hits = Counter(
            "ember_prefix_cache_hits", "Prompt tokens served from the prefix cache.", registry=r)
        self.prompt_tokens = Counter(
            "ember_prompt_tokens", "Prompt tokens of finished sequences.", registry=r)
        self.generation_tokens = Counter(
            "ember_generation_tokens", "Generated tokens.", registry=r)
        self.requests_finished = Counter(
            "ember_requests_finished", "Sequences that ended, by how: stop, length, "
            "cancelled (client gone), error.", ["reason"], registry=r)
        self.time_to_first_token = Histogram(
            "ember_time_to_first_token_seconds", "From arrival to the first generated token.",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.time_per_output_token = Histogram(
            "ember_time_per_output_token_seconds",
            "Mean time between tokens after the first, per sequence.",
            buckets=_TOKEN_BUCKETS, registry=r)
        self.request_latency = Histogram(
            "ember_request_latency_seconds", "From arrival to the last token.",
            buckets=_LATENCY_BUCKETS, registry=r)

    def render(self, stats: EngineStats | None, device_memory: tuple[int, int] | None = None,
               loaded: dict[str, bool] | None = None) -> bytes:
        for name, is_loaded in (loaded or {}).items():
            self.model_loaded.labels(model=name).set(int(is_loaded))
        if device_memory is not None:
            self.device_memory_total.set(device_memory[0])
            self.device_memory_free.set(device_memory[1])
        if stats is not None:
            self.requests_running.set(stats.running)
            self.requests_waiting.set(stats.waiting)
            self.kv_cache_usage.set(min(1.0, max(0.0, stats.kv_usage)))
            self._speculation.stats = stats
        return generate_latest(self.registry)

    def timer(self, arrival: float) -> RequestTimer:
        return RequestTimer(self, arrival)


class RequestTimer:
    """Times one generated sequence from its HTTP request's arrival (time.perf_counter())."""

    def __init__(self, metrics: ServerMetrics, arrival: float) -> None:
        self._metrics = metrics
        self._arrival = arrival
        self._first: float | None = None
        self._n_tokens = 0
        self._ended = False

    def on_event(self, event: Delta) -> None:
        now = time.perf_counter()
        if event.tokens:
            if self._first is None:
                self._first = now
                self._metrics.time_to_first_token.observe(now - self._arrival)
            self._n_tokens += len(event.tokens)
            self._metrics.generation_tokens.inc(len(event.tokens))
        if event.finish_reason is not None:
            if event.result is not None:
                self._metrics.prompt_tokens.inc(event.result.usage.prompt_tokens)
                self._metrics.prefix_cache_hits.inc(event.result.usage.cached_tokens)
            self.end(event.finish_reason, now)

    def end(self, reason: str, now: float | None = None) -> None:
        """Records the end (once): stop/length from the last event, else cancelled/error."""
        if self._ended:
            return
        self._ended = True
        now = time.perf_counter() if now is None else now
        self._metrics.requests_finished.labels(reason).inc()
        self._metrics.request_latency.observe(now - self._arrival)
        if self._first is not None and self._n_tokens > 1:
            self._metrics.time_per_output_token.observe((now - self._first) / (self._n_tokens - 1))
