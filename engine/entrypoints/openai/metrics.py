"""The server's Prometheus metrics, under vLLM's names, labels and buckets, in a registry of its own.

Routers and dashboards built for vLLM (vllm-router, llm-d's endpoint picker, Grafana boards)
read ``vllm:*`` names with the labels ``model_name`` and ``engine`` (the data-parallel rank).
So every metric that has a vLLM counterpart is exposed exactly as vLLM's PrometheusStatLogger
does (vllm/v1/metrics/loggers.py; buckets from vllm/v1/metrics/buckets.py, read at
vllm-project/vllm@139b1c3f), with vLLM's meaning; the ``ringllm:*`` names they replaced are
gone (two names for one figure only invite dashboards that disagree). What vLLM has no name
for keeps a ``ringllm:`` one: HTTP requests by route and status, 503 refusals, and the ring's
own publish-to-receive latency.

``ServerMetrics`` is a stat logger (engine/stat_loggers.py): AsyncLLM's output handler hands
it each outputs message's scheduler stats and iteration stats, so a scrape asks the core
nothing. It keeps plain numbers (a histogram is a list of bucket counts) and builds the
metric families only when scraped: recording costs a few additions per message and a bisect
per observed latency, never a lock. A private ``CollectorRegistry``: /metrics shows exactly
this server's metrics, and a second app in one process gets no duplicate-metric error.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from typing import Iterable, Optional

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

from engine.stat_loggers import IterationStats, StatLoggerBase
from engine.wire_messages import FinishReason, SchedulerStats, add_lists

CONTENT_TYPE = CONTENT_TYPE_LATEST

# vLLM's bucket families (vllm/v1/metrics/buckets.py).
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
# ringllm's own: the ring answers in microseconds, zmq in tens of them.
TRANSPORT_BUCKETS = (5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2, 0.1)

FINISH_REASONS = tuple(str(reason) for reason in FinishReason)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


class _Histogram:
    """Bucket counts and a sum: what a Prometheus histogram is, without its lock."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # le: a value equal to a bound is in it
        self.sum += value

    def observe_all(self, values: list) -> None:
        """Many values at once (a message's inter-token latencies): sorted in C, then one bisect
        per bucket instead of one per value. Sorts ``values`` in place."""
        if not values:
            return
        if len(values) < 8:
            for value in values:
                self.observe(value)
            return
        values.sort()
        counts, below = self.counts, 0
        for i, bound in enumerate(self.bounds):
            upto = bisect_right(values, bound)
            counts[i] += upto - below
            below = upto
            if below == len(values):
                break
        counts[-1] += len(values) - below
        self.sum += sum(values)

    def buckets(self) -> list[tuple[str, int]]:
        cumulative, out = 0, []
        for bound, count in zip((*map(floatToGoString, self.bounds), "+Inf"), self.counts):
            cumulative += count
            out.append((bound, cumulative))
        return out


# name, documentation, bucket family ("tokens": 1-2-5 up to max_model_len), as vLLM has them.
_HISTOGRAMS = (
    (
        "time_to_first_token",
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        TIME_TO_FIRST_TOKEN_BUCKETS,
    ),
    (
        "inter_token_latency",
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        INTER_TOKEN_LATENCY_BUCKETS,
    ),
    (
        "request_time_per_output_token",
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        INTER_TOKEN_LATENCY_BUCKETS,
    ),
    (
        "e2e",
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        REQUEST_LATENCY_BUCKETS,
    ),
    (
        "queue",
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        REQUEST_LATENCY_BUCKETS,
    ),
    (
        "inference",
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        REQUEST_LATENCY_BUCKETS,
    ),
    (
        "prefill",
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        REQUEST_LATENCY_BUCKETS,
    ),
    (
        "decode",
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        REQUEST_LATENCY_BUCKETS,
    ),
    ("prompt_tokens", "vllm:request_prompt_tokens", "Number of prefill tokens processed.", "tokens"),
    ("generation_tokens", "vllm:request_generation_tokens", "Number of generation tokens processed.", "tokens"),
    (
        "iteration_tokens",
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        ITERATION_TOKENS_BUCKETS,
    ),
    ("params_n", "vllm:request_params_n", "Histogram of the n request parameter.", REQUEST_PARAMS_N_BUCKETS),
    ("params_max_tokens", "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", "tokens"),
)


class _EngineSeries:
    """One data-parallel rank's figures (its ``engine`` label)."""

    def __init__(self, token_buckets: list[int]) -> None:
        self.running = self.waiting = 0
        self.kv_cache_usage = 0.0
        self.prefix_cache_queries = self.prefix_cache_hits = self.preemptions = 0
        self.spec_drafts = self.spec_draft_tokens = self.spec_accepted_tokens = 0  # speculative decoding
        self.spec_accepted_per_pos: list[int] = []
        self.running_loras: dict[str, int] = {}  # LoRA adapter name -> its running / waiting requests
        self.waiting_loras: dict[str, int] = {}
        self.loras_updated = 0.0  # when the core last reported them (time.time())
        self.prompt_tokens = self.generation_tokens = 0
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.histograms = {
            key: _Histogram(token_buckets if buckets == "tokens" else buckets) for key, _, _, buckets in _HISTOGRAMS
        }


class _VllmCollector:
    """Builds the vllm:* families from the engines' series at each scrape."""

    def __init__(self, metrics: "ServerMetrics") -> None:
        self._metrics = metrics

    def collect(self):
        model, engines = self._metrics.model_name, sorted(self._metrics.engines.items())
        labels = ["model_name", "engine"]

        def family(cls, name: str, doc: str, value_of):
            metric = cls(name, doc, labels=labels)
            for index, series in engines:
                metric.add_metric([model, str(index)], value_of(series))
            return metric

        yield family(
            GaugeMetricFamily,
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            lambda s: s.running,
        )
        yield family(
            GaugeMetricFamily,
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            lambda s: s.waiting,
        )
        yield family(
            GaugeMetricFamily,
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            lambda s: s.kv_cache_usage,
        )
        yield family(
            CounterMetricFamily,
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            lambda s: s.prefix_cache_queries,
        )
        yield family(
            CounterMetricFamily,
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            lambda s: s.prefix_cache_hits,
        )
        yield family(
            CounterMetricFamily,
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            lambda s: s.preemptions,
        )
        yield family(
            CounterMetricFamily,
            "vllm:spec_decode_num_drafts",
            "Number of spec decoding drafts.",
            lambda s: s.spec_drafts,
        )
        yield family(
            CounterMetricFamily,
            "vllm:spec_decode_num_draft_tokens",
            "Number of draft tokens.",
            lambda s: s.spec_draft_tokens,
        )
        yield family(
            CounterMetricFamily,
            "vllm:spec_decode_num_accepted_tokens",
            "Number of accepted tokens.",
            lambda s: s.spec_accepted_tokens,
        )
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            labels=labels + ["position"],
        )
        for index, series in engines:
            for position, count in enumerate(series.spec_accepted_per_pos):
                per_pos.add_metric([model, str(index), str(position)], count)
        yield per_pos
        yield family(
            CounterMetricFamily, "vllm:prompt_tokens", "Number of prefill tokens processed.", lambda s: s.prompt_tokens
        )
        yield family(
            CounterMetricFamily,
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            lambda s: s.generation_tokens,
        )
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.", labels=labels + ["finished_reason"]
        )
        for index, series in engines:
            for reason, count in series.success.items():
                success.add_metric([model, str(index), reason], count)
        yield success
        if self._metrics.max_loras:
            yield self._lora_info(engines)
        for key, name, doc, _ in _HISTOGRAMS:
            histogram = HistogramMetricFamily(name, doc, labels=labels)
            for index, series in engines:
                h = series.histograms[key]
                histogram.add_metric([model, str(index)], h.buckets(), h.sum)
            yield histogram

    def _lora_info(self, engines: list[tuple[int, _EngineSeries]]) -> GaugeMetricFamily:
        """vLLM's ``vllm:lora_requests_info``: the adapters in use as labels (names joined by
        commas, over every rank), its value the time they were last reported."""
        running = sorted({name for _, s in engines for name in s.running_loras})
        waiting = sorted({name for _, s in engines for name in s.waiting_loras})
        info = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        )
        info.add_metric(
            [str(self._metrics.max_loras), ",".join(waiting), ",".join(running)],
            max((s.loras_updated for _, s in engines), default=0.0),
        )
        return info


class ServerMetrics(StatLoggerBase):
    def __init__(
        self, model_name: str, max_model_len: int, engine_indexes: Iterable[int] = (0,), max_loras: int = 0
    ) -> None:
        """``max_loras``: with LoRA (enable_lora), vllm:lora_requests_info is exposed too."""
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.max_loras = max_loras
        self._token_buckets = build_1_2_5_buckets(max_model_len)
        self.engines: dict[int, _EngineSeries] = {i: _EngineSeries(self._token_buckets) for i in engine_indexes}
        reg = self.registry
        reg.register(_VllmCollector(self))
        # ringllm's own (vLLM has no name for these)
        self.http_requests = Counter(
            "ringllm:http_requests", "HTTP requests by route and status code", ["route", "status"], registry=reg
        )
        self.rejected = Counter(
            "ringllm:request_rejected", "Requests refused with 503 (overload)", ["model_name"], registry=reg
        )
        self._transport = Histogram(
            "ringllm:transport_latency_seconds",
            "EngineCore publishes a step's outputs -> the frontend takes them (the ring's own latency)",
            ["model_name"],
            buckets=TRANSPORT_BUCKETS,
            registry=reg,
        ).labels(model_name)

    def record(
        self, scheduler_stats: Optional[SchedulerStats], iteration_stats: Optional[IterationStats], engine_idx: int = 0
    ) -> None:
        series = self.engines.get(engine_idx)
        if series is None:
            series = self.engines[engine_idx] = _EngineSeries(self._token_buckets)
        if scheduler_stats is not None:
            series.running = scheduler_stats.num_running_reqs
            series.waiting = scheduler_stats.num_waiting_reqs
            series.kv_cache_usage = scheduler_stats.kv_cache_usage
            series.prefix_cache_queries += scheduler_stats.prefix_cache_queries
            series.prefix_cache_hits += scheduler_stats.prefix_cache_hits
            series.preemptions += scheduler_stats.num_preempted_reqs
            series.spec_drafts += scheduler_stats.spec_decode_num_drafts
            series.spec_draft_tokens += scheduler_stats.spec_decode_num_draft_tokens
            series.spec_accepted_tokens += scheduler_stats.spec_decode_num_accepted_tokens
            series.spec_accepted_per_pos = add_lists(
                series.spec_accepted_per_pos, scheduler_stats.spec_decode_num_accepted_tokens_per_pos
            )
            if self.max_loras:
                series.running_loras = scheduler_stats.running_lora_adapters
                series.waiting_loras = scheduler_stats.waiting_lora_adapters
                series.loras_updated = time.time()
        if iteration_stats is None:
            return
        it, h = iteration_stats, series.histograms
        if it.transport_latency is not None:
            self._transport.observe(it.transport_latency)
        tokens = it.num_prompt_tokens + it.num_generation_tokens
        if tokens:
            series.prompt_tokens += it.num_prompt_tokens
            series.generation_tokens += it.num_generation_tokens
            h["iteration_tokens"].observe(tokens)
        h["time_to_first_token"].observe_all(it.time_to_first_tokens_iter)
        h["inter_token_latency"].observe_all(it.inter_token_latencies_iter)
        h["params_n"].observe_all(it.n_params_iter)
        for finished in it.finished_requests:
            series.success[finished.finish_reason] = series.success.get(finished.finish_reason, 0) + 1
            h["e2e"].observe(finished.e2e_latency)
            h["queue"].observe(finished.queued_time)
            h["prefill"].observe(finished.prefill_time)
            h["inference"].observe(finished.inference_time)
            h["decode"].observe(finished.decode_time)
            h["prompt_tokens"].observe(finished.num_prompt_tokens)
            h["generation_tokens"].observe(finished.num_generation_tokens)
            h["request_time_per_output_token"].observe(finished.mean_time_per_output_token)
            if finished.max_tokens_param:
                h["params_max_tokens"].observe(finished.max_tokens_param)

    def render(self) -> bytes:
        return generate_latest(self.registry)
