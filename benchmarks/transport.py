"""Transport scenario: the shared-memory ring against pyzmq ipc:// (vLLM's transport, the baseline)
and multiprocessing.Pipe, carrying the same msgspec messages, every method in the same run.

    python -m benchmarks.transport [--rounds 5] [--quick] [--scenarios bw-1mib,ref-1mib] [--methods ...]
                                                               (or: ringllm bench transport)

Measures, with the two processes pinned to separate cores and methods interleaved over rounds:
round-trip p50/p99 of a small struct (one token's output) and of a 4 KiB one, with the CPU
seconds both processes spend per 1,000 round trips (spinning is not free on 2 cores); one-way
streaming of 64-byte messages with batched reads (messages/s); and 1 MiB bandwidth (GB/s).
The ring's spin budget is swept (0, 2, 10, 50 us, unbounded) to show its trade-off. For 1 MiB,
diagnostic methods run the ring with its large-message paths switched off (large bytes out of
band, the receive batch budget, both) and on a 16 MiB ring instead of 4 MiB, next to a numpy
memcpy of 1 MiB into a reused buffer and into fresh pages, so the table shows where the time
goes.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import mmap
import multiprocessing
import multiprocessing.connection
import os
import subprocess
import sys
import time
from typing import Optional

import msgspec
import numpy as np
import uvloop
import zmq
import zmq.asyncio

from benchmarks.harness import Bench, Column
from shm_transport import Channel, MsgspecCodec, ipc_dir
from shm_transport.channel import BATCH_BYTES
from shm_transport.codec import OOB_MIN

log = logging.getLogger("benchmarks.transport")


# ---------------------------------------------------------------- messages
class TokenOut(msgspec.Struct, array_like=True, omit_defaults=True):
    """About what one decode step sends back for one request."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: Optional[str] = None
    ts: float = 0.0


class Blob(msgspec.Struct, array_like=True):
    seq: int
    data: bytes


class Cmd(msgspec.Struct, array_like=True):
    op: str
    n: int = 0
    warm: int = 0
    spin_us: float = 0.0
    reader: str = "sync"
    big: bool = False
    batch_bytes: int = -1  # ring reader's receive batch budget for this command (-1: the default)


class Done(msgspec.Struct, array_like=True):
    n: int
    cpu_s: float


CODEC = MsgspecCodec({0: TokenOut, 1: Blob, 2: Cmd, 3: Done})
INF = float("inf")
SPINS = {"ring-spin0": 0.0, "ring-spin2": 2.0, "ring-spin10": 10.0, "ring-spin50": 50.0, "ring-spin-inf": INF}
ASYNC = {"ring-asyncio": "asyncio", "ring-uvloop": "uvloop", "zmq-asyncio": "asyncio"}
# 1 MiB diagnostics: the ring with this change's parts switched off, (out of band, batch budget).
VARIANTS = {
    "ring-no-budget": (True, False),
    "ring-no-oob": (False, True),
    "ring-legacy": (False, False),
    "ring-16mib": (True, True),
}
LABELS = {
    "ring-spin0": "ring, futex reader (no spin)",
    "ring-spin2": "ring, spin 2 us then futex",
    "ring-spin10": "ring, spin 10 us then futex (default)",
    "ring-spin50": "ring, spin 50 us then futex",
    "ring-spin-inf": "ring, spinning reader",
    "ring-asyncio": "ring, asyncio eventfd reader",
    "ring-uvloop": "ring, uvloop eventfd reader",
    "zmq": "pyzmq ipc:// sync (baseline)",
    "zmq-asyncio": "zmq.asyncio reader",
    "mp-pipe": "multiprocessing.Pipe",
    "ring-no-budget": "ring-spin10 with large bytes out of band but no receive batch budget",
    "ring-no-oob": "ring-spin10 with the receive batch budget but bytes fields encoded (two copies)",
    "ring-legacy": "ring-spin10 as before both (msgspec encode + copy into the ring; batches unbounded)",
    "ring-16mib": "ring-spin10 on a 16 MiB ring instead of the default 4 MiB",
    "memcpy-warm": "numpy copy of 1 MiB into a reused buffer (one core, for reference)",
    "memcpy-fresh": "numpy copy of 1 MiB into freshly mapped pages (page faults included)",
}


def small_msg() -> TokenOut:
    return TokenOut("cmpl-5f2a9c7e1b3d4a60-0", [31415], None, 1717171717.125)


def blob(size: int) -> Blob:
    """A Blob whose whole frame (kind byte + msgpack) is about ``size`` bytes."""
    b = Blob(70000, b"x" * size)
    return Blob(70000, b"x" * (2 * size - len(CODEC.encode(b))))


def run_loop(kind: str, coro):
    return (uvloop.run if kind == "uvloop" else asyncio.run)(coro)


def pin(cpu: Optional[int]) -> None:
    if cpu is not None and len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {cpu % os.cpu_count()})


# ---------------------------------------------------------------- transports (both ends)
class RingEnd:
    def __init__(self, ch: Channel) -> None:
        self.ch = ch
        self.send, self.recv, self.recv_batch = ch.send, ch.recv, ch.recv_batch  # no wrapper layer
        self.asend, self.arecv, self.arecv_batch = ch.send_async, ch.recv_async, ch.recv_batch_async

    def set_spin(self, us: float) -> None:
        self.ch.spin_us = us

    def set_batch(self, nbytes: int) -> None:
        self.ch.batch_bytes = BATCH_BYTES if nbytes < 0 else nbytes

    def close(self) -> None:
        self.ch.close()


class ZmqEnd:
    """PUSH/PULL pairs over ipc:// socket files in a private directory (shm_transport/ipc_dir.py,
    made and removed by the Driver)."""

    def __init__(self, directory: str, bind: bool) -> None:
        self.ctx = zmq.Context()
        self.push, self.pull = self.ctx.socket(zmq.PUSH), self.ctx.socket(zmq.PULL)
        a, b = f"ipc://{directory}/a", f"ipc://{directory}/b"
        if bind:
            self.push.bind(a), self.pull.bind(b)
        else:
            self.pull.connect(a), self.push.connect(b)
        self.apush = self.apull = None

    big = False  # zero-copy receives (what vLLM does for large messages)

    def send(self, m):
        frame = CODEC.encode(m)
        self.push.send(frame, copy=len(frame) < 65536)

    def recv(self, flags: int = 0):
        if self.big:
            return CODEC.decode(self.pull.recv(flags, copy=False).buffer)
        return CODEC.decode(self.pull.recv(flags))

    def recv_batch(self):
        out = [self.recv()]
        try:
            while True:
                out.append(self.recv(zmq.NOBLOCK))
        except zmq.Again:
            return out

    def set_spin(self, us: float) -> None:
        pass

    def set_batch(self, nbytes: int) -> None:
        pass

    def _async(self):
        if self.apull is None:
            self.apush = zmq.asyncio.Socket.from_socket(self.push)
            self.apull = zmq.asyncio.Socket.from_socket(self.pull)

    async def asend(self, m):
        self._async()
        await self.apush.send(CODEC.encode(m))

    async def arecv(self):
        self._async()
        return CODEC.decode(await self.apull.recv())

    async def arecv_batch(self):  # vLLM's AsyncMPClient reads one message per await
        return [await self.arecv()]

    def close(self) -> None:
        for s in (self.push, self.pull):
            s.close(linger=0)
        self.ctx.term()


class PipeEnd:
    def __init__(self, conn) -> None:
        self.conn = conn

    def send(self, m):
        self.conn.send_bytes(CODEC.encode(m))

    def recv(self):
        return CODEC.decode(self.conn.recv_bytes())

    def recv_batch(self):
        out = [self.recv()]
        while self.conn.poll(0):
            out.append(self.recv())
        return out

    def set_spin(self, us: float) -> None:
        pass

    def set_batch(self, nbytes: int) -> None:
        pass

    def close(self) -> None:
        self.conn.close()


# ---------------------------------------------------------------- peer process
def peer_main(kind: str, arg: str, cpu: Optional[int]) -> None:
    pin(cpu)
    if kind == "ring":
        end = RingEnd(Channel.attach(CODEC, arg, peer_pid=os.getppid()))
    elif kind == "zmq":
        end = ZmqEnd(arg, bind=False)
    else:
        end = PipeEnd(multiprocessing.connection.Connection(int(arg)))
    end.set_spin(0)
    while True:
        cmd = end.recv()
        if cmd.op == "quit":
            break
        end.set_spin(cmd.spin_us)
        end.set_batch(cmd.batch_bytes)
        end.big = cmd.big
        if cmd.op == "pingpong":
            end.send(Done(0, 0.0))
            for _ in range(cmd.warm):
                end.send(end.recv())
            c0 = time.process_time()
            for _ in range(cmd.n):
                end.send(end.recv())
            end.send(Done(cmd.n, time.process_time() - c0))
        elif cmd.op == "stream" and cmd.reader == "sync":
            end.send(Done(0, 0.0))
            c0, got = time.process_time(), 0
            while got < cmd.n:
                got += len(end.recv_batch())
            end.send(Done(got, time.process_time() - c0))
        elif cmd.op == "stream":
            run_loop(cmd.reader, peer_stream_async(end, cmd.n))
        end.set_spin(0)
    end.close()


async def peer_stream_async(end, n: int) -> None:
    end.send(Done(0, 0.0))
    c0, got = time.process_time(), 0
    while got < n:
        got += len(await end.arecv_batch())
    end.send(Done(got, time.process_time() - c0))


# ---------------------------------------------------------------- driver
class Driver:
    """This process's ends of the three transports, each with its pinned peer process."""

    def __init__(self, cpu: Optional[int], peer_cpu: Optional[int]) -> None:
        self.procs = []
        cmd = [sys.executable, "-m", "benchmarks.transport", "--peer"]
        cpu_arg = ["--cpu", str(peer_cpu)] if peer_cpu is not None else []
        rings = []
        for capacity in (1 << 22, 1 << 24):  # the default 4 MiB, and 16 MiB (ring-16mib)
            ch = Channel.create(CODEC, capacity=capacity)
            self.procs.append(subprocess.Popen(cmd + ["ring", ch.peer_token()] + cpu_arg, pass_fds=ch.peer_fds()))
            ch.set_peer(self.procs[-1].pid)
            ch.close_peer_fds()
            rings.append(RingEnd(ch))
        self.ring, self.ring16 = rings
        self.zmq_dir = ipc_dir.make()
        self.zmq = ZmqEnd(self.zmq_dir, bind=True)
        self.procs.append(subprocess.Popen(cmd + ["zmq", self.zmq_dir] + cpu_arg))
        mine, theirs = multiprocessing.Pipe()
        self.procs.append(subprocess.Popen(cmd + ["pipe", str(theirs.fileno())] + cpu_arg, pass_fds=[theirs.fileno()]))
        theirs.close()
        self.pipe = PipeEnd(mine)
        pin(cpu)

    def end(self, method: str):
        if method == "ring-16mib":
            return self.ring16
        return self.ring if method.startswith("ring") else self.zmq if method.startswith("zmq") else self.pipe

    def close(self) -> None:
        for end in (self.ring, self.ring16, self.zmq, self.pipe):
            try:
                end.send(Cmd("quit"))
            except Exception:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for end in (self.ring, self.ring16, self.zmq, self.pipe):
            end.close()
        ipc_dir.remove(self.zmq_dir)

    def pingpong(self, method: str, msg, n: int, warm: int) -> dict:
        end = self.end(method)
        spin = SPINS.get(method, 10.0)
        end.set_spin(spin)
        end.send(Cmd("pingpong", n=n, warm=warm, spin_us=10.0 if method in ASYNC else spin))
        end.recv()  # the peer is ready
        if method in ASYNC:
            lat, cpu = run_loop(ASYNC[method], self._pingpong_async(end, msg, n, warm))
        else:
            for _ in range(warm):
                end.send(msg)
                end.recv()
            lat, c0 = [], time.process_time()
            clock = time.perf_counter_ns
            for _ in range(n):
                t0 = clock()
                end.send(msg)
                end.recv()
                lat.append(clock() - t0)
            cpu = time.process_time() - c0
        end.set_spin(0)
        done = end.recv()
        lat.sort()
        return {
            "p50_us": lat[len(lat) // 2] / 1e3,
            "p99_us": lat[int(len(lat) * 0.99)] / 1e3,
            "cpu_ms_per_1k": (cpu + done.cpu_s) / n * 1e6,
        }

    async def _pingpong_async(self, end, msg, n: int, warm: int):
        for _ in range(warm):
            await end.asend(msg)
            await end.arecv()
        lat, c0 = [], time.process_time()
        clock = time.perf_counter_ns
        for _ in range(n):
            t0 = clock()
            await end.asend(msg)
            await end.arecv()
            lat.append(clock() - t0)
        return lat, time.process_time() - c0

    def stream(self, method: str, msg, n: int) -> dict:
        end = self.end(method)
        spin = SPINS.get(method, 10.0)
        reader = ASYNC.get(method, "sync")
        oob, budget = VARIANTS.get(method, (True, True))
        end.set_spin(spin)
        if not oob:
            self.ring.ch.oob_min = 1 << 62  # every bytes field encoded by msgspec
        size = len(CODEC.encode(msg))
        end.send(Cmd("stream", n=n, spin_us=spin, reader=reader, big=size >= 65536, batch_bytes=-1 if budget else 0))
        end.recv()
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            end.send(msg)
        done = end.recv()
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
        end.set_spin(0)
        self.ring.ch.oob_min = OOB_MIN
        assert done.n == n, f"{method}: peer received {done.n} of {n}"
        return {
            "mmsgs_per_s": n / elapsed / 1e6,
            "gb_per_s": n * size / elapsed / 1e9,
            "cpu_ms_per_1k": (cpu + done.cpu_s) / n * 1e6,
        }


def memcpy_ref(fresh: bool, n: int = 100) -> dict:
    """1 MiB copies on this core, for reference: into one reused buffer, or each into freshly
    mapped anonymous pages (what a copy costs when every page must fault in first)."""
    src = np.frombuffer(os.urandom(1 << 20), dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    t0 = time.perf_counter()
    for _ in range(n):
        if fresh:
            mem = mmap.mmap(-1, 1 << 20)
            out = np.frombuffer(mem, dtype=np.uint8)
            np.copyto(out, src)
            del out
            mem.close()
        else:
            np.copyto(dst, src)
    return {"gb_per_s": n * (1 << 20) / (time.perf_counter() - t0) / 1e9}


# ---------------------------------------------------------------- the scenario
RT_METHODS = list(SPINS) + ["ring-asyncio", "ring-uvloop", "zmq", "zmq-asyncio", "mp-pipe"]
MAIN_METHODS = [
    "ring-spin0",
    "ring-spin10",
    "ring-spin-inf",
    "ring-asyncio",
    "ring-uvloop",
    "zmq",
    "zmq-asyncio",
    "mp-pipe",
]
ALL_METHODS = RT_METHODS + list(VARIANTS) + ["memcpy-warm", "memcpy-fresh"]


SCENARIOS = ["rt-small", "rt-4k", "stream-64b", "bw-1mib", "ref-1mib"]


def build(
    bench: Bench, drv: Driver, quick: bool, scenarios: Optional[list[str]] = None, methods: Optional[list[str]] = None
) -> None:
    k = 0.05 if quick else 1.0
    n_rt, n_rt4k, n_stream, n_bw = (max(int(x * k), 20) for x in (3000, 2000, 100_000, 1500))
    small, b4k, b64, b1m = small_msg(), blob(4096), blob(64), blob(1 << 20)

    def add(scenario, method_list, fn):
        if scenarios and scenario not in scenarios:
            return
        for m in method_list:
            if not methods or m in methods:
                bench.add(scenario, m, lambda m=m: fn(m))

    add("rt-small", RT_METHODS, lambda m: drv.pingpong(m, small, n_rt, 200))
    add("rt-4k", MAIN_METHODS, lambda m: drv.pingpong(m, b4k, n_rt4k, 100))
    add("stream-64b", MAIN_METHODS, lambda m: drv.stream(m, b64, n_stream // (10 if m == "zmq-asyncio" else 1)))
    # 1.5 GiB per measurement (a fifth for the two slowest), so that one scheduling hiccup on
    # these shared cores does not decide a ~0.3 s window
    add(
        "bw-1mib",
        MAIN_METHODS + list(VARIANTS),
        lambda m: drv.stream(m, b1m, n_bw // (5 if m in ("zmq-asyncio", "mp-pipe") else 1)),
    )
    add("ref-1mib", ["memcpy-warm", "memcpy-fresh"], lambda m: memcpy_ref(m == "memcpy-fresh"))


def targets(bench: Bench) -> list[tuple[str, bool, str]]:
    """The issue's targets, each as (name, holds, numbers)."""

    def med(s, m, k):
        return bench.stat(s, m, k).median

    out = []

    def check(name, value, bound, higher, unit):
        if math.isnan(value) or math.isnan(bound):
            return  # not measured in this run (--scenarios / --methods)
        ok = value >= bound if higher else value <= bound
        out.append((name, ok, f"{value:.3g} {unit} vs {'>=' if higher else '<='} {bound:.3g} {unit}"))

    zs, za = med("rt-small", "zmq", "p50_us"), med("rt-small", "zmq-asyncio", "p50_us")
    check(
        "sync reader (spin 10 us, then futex) RT p50 <= pyzmq sync / 30",
        med("rt-small", "ring-spin10", "p50_us"),
        zs / 30,
        False,
        "us",
    )
    check(
        "asyncio/eventfd reader RT p50 <= zmq.asyncio / 8 (default loop)",
        med("rt-small", "ring-asyncio", "p50_us"),
        za / 8,
        False,
        "us",
    )
    check(
        "asyncio/eventfd reader RT p50 <= zmq.asyncio / 30 (uvloop)",
        med("rt-small", "ring-uvloop", "p50_us"),
        za / 30,
        False,
        "us",
    )
    ring64 = med("stream-64b", "ring-spin10", "mmsgs_per_s")
    check(
        "64 B streaming, batched reads >= 2x pyzmq sync",
        ring64,
        2 * med("stream-64b", "zmq", "mmsgs_per_s"),
        True,
        "M msg/s",
    )
    check(
        "64 B streaming, batched reads >= 15x a zmq.asyncio reader",
        ring64,
        15 * med("stream-64b", "zmq-asyncio", "mmsgs_per_s"),
        True,
        "M msg/s",
    )
    check(
        "asyncio ring reader, 64 B streaming >= 15x a zmq.asyncio reader",
        med("stream-64b", "ring-asyncio", "mmsgs_per_s"),
        15 * med("stream-64b", "zmq-asyncio", "mmsgs_per_s"),
        True,
        "M msg/s",
    )
    check(
        "1 MiB bandwidth >= 3x pyzmq",
        med("bw-1mib", "ring-spin10", "gb_per_s"),
        3 * med("bw-1mib", "zmq", "gb_per_s"),
        True,
        "GB/s",
    )
    return out


def report(bench: Bench) -> str:
    rt = [
        Column("small p50 us", "rt-small", "p50_us"),
        Column("small p99 us", "rt-small", "p99_us"),
        Column("p50 vs pyzmq", "rt-small", "p50_us", ratio_to="zmq"),
        Column("CPU ms / 1k RT", "rt-small", "cpu_ms_per_1k"),
        Column("4 KiB p50 us", "rt-4k", "p50_us"),
        Column("4 KiB p99 us", "rt-4k", "p99_us"),
    ]
    st = [
        Column("64 B M msg/s", "stream-64b", "mmsgs_per_s", fmt="{:.3g}", higher_is_better=True),
        Column("vs pyzmq", "stream-64b", "mmsgs_per_s", ratio_to="zmq", higher_is_better=True),
        Column("vs zmq.asyncio", "stream-64b", "mmsgs_per_s", ratio_to="zmq-asyncio", higher_is_better=True),
        Column("64 B CPU us/msg", "stream-64b", "cpu_ms_per_1k"),
        Column("1 MiB GB/s", "bw-1mib", "gb_per_s", higher_is_better=True),
        Column("vs pyzmq", "bw-1mib", "gb_per_s", ratio_to="zmq", higher_is_better=True),
        Column("1 MiB CPU us/msg", "bw-1mib", "cpu_ms_per_1k", fmt="{:.0f}"),
    ]
    bw = [
        Column("1 MiB GB/s", "bw-1mib", "gb_per_s", higher_is_better=True),
        Column("vs pyzmq", "bw-1mib", "gb_per_s", ratio_to="zmq", higher_is_better=True),
        Column("1 MiB CPU us/msg", "bw-1mib", "cpu_ms_per_1k", fmt="{:.0f}"),
        Column("memcpy GB/s", "ref-1mib", "gb_per_s", higher_is_better=True),
    ]
    ran = set(bench.methods())
    scenarios = {c[0] for c in bench.cases}
    lines = []
    if scenarios & {"rt-small", "rt-4k"}:
        lines += [bench.table("Round trip (ping-pong)", rt, [m for m in RT_METHODS if m in ran]), ""]
    if scenarios & {"stream-64b", "bw-1mib"}:
        lines += [bench.table("One-way streaming (batched reads)", st, [m for m in MAIN_METHODS if m in ran]), ""]
    diag = [m for m in ["ring-spin10"] + list(VARIANTS) + ["zmq", "memcpy-warm", "memcpy-fresh"] if m in ran]
    if scenarios & {"bw-1mib", "ref-1mib"} and diag:
        lines += [bench.table("1 MiB: the ring with its large-message paths switched off, and memcpy", bw, diag), ""]
    lines.append("Targets:")
    for name, ok, numbers in targets(bench):
        lines.append(f"- {'PASS' if ok else 'FAIL'}: {name} ({numbers})")
    lines += ["", "Methods: " + "; ".join(f"{k} = {v}" for k, v in LABELS.items())]
    lines += [f"Note: {n}" for n in bench.notes]
    return "\n".join(lines)


def _subset(ap: argparse.ArgumentParser, text: Optional[str], known: list[str]) -> Optional[list[str]]:
    if not text:
        return None
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in known]
    if unknown:
        ap.error(f"unknown: {', '.join(unknown)} (choose from {', '.join(known)})")
    return names


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="ringllm bench transport", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians and spread over them)")
    ap.add_argument("--quick", action="store_true", help="5%% of the message counts (a smoke run)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the two processes to separate cores")
    ap.add_argument("--scenarios", default=None, help=f"comma-separated subset of {','.join(SCENARIOS)} (default: all)")
    ap.add_argument("--methods", default=None, help=f"comma-separated subset of {','.join(ALL_METHODS)} (default: all)")
    ap.add_argument("--out", default=None, help="folder for JSON and PNG (default benchmarks/out)")
    ap.add_argument("--peer", nargs=2, metavar=("KIND", "ARG"), help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peer:
        peer_main(args.peer[0], args.peer[1], args.cpu)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    pins = (None, None) if args.no_pin or (os.cpu_count() or 1) < 2 else (0, 1)
    bench = Bench("transport", model="n/a (transport only)")
    drv = Driver(*pins)
    try:
        build(bench, drv, args.quick, _subset(ap, args.scenarios, SCENARIOS), _subset(ap, args.methods, ALL_METHODS))
        bench.run(rounds=args.rounds, progress=log.info)
    finally:
        drv.close()
    bench.notes.append("processes pinned to CPUs 0 and 1" if pins[0] is not None else "processes not pinned")
    text = report(bench)
    print(text)
    kw = {"out_dir": args.out} if args.out else {}
    paths = bench.save(
        extra={"targets": [{"target": n, "holds": ok, "numbers": s} for n, ok, s in targets(bench)], "labels": LABELS},
        plots=[
            Column("RT p50 small (us)", "rt-small", "p50_us"),
            Column("CPU ms per 1k RT", "rt-small", "cpu_ms_per_1k"),
            Column("64 B stream (M msg/s)", "stream-64b", "mmsgs_per_s", higher_is_better=True),
            Column("1 MiB (GB/s)", "bw-1mib", "gb_per_s", higher_is_better=True),
        ],
        **kw,
    )
    print("\nwrote " + ", ".join(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
