"""Engine-overhead scenario (issue 4): what the frontend, the transport and the EngineCore
process cost around a model that costs almost nothing.

    python -m benchmarks.engine_overhead [--rounds 3] [--duration 2] [--quick] [--no-offline]
    (or: ringllm bench engine-overhead)

Streams: one AsyncLLM per transport (``shm`` ring, ``zmq`` baseline), both alive in this
process on one event loop (uvloop, as ``ringllm serve`` runs it; ``--asyncio-loop`` for the
default loop), on a tiny Llama with dummy weights (2 layers, hidden 64; vocab 2048 so the LM
head is cheap too, prompts given as token ids). For 1, 16, 64 and 256 concurrent streams,
each stream issues greedy DELTA requests of ``--max-tokens`` back to back for ``--duration``
s. Measured per run: generated tokens/s; the latency from the core publishing a step to the
consumer holding its RequestOutput (p50, p99; the collector carries the core's publish
time, on the same monotonic clock); the frontend's CPU time per generated token (this
process's user+system time, zmq's I/O threads included). Transports interleave per round.

Offline: the issue-3 workload (benchmarks.offline: 64 prompts x 128 tokens, the default
model, bf16, greedy) through ``LLM`` with the EngineCore in-process and in its own process,
each in a fresh worker process, interleaved over rounds.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import sys
import tempfile
import time

from benchmarks.harness import Bench, Column

log = logging.getLogger("benchmarks.engine_overhead")

STREAMS = (1, 16, 64, 256)
TRANSPORTS = ("shm", "zmq")
TINY_VOCAB = 2048


def tiny_engine_args(model_dir: str, transport: str):
    from engine import AsyncEngineArgs

    return AsyncEngineArgs(model=model_dir, transport=transport, load_format="dummy", dtype="float32",
                           max_model_len=256, max_num_seqs=256, kv_cache_memory=64 << 20, seed=0)


async def run_streams(llm, streams: int, duration: float, max_tokens: int, ids) -> dict:
    """``streams`` consumers issue requests back to back until ``duration`` has passed."""
    from engine import SamplingParams
    from engine.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                            output_kind=RequestOutputKind.DELTA)
    latencies: list[float] = []
    tokens = 0
    deadline = time.monotonic() + duration

    async def stream(i: int) -> None:
        nonlocal tokens
        while time.monotonic() < deadline:
            request_id = f"r{next(ids)}"
            prompt = {"prompt_token_ids": [(7 * i + j) % TINY_VOCAB for j in range(1, 17)]}
            collector = await llm.add_request(request_id, prompt, params)
            finished = False
            while not finished:
                out = collector.get_nowait() or await collector.get()
                latencies.append(time.monotonic() - collector.core_timestamp)
                tokens += len(out.outputs[0].token_ids)
                finished = out.finished

    cpu0, t0 = time.process_time(), time.monotonic()
    await asyncio.gather(*(stream(i) for i in range(streams)))
    elapsed, cpu = time.monotonic() - t0, time.process_time() - cpu0
    latencies.sort()
    return {"tokens_per_s": tokens / elapsed,
            "p50_us": latencies[len(latencies) // 2] * 1e6,
            "p99_us": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e6,
            "cpu_us_per_token": cpu / tokens * 1e6}


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` (zmq's I/O threads included) onto ``cpus``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cpus)


async def shutdown(engines) -> None:
    for llm in engines:
        llm.shutdown()
    await asyncio.sleep(0)  # let the cancelled output handlers finish


def offline_case(inproc: bool, a: argparse.Namespace):
    """The issue-3 batch workload in a fresh benchmarks.offline worker: tok/s, start-up, peak RSS."""
    from benchmarks import offline

    measure = offline.case("ringllm", "batch", 1, argparse.Namespace(
        model=a.offline_model, dtype="bfloat16", num_prompts=64, output_tokens=128,
        kv_cache_memory=1 << 30, max_model_len=2048, inproc=inproc))

    def run() -> dict:  # the worker inherits our CPU set: give it every CPU
        pinned = os.sched_getaffinity(0)
        pin(os.getpid(), set(range(os.cpu_count())))
        try:
            return measure()
        finally:
            pin(os.getpid(), pinned)
    return run


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="ringllm bench engine-overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=2.0, help="seconds per streams run")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--streams", default=",".join(map(str, STREAMS)))
    p.add_argument("--asyncio-loop", action="store_true",
                   help="run the frontends on asyncio's default loop instead of uvloop (the server's loop)")
    p.add_argument("--no-offline", action="store_true", help="skip the offline LLM comparison")
    p.add_argument("--no-pin", action="store_true",
                   help="do not pin this process to CPU 0 and the EngineCore processes to CPU 1")
    p.add_argument("--offline-model", default=None, help="HF directory (default: the embedded model)")
    p.add_argument("--quick", action="store_true", help="1 round, 1 s runs, no offline")
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.duration, a.no_offline = 1, 1.0, True
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from engine import AsyncLLM
    from engine.models.default_model import write_tiny_model

    loop = asyncio.new_event_loop() if a.asyncio_loop else __import__("uvloop").new_event_loop()
    asyncio.set_event_loop(loop)
    model_dir = write_tiny_model(tempfile.mkdtemp(prefix="ringllm-bench-"), vocab_size=TINY_VOCAB)
    engines = {t: AsyncLLM.from_engine_args(tiny_engine_args(model_dir, t)) for t in TRANSPORTS}
    pinned = not a.no_pin and len(os.sched_getaffinity(0)) >= 2
    if pinned:  # the frontend and the model on separate cores, as the transport scenario does
        pin(os.getpid(), {0})
        for llm in engines.values():
            pin(llm.engine_core.ready.pid, {1})
    ids = itertools.count()
    streams = [int(s) for s in a.streams.split(",")]
    bench = Bench("engine_overhead", model=f"tiny Llama, dummy weights (2 layers, hidden 64, vocab {TINY_VOCAB})")
    bench.notes.append(f"{a.duration} s per run, DELTA greedy requests of {a.max_tokens} tokens, "
                       f"{'asyncio default loop' if a.asyncio_loop else 'uvloop (as ringllm serve)'}, "
                       f"{'frontend on CPU 0, EngineCores on CPU 1' if pinned else 'not pinned'}")
    try:
        for t, llm in engines.items():  # warm both paths before anything is timed
            loop.run_until_complete(run_streams(llm, 4, 0.3, a.max_tokens, ids))
        for n in streams:
            for t, llm in engines.items():
                bench.add(f"{n} streams", t, lambda llm=llm, n=n: loop.run_until_complete(
                    run_streams(llm, n, a.duration, a.max_tokens, ids)))
        if not a.no_offline:
            bench.add("offline", "in-process", offline_case(True, a))
            bench.add("offline", "multi-process", offline_case(False, a))
        bench.run(rounds=a.rounds)
    finally:
        loop.run_until_complete(shutdown(engines.values()))
        loop.close()
    report(bench, streams, not a.no_offline)


def report(bench: Bench, streams: list[int], offline: bool) -> None:
    cols = []
    for n in streams:
        s = f"{n} streams"
        cols += [Column(f"{n}: tok/s", s, "tokens_per_s", "{:.0f}", higher_is_better=True),
                 Column(f"{n}: p50 us", s, "p50_us", "{:.0f}"),
                 Column(f"{n}: p99 us", s, "p99_us", "{:.0f}"),
                 Column(f"{n}: CPU us/tok", s, "cpu_us_per_token", "{:.1f}")]
    print()
    for n in streams:
        print(bench.table(f"{n} concurrent AsyncLLM streams", [c for c in cols if c.scenario == f"{n} streams"],
                          methods=list(TRANSPORTS)))
        print()
    print("**Ring / zmq (medians)**\n\n| streams | tok/s | p50 latency | p99 latency | frontend CPU/token |\n"
          "|---|---|---|---|---|")
    for n in streams:
        r = [bench.ratio(f"{n} streams", m, "shm", "zmq")
             for m in ("tokens_per_s", "p50_us", "p99_us", "cpu_us_per_token")]
        print(f"| {n} | " + " | ".join(f"{x:.2f}x" for x in r) + " |")
    if offline:
        print()
        print(bench.table("Offline, 64 prompts x 128 tokens (default model, bf16, greedy)",
                          [Column("tok/s", "offline", "tok_s", "{:.1f}", higher_is_better=True),
                           Column("vs in-process", "offline", "tok_s", ratio_to="in-process"),
                           Column("start-up s", "offline", "startup_s", "{:.1f}"),
                           Column("peak RSS MiB", "offline", "peak_rss_mib", "{:.0f}")],
                          methods=["in-process", "multi-process"]))
    print()
    for note in bench.notes:
        print(f"- {note}")
    for path in bench.save(plots=[c for c in cols if c.metric in ("p50_us", "cpu_us_per_token")]):
        print(f"wrote {os.path.relpath(path)}")


if __name__ == "__main__":
    sys.exit(main())
