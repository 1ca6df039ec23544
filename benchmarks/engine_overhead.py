"""Engine-overhead scenario: what the frontend, the transport and the EngineCore
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

A third method, ``none``, takes the transport out to show what is left: the same AsyncLLM,
consumers and requests, with the EngineCore client replaced by ``SimulatedCore``, which lives
in this process and answers each ``get_outputs_async`` with one step giving every request it
holds one token (its own CPU time is measured and taken out). What ``none`` costs is the
frontend's shared per-output work (input and output processing, collectors, waking the
consumers, the consumers themselves); shm or zmq minus ``none`` is what the transport adds.
Each run also reports the CPU time of the output processing alone (``process_outputs``,
which hands each output to its collector) and the p50 of the transport latency proper (the
core's publish stamp to the output handler holding the decoded message). A note gives the CPU
time of admitting one request alone (``AsyncLLM.add_request`` on the simulated core).

Offline: the offline scenario's workload (benchmarks.offline: 64 prompts x 128 tokens, the default
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
METHODS = (*TRANSPORTS, "none")
TINY_VOCAB = 2048


def tiny_engine_args(model_dir: str, transport: str):
    from engine import AsyncEngineArgs

    return AsyncEngineArgs(
        model=model_dir,
        transport=transport,
        load_format="dummy",
        dtype="float32",
        max_model_len=256,
        max_num_seqs=256,
        kv_cache_memory=64 << 20,
        seed=0,
    )


class SimulatedCore:
    """The EngineCore client of method ``none``: no process, no transport. Each
    ``get_outputs_async`` is one step: one token for every request held (a request ends at
    its max_tokens), stamped as published when made. ``cpu`` is the thread time it spent."""

    dead_error = None

    def __init__(self) -> None:
        self.requests: dict[str, list[int]] = {}  # id -> [tokens left, next token id]
        self.cpu = 0.0
        self._waiter = None

    async def add_request_async(self, request, data_parallel_rank=None) -> None:
        self.requests[request.request_id] = [request.sampling_params.max_tokens, request.prompt_token_ids[-1]]
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def abort_requests_nowait(self, request_ids) -> None:
        for request_id in request_ids:
            self.requests.pop(request_id, None)

    def requests_finished(self, request_ids) -> None:
        """Nothing to count: one "core"."""

    async def get_outputs_async(self):
        from engine.wire_messages import EngineCoreOutput, EngineCoreOutputs, FinishReason

        await asyncio.sleep(0)  # the consumers run (and add requests) while the "core" steps
        while not self.requests:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        start = time.thread_time()
        outputs = []
        for request_id, state in list(self.requests.items()):
            state[0] -= 1
            token = state[1] = 256 + (state[1] * 31 + 7) % (TINY_VOCAB - 256)  # text tokens, varied
            if state[0] > 0:
                outputs.append(EngineCoreOutput(request_id, [token]))
            else:
                outputs.append(EngineCoreOutput(request_id, [token], finish_reason=FinishReason.LENGTH))
                del self.requests[request_id]
        batch = EngineCoreOutputs(0, outputs, time.monotonic())
        self.cpu += time.thread_time() - start
        return [batch]

    async def call_utility_async(self, method: str, *args, engine_index: int = 0):
        return None

    def shutdown(self, timeout: float = 5.0) -> None:
        self.requests.clear()


def simulated_engine(model_dir: str):
    """An AsyncLLM whose EngineCore client is a SimulatedCore (method ``none``)."""
    from unittest import mock

    import engine.async_llm
    from engine import AsyncLLM

    core = SimulatedCore()
    with mock.patch.object(engine.async_llm, "make_client", lambda *args: core):
        return AsyncLLM.from_engine_args(tiny_engine_args(model_dir, "shm"))


def count_output_processing(llm) -> list[float]:
    """Wrap ``llm``'s process_outputs to add its thread time to the returned cell."""
    processor, cell = llm.output_processor, [0.0]
    process = type(processor).process_outputs

    def timed(*args, **kwargs):
        start = time.thread_time()
        try:
            return process(processor, *args, **kwargs)
        finally:
            cell[0] += time.thread_time() - start

    processor.process_outputs = timed
    return cell


async def run_streams(llm, streams: int, duration: float, max_tokens: int, ids) -> dict:
    """``streams`` consumers issue requests back to back until ``duration`` has passed."""
    from engine import SamplingParams
    from engine.sampling_params import RequestOutputKind

    params = SamplingParams(
        max_tokens=max_tokens, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.DELTA
    )
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

    simulated = llm.engine_core if isinstance(llm.engine_core, SimulatedCore) else None
    processing = getattr(llm, "_bench_processing", None) or count_output_processing(llm)
    llm._bench_processing = processing
    llm.take_transport_latencies()
    processing[0] = 0.0
    sim0 = simulated.cpu if simulated else 0.0
    cpu0, t0 = time.process_time(), time.monotonic()
    await asyncio.gather(*(stream(i) for i in range(streams)))
    elapsed, cpu = time.monotonic() - t0, time.process_time() - cpu0
    if simulated:
        cpu -= simulated.cpu - sim0
    latencies.sort()
    transport = sorted(llm.take_transport_latencies())
    return {
        "tokens_per_message": tokens / max(1, len(transport)),
        "tokens_per_s": tokens / elapsed,
        "p50_us": latencies[len(latencies) // 2] * 1e6,
        "p99_us": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e6,
        "cpu_us_per_token": cpu / tokens * 1e6,
        "processing_us_per_token": processing[0] / tokens * 1e6,
        "transport_p50_us": transport[len(transport) // 2] * 1e6 if transport else 0.0,
    }


async def admit_us_per_request(llm, ids, requests: int = 500) -> float:
    """CPU time of one ``AsyncLLM.add_request`` (the streams' prompt and params) on the ``none``
    engine: admission alone, per request, min over 5 batches. Nothing in a batch yields to the
    loop (its prompts are admitted inline, the simulated core takes them at once), so the
    output handler does not run in between; each batch is aborted after it."""
    from engine import SamplingParams
    from engine.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=64, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.DELTA)
    best = float("inf")
    for _ in range(5):
        batch = [f"admit{next(ids)}" for _ in range(requests)]
        start = time.thread_time()
        for i, request_id in enumerate(batch):
            await llm.add_request(
                request_id, {"prompt_token_ids": [(7 * i + j) % TINY_VOCAB for j in range(1, 17)]}, params
            )
        best = min(best, (time.thread_time() - start) / requests)
        await llm.abort(batch)
    return best * 1e6


def decode_us_per_output(outputs: int = 256) -> float:
    """CPU time to decode one OUTPUTS message (as both transports do, with the engine's codec),
    per output: ``outputs`` one-token outputs, min over 5 repeats of 200 decodes."""
    from engine.core.launch import make_codec
    from engine.wire_messages import EngineCoreOutput, EngineCoreOutputs, SchedulerStats

    codec = make_codec()
    message = EngineCoreOutputs(
        0,
        [EngineCoreOutput(f"r{i}-{i}", [300 + i]) for i in range(outputs)],
        time.monotonic(),
        SchedulerStats(outputs, 0, 0.1, 0, 0, 0),
    )
    frame = codec.encode(message)
    best = float("inf")
    for _ in range(5):
        start = time.thread_time()
        for _ in range(200):
            codec.decode(frame)
        best = min(best, (time.thread_time() - start) / 200 / outputs)
    return best * 1e6


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` (zmq's I/O threads included) onto ``cpus``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cpus)


async def shutdown(engines) -> None:
    for llm in engines:
        llm.shutdown()
    await asyncio.sleep(0)  # let the cancelled output handlers finish


def offline_case(inproc: bool, a: argparse.Namespace):
    """The offline scenario's batch workload in a fresh benchmarks.offline worker: tok/s, start-up, peak RSS."""
    from benchmarks import offline

    measure = offline.case(
        "ringllm",
        "batch",
        1,
        argparse.Namespace(
            model=a.offline_model,
            dtype="bfloat16",
            num_prompts=64,
            output_tokens=128,
            kv_cache_memory=1 << 30,
            max_model_len=2048,
            inproc=inproc,
        ),
    )

    def run() -> dict:  # the worker inherits our CPU set: give it every CPU
        pinned = os.sched_getaffinity(0)
        pin(os.getpid(), set(range(os.cpu_count())))
        try:
            return measure()
        finally:
            pin(os.getpid(), pinned)

    return run


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="ringllm bench engine-overhead", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=2.0, help="seconds per streams run")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--streams", default=",".join(map(str, STREAMS)))
    p.add_argument(
        "--asyncio-loop",
        action="store_true",
        help="run the frontends on asyncio's default loop instead of uvloop (the server's loop)",
    )
    p.add_argument("--no-offline", action="store_true", help="skip the offline LLM comparison")
    p.add_argument(
        "--no-pin", action="store_true", help="do not pin this process to CPU 0 and the EngineCore processes to CPU 1"
    )
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
    engines["none"] = simulated_engine(model_dir)
    pinned = not a.no_pin and len(os.sched_getaffinity(0)) >= 2
    if pinned:  # the frontend and the model on separate cores, as the transport scenario does
        pin(os.getpid(), {0})
        for t in TRANSPORTS:
            pin(engines[t].engine_core.ready.pid, {1})
    ids = itertools.count()
    streams = [int(s) for s in a.streams.split(",")]
    bench = Bench("engine_overhead", model=f"tiny Llama, dummy weights (2 layers, hidden 64, vocab {TINY_VOCAB})")
    bench.notes.append(
        f"decoding an OUTPUTS message costs {decode_us_per_output():.2f} us of CPU per output "
        "(256 one-token outputs, the engine's codec; both transports decode the same bytes)"
    )
    bench.notes.append(
        f"{a.duration} s per run, DELTA greedy requests of {a.max_tokens} tokens, "
        f"{'asyncio default loop' if a.asyncio_loop else 'uvloop (as ringllm serve)'}, "
        f"{'frontend on CPU 0, EngineCores on CPU 1' if pinned else 'not pinned'}"
    )
    try:
        for t, llm in engines.items():  # warm both paths before anything is timed
            loop.run_until_complete(run_streams(llm, 4, 0.3, a.max_tokens, ids))
        bench.notes.append(
            "admitting a request costs "
            f"{loop.run_until_complete(admit_us_per_request(engines['none'], ids)):.1f}"
            " us of CPU (AsyncLLM.add_request of 16 prompt ids, on the simulated core)"
        )
        for n in streams:
            for t, llm in engines.items():
                bench.add(
                    f"{n} streams",
                    t,
                    lambda llm=llm, n=n: loop.run_until_complete(run_streams(llm, n, a.duration, a.max_tokens, ids)),
                )
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
        cols += [
            Column(f"{n}: tok/s", s, "tokens_per_s", "{:.0f}", higher_is_better=True),
            Column(f"{n}: p50 us", s, "p50_us", "{:.0f}"),
            Column(f"{n}: p99 us", s, "p99_us", "{:.0f}"),
            Column(f"{n}: CPU us/tok", s, "cpu_us_per_token", "{:.1f}"),
            Column(f"{n}: processing us/tok", s, "processing_us_per_token", "{:.1f}"),
            Column(f"{n}: transport p50 us", s, "transport_p50_us", "{:.0f}"),
            Column(f"{n}: tok/msg", s, "tokens_per_message", "{:.0f}"),
        ]
    print()
    for n in streams:
        print(
            bench.table(
                f"{n} concurrent AsyncLLM streams",
                [c for c in cols if c.scenario == f"{n} streams"],
                methods=list(METHODS),
            )
        )
        print()
    print(
        "**What the transport adds (medians): method minus `none`**\n\n"
        "| streams | CPU us/tok shm | CPU us/tok zmq | p50 us shm | p50 us zmq |\n|---|---|---|---|---|"
    )
    for n in streams:
        s = f"{n} streams"
        d = [
            bench.stat(s, m, metric).median - bench.stat(s, "none", metric).median
            for metric in ("cpu_us_per_token", "p50_us")
            for m in TRANSPORTS
        ]
        print(f"| {n} | {d[0]:+.1f} | {d[1]:+.1f} | {d[2]:+.0f} | {d[3]:+.0f} |")
    print()
    if 1 in streams:  # one output per message: what the transport costs per message
        per_message = {
            m: bench.stat("1 streams", m, "cpu_us_per_token").median
            - bench.stat("1 streams", "none", "cpu_us_per_token").median
            for m in TRANSPORTS
        }
        print(
            "Transport CPU per message (1 stream, method minus `none`): "
            + ", ".join(f"{m} {v:.0f} us" for m, v in per_message.items())
            + "; spread over the tokens of "
            "a message at N streams: "
            + "; ".join(
                f"{n}: "
                + ", ".join(
                    f"{m} {per_message[m] / bench.stat(f'{n} streams', m, 'tokens_per_message').median:.1f}"
                    for m in TRANSPORTS
                )
                for n in streams
            )
            + " us/token"
        )
        print()
    print(
        "**Ring / zmq (medians)**\n\n| streams | tok/s | p50 latency | p99 latency | frontend CPU/token |\n"
        "|---|---|---|---|---|"
    )
    for n in streams:
        r = [
            bench.ratio(f"{n} streams", m, "shm", "zmq")
            for m in ("tokens_per_s", "p50_us", "p99_us", "cpu_us_per_token")
        ]
        print(f"| {n} | " + " | ".join(f"{x:.2f}x" for x in r) + " |")
    if offline:
        print()
        print(
            bench.table(
                "Offline, 64 prompts x 128 tokens (default model, bf16, greedy)",
                [
                    Column("tok/s", "offline", "tok_s", "{:.1f}", higher_is_better=True),
                    Column("vs in-process", "offline", "tok_s", ratio_to="in-process"),
                    Column("start-up s", "offline", "startup_s", "{:.1f}"),
                    Column("peak RSS MiB", "offline", "peak_rss_mib", "{:.0f}"),
                ],
                methods=["in-process", "multi-process"],
            )
        )
    print()
    for note in bench.notes:
        print(f"- {note}")
    for path in bench.save(plots=[c for c in cols if c.metric in ("p50_us", "cpu_us_per_token")]):
        print(f"wrote {os.path.relpath(path)}")


if __name__ == "__main__":
    sys.exit(main())
