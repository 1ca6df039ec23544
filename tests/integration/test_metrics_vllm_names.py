"""/metrics under vLLM's names, labels and buckets, checked against the requests sent.

A real ``ringllm serve`` (tiny dummy-weight model, a KV cache of 20 blocks so that concurrent
long requests must preempt), driven by the ``openai`` client with token-id prompts, so every
count is known in advance; the scrape is parsed with prometheus_client's own parser.
"""

from __future__ import annotations

import asyncio
import time

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.entrypoints.openai.metrics import (
    INTER_TOKEN_LATENCY_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TIME_TO_FIRST_TOKEN_BUCKETS,
    build_1_2_5_buckets,
)
from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer, wait_for

MAX_MODEL_LEN = 256
BLOCK = 16
KV_BLOCKS = 20  # the tiny model's KV takes 8 KiB per block of 16 tokens
LABELS = {"model_name": "tiny", "engine": "0"}
VLLM_NAMES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_params_n",
    "vllm:request_params_max_tokens",
    "vllm:iteration_tokens_total",
)


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    args = list(TINY_SERVE_ARGS)
    args[args.index("--kv-cache-memory") + 1] = str(KV_BLOCKS * (8 << 10))
    with RemoteServer(
        tiny_model_dir,
        *args,
        "--served-model-name",
        "tiny",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--block-size",
        str(BLOCK),
    ) as remote:
        yield remote


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def scrape(server) -> tuple[dict, dict]:
    """(samples by (name, labels), families by name) of one /metrics scrape."""
    status, body, _ = server.get("/metrics")
    assert status == 200
    samples, families = {}, {}
    for family in text_string_to_metric_families(body.decode()):
        families[family.name] = family
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, families


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted({**LABELS, **labels}.items())))]


def complete(client, prompt: list[int], max_tokens: int, n: int = 1):
    out = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=max_tokens, n=n, temperature=0.0, extra_body={"ignore_eos": True}
    )
    assert all(c.finish_reason == "length" for c in out.choices) and len(out.choices) == n
    return out


def test_every_vllm_metric_counts_the_requests_sent(server, client):
    shared = [(7 * j) % 2000 + 10 for j in range(3 * BLOCK)]  # three full blocks, then a tail
    sent = [(shared + [1, 2, 3], 5, 1), (shared + [4, 5], 6, 1), ([11, 12, 13, 14], 4, 2), ([21] * 9, 1, 1)]
    for prompt, max_tokens, n in sent:
        complete(client, prompt, max_tokens, n)
    children = [(len(p), m) for p, m, n in sent for _ in range(n)]
    prompt_tokens = sum(p for p, _ in children)
    generated = sum(m for _, m in children)

    def finished():
        return value(scrape(server)[0], "vllm:request_success_total", finished_reason="length") == len(children)

    assert wait_for(finished, 30), "the finished requests never all reached /metrics"
    m, families = scrape(server)

    # every name, with vLLM's labels (model_name, engine), and nothing left under ringllm's old names
    for name in VLLM_NAMES:
        assert name in families, name
        assert all({**s.labels}.items() >= LABELS.items() for s in families[name].samples), name
    assert {n for n in families if n.startswith("ringllm:") and not n.endswith("_created")} == {
        "ringllm:http_requests",
        "ringllm:request_rejected",
        "ringllm:transport_latency_seconds",
    }

    # counters: exactly what was sent
    assert value(m, "vllm:prompt_tokens_total") == prompt_tokens
    assert value(m, "vllm:generation_tokens_total") == generated
    for reason in ("stop", "abort", "error"):
        assert value(m, "vllm:request_success_total", finished_reason=reason) == 0
    assert value(m, "vllm:prefix_cache_queries_total") == prompt_tokens  # one lookup per request, no preemption
    assert value(m, "vllm:prefix_cache_hits_total") == 3 * BLOCK  # the second request's shared blocks
    assert value(m, "vllm:num_preemptions_total") == 0
    # gauges: the core's state after its last step (idle, every block free)
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert value(m, gauge) == 0

    # histograms: one sample per finished (child) request, sums that add up
    for name in (
        "time_to_first_token_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "request_inference_time_seconds",
        "request_prompt_tokens",
        "request_generation_tokens",
        "request_params_max_tokens",
    ):
        assert value(m, f"vllm:{name}_count") == len(children), name
    assert value(m, "vllm:request_prompt_tokens_sum") == prompt_tokens
    assert value(m, "vllm:request_generation_tokens_sum") == generated
    assert value(m, "vllm:request_params_max_tokens_sum") == generated
    assert (value(m, "vllm:request_params_n_count"), value(m, "vllm:request_params_n_sum")) == (
        len(sent),
        sum(n for _, _, n in sent),
    )
    assert value(m, "vllm:iteration_tokens_total_sum") == prompt_tokens + generated
    # a request's inter-token gaps add up to its decode time; prefill + decode is its inference time
    itl, decode = value(m, "vllm:inter_token_latency_seconds_sum"), value(m, "vllm:request_decode_time_seconds_sum")
    assert 0 < value(m, "vllm:inter_token_latency_seconds_count") <= sum(g - 1 for _, g in children)
    assert itl == pytest.approx(decode, abs=1e-6)
    prefill, inference = (
        value(m, "vllm:request_prefill_time_seconds_sum"),
        value(m, "vllm:request_inference_time_seconds_sum"),
    )
    assert prefill > 0 and inference == pytest.approx(prefill + decode, abs=1e-6)
    queue, e2e = value(m, "vllm:request_queue_time_seconds_sum"), value(m, "vllm:e2e_request_latency_seconds_sum")
    assert 0 <= queue and queue + inference <= e2e
    assert e2e >= value(m, "vllm:time_to_first_token_seconds_sum") > 0

    # vLLM's buckets
    def bounds(name):
        return [float(s.labels["le"]) for s in families[name].samples if s.name == name + "_bucket"][:-1]

    assert bounds("vllm:time_to_first_token_seconds") == list(TIME_TO_FIRST_TOKEN_BUCKETS)
    assert bounds("vllm:inter_token_latency_seconds") == list(INTER_TOKEN_LATENCY_BUCKETS)
    assert bounds("vllm:e2e_request_latency_seconds") == list(REQUEST_LATENCY_BUCKETS)
    assert bounds("vllm:request_prompt_tokens") == build_1_2_5_buckets(MAX_MODEL_LEN) == [1, 2, 5, 10, 20, 50, 100, 200]
    assert bounds("vllm:request_params_n") == [1, 2, 5, 10, 20]
    assert bounds("vllm:iteration_tokens_total")[:3] == [1, 8, 16]
    # ringllm's own, for what vLLM has no name: the ring's latency, one sample per outputs message
    assert m[("ringllm:transport_latency_seconds_count", (("model_name", "tiny"),))] > 0


async def _concurrent_long_requests(server, count: int, max_tokens: int) -> None:
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as aclient:
        outs = await asyncio.gather(
            *(
                aclient.completions.create(
                    model="tiny",
                    prompt=[100 + i] * BLOCK,
                    max_tokens=max_tokens,
                    temperature=0.0,
                    extra_body={"ignore_eos": True},
                )
                for i in range(count)
            )
        )
    assert all(o.choices[0].finish_reason == "length" for o in outs)


def test_preemptions_and_busy_gauges_come_from_the_cores_steps(server):
    """Four requests that each need 14 of the 20 blocks: the core must preempt, and says so."""
    before, _ = scrape(server)
    done_before = value(before, "vllm:request_success_total", finished_reason="length")
    asyncio.run(_concurrent_long_requests(server, 4, 200))
    assert wait_for(
        lambda: value(scrape(server)[0], "vllm:request_success_total", finished_reason="length") == done_before + 4, 30
    )
    m, _ = scrape(server)
    assert value(m, "vllm:num_preemptions_total") > 0
    assert value(m, "vllm:generation_tokens_total") - value(before, "vllm:generation_tokens_total") == 800
    # recomputed prompts are looked up again: more queries than prompt tokens
    assert value(m, "vllm:prefix_cache_queries_total") - value(before, "vllm:prefix_cache_queries_total") > 4 * BLOCK
    assert value(m, "vllm:num_requests_running") == 0 and value(m, "vllm:kv_cache_usage_perc") == 0


def test_histogram_buckets_are_le_whether_values_come_one_at_a_time_or_per_message():
    """A value equal to a bound counts in that bound's bucket (Prometheus' le), both on the
    one-value path and on the sorted per-message path that inter-token latencies take."""
    from engine.entrypoints.openai.metrics import _Histogram

    values = [0.0, 0.01, 0.01, 0.02, 0.025, 0.05, 0.3, 100.0, 0.025, 0.011]
    one, many = _Histogram((0.01, 0.025, 0.05)), _Histogram((0.01, 0.025, 0.05))
    for v in values:
        one.observe(v)
    many.observe_all(list(values))
    assert one.counts == many.counts == [3, 4, 1, 2]
    assert many.buckets() == [("0.01", 3), ("0.025", 7), ("0.05", 8), ("+Inf", 10)]
    assert one.sum == pytest.approx(sum(values)) and many.sum == pytest.approx(sum(values))


async def test_each_data_parallel_rank_is_its_own_engine_series(tiny_model_dir):
    """With two EngineCores, every message's stats reach the loggers under its rank: per-rank
    loggers made by vLLM-style factories see only their rank, /metrics has engine="0" and "1"."""
    from engine import AsyncEngineArgs, AsyncLLM, SamplingParams
    from engine.entrypoints.openai.metrics import ServerMetrics
    from engine.stat_loggers import StatLoggerBase
    from tests.helpers.engine_utils import TINY

    class Ranks(StatLoggerBase):
        def __init__(self, config, engine_index: int) -> None:
            self.engine_index, self.seen = engine_index, set()

        def record(self, scheduler_stats, iteration_stats, engine_idx: int = 0) -> None:
            self.seen.add(engine_idx)

    made: list[Ranks] = []

    def factory(config, index: int) -> Ranks:
        made.append(Ranks(config, index))
        return made[-1]

    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=tiny_model_dir, data_parallel_size=2, **TINY), stat_loggers=[factory]
    )
    metrics = ServerMetrics("tiny", engine.config.model_config.max_model_len, [0, 1])
    engine.add_stat_logger(metrics)
    try:
        params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        for rank, count in ((0, 1), (1, 2)):
            for i in range(count):
                async for _ in engine.generate(
                    {"prompt_token_ids": [5, 6, 7 + i]}, params, f"r{rank}-{i}", data_parallel_rank=rank
                ):
                    pass
        deadline = time.monotonic() + 30
        while sum(s.success["length"] for s in metrics.engines.values()) < 3:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        samples = {
            (s.name, s.labels.get("engine"), s.labels.get("finished_reason")): s.value
            for f in text_string_to_metric_families(metrics.render().decode())
            for s in f.samples
        }
        assert samples[("vllm:request_success_total", "0", "length")] == 1
        assert samples[("vllm:request_success_total", "1", "length")] == 2
        assert (
            samples[("vllm:generation_tokens_total", "0", None)],
            samples[("vllm:generation_tokens_total", "1", None)],
        ) == (3, 6)
        assert [(r.engine_index, r.seen) for r in made] == [(0, {0}), (1, {1})]
    finally:
        engine.shutdown()
