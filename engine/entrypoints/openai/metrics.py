"""Prometheus metrics of one server, in a registry of its own.

A private ``CollectorRegistry`` (not prometheus_client's global one): /metrics shows exactly
this server's metrics, and a second app in one process gets no duplicate-metric error. Latencies come from
the engine's per-request timings (``RequestOutput.metrics``), so a non-streaming request
is measured as precisely as a streaming one. Gauges of the core's state are refreshed from
the engine when /metrics is scraped, so they are never older than the scrape; so is the
transport latency, whose samples AsyncLLM keeps until they are taken.
"""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from engine.outputs import RequestOutput

CONTENT_TYPE = CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                    10.0, 20.0, 40.0, 80.0)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
                  0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_TRANSPORT_BUCKETS = (5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2, 0.1)


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        reg, m = self.registry, ["model_name"]
        self._model = model_name
        self.http_requests = Counter("ringllm:http_requests", "HTTP requests by route and status code",
                                     ["route", "status"], registry=reg)
        self.request_success = Counter("ringllm:request_success", "Generation requests finished, by reason",
                                       m + ["finished_reason"], registry=reg)
        self.rejected = Counter("ringllm:request_rejected", "Requests refused with 503 (overload)", m,
                                registry=reg)
        self.prompt_tokens = Counter("ringllm:prompt_tokens", "Prompt tokens processed", m, registry=reg)
        self.generation_tokens = Counter("ringllm:generation_tokens", "Tokens generated", m, registry=reg)
        self.ttft = Histogram("ringllm:time_to_first_token_seconds", "Time to first token", m,
                              buckets=_LATENCY_BUCKETS, registry=reg)
        self.itl = Histogram("ringllm:inter_token_latency_seconds", "Mean time between output tokens of "
                             "a request", m, buckets=_TOKEN_BUCKETS, registry=reg)
        self.e2e = Histogram("ringllm:e2e_request_latency_seconds", "Arrival to last token", m,
                             buckets=_LATENCY_BUCKETS, registry=reg)
        self.running = Gauge("ringllm:num_requests_running", "Requests the core is running", m, registry=reg)
        self.waiting = Gauge("ringllm:num_requests_waiting", "Requests waiting in the core's scheduler", m,
                             registry=reg)
        self.kv_usage = Gauge("ringllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1)", m,
                              registry=reg)
        self.transport = Histogram("ringllm:transport_latency_seconds", "EngineCore publishes a step's "
                                   "outputs -> the frontend takes them (the ring's own latency)", m,
                                   buckets=_TRANSPORT_BUCKETS, registry=reg)

    def observe_finished(self, output: RequestOutput) -> None:
        m = self._model
        for completion in output.outputs:
            self.request_success.labels(m, completion.finish_reason or "abort").inc()
            self.generation_tokens.labels(m).inc(len(completion.token_ids))
        self.prompt_tokens.labels(m).inc(len(output.prompt_token_ids or ()))
        stats = output.metrics
        if stats is None or not stats.first_token_ts:
            return
        self.ttft.labels(m).observe(stats.first_token_latency)
        self.e2e.labels(m).observe(stats.last_token_ts - stats.arrival_time)
        if stats.num_generation_tokens > 1:
            self.itl.labels(m).observe((stats.last_token_ts - stats.first_token_ts)
                                       / (stats.num_generation_tokens - 1))

    def observe_transport(self, latencies: list[float]) -> None:
        """Publish-to-receive samples of every OUTPUTS message since the last scrape."""
        histogram = self.transport.labels(self._model)
        for latency in latencies:
            histogram.observe(latency)

    def update_engine_state(self, per_core: list[dict[str, Any]]) -> None:
        """``per_core``: each EngineCore's own counts (its ``get_stats`` utility); data-parallel
        ranks are summed, and their KV usage averaged."""
        m = self._model
        self.running.labels(m).set(sum(s["num_running_reqs"] for s in per_core))
        self.waiting.labels(m).set(sum(s["num_waiting_reqs"] for s in per_core))
        self.kv_usage.labels(m).set(sum(s["kv_cache_usage"] for s in per_core) / len(per_core))

    def render(self) -> bytes:
        return generate_latest(self.registry)
