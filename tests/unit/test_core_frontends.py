"""The EngineCore's one busy loop (engine/core/engine_core_proc.py; the attachment in
engine/core/frontends.py), with real rings and a stub in place of the EngineCore (no model, no
process): by default it serves the launch channel alone; with an attacher each API server's
channel arrives over the attach socket and gets READY, outputs go back only to the ring their
request came from, and an API server that closes its channel has its requests aborted while the
others are served on."""

from __future__ import annotations

import json
import os
import socket
import threading

from engine.core.engine_core_proc import EngineCoreProc
from engine.core.frontends import FrontendAttacher
from engine.core.launch import make_codec
from engine.sampling_params import SamplingParams
from engine.wire_messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineReady,
    FinishReason,
    SchedulerStats,
    Shutdown,
)
from shm_transport import Channel
from shm_transport.handoff import send_peer_end

READY = EngineReady(engine_index=0, pid=os.getpid(), num_kv_blocks=8, config_digest="0" * 64)


class StubCore:
    """One token per live request per step; a request ends after ``max_tokens`` of them."""

    log_stats = True

    def __init__(self) -> None:
        self.live: dict[str, list] = {}
        self.aborted: list[str] = []

    def add_request(self, req: EngineCoreRequest, params_verified: bool = False) -> None:
        self.live[req.request_id] = [req.sampling_params.max_tokens]

    def abort_requests(self, ids) -> None:
        for req_id in ids:
            if self.live.pop(req_id, None) is not None:
                self.aborted.append(req_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.live)

    def step(self) -> EngineCoreOutputs:
        outs = []
        for req_id, left in list(self.live.items()):
            left[0] -= 1
            done = left[0] == 0
            outs.append(EngineCoreOutput(req_id, [7], finish_reason=FinishReason.LENGTH if done else None))
            if done:
                del self.live[req_id]
        return EngineCoreOutputs(0, outs, 0.0, SchedulerStats(len(self.live), 0, 0.0, prefix_cache_queries=1))

    def stats_only(self) -> EngineCoreOutputs:
        return EngineCoreOutputs(0, [], 0.0, SchedulerStats(len(self.live)))


def _serve(proc: EngineCoreProc) -> None:
    """As the core's main runs the loop: until SHUTDOWN, then the attached channels are closed."""
    try:
        proc.run_busy_loop()
    finally:
        proc.close()


def _request(req_id: str, max_tokens: int) -> EngineCoreRequest:
    return EngineCoreRequest(req_id, [1, 2, 3], SamplingParams(max_tokens=max_tokens))


def _outputs_until(channel: Channel, done) -> list[EngineCoreOutputs]:
    got: list = []
    while not done(got):
        got += [m for m in channel.recv_batch(timeout=10) if isinstance(m, EngineCoreOutputs)]
    return got


def _ids(messages) -> set[str]:
    return {o.request_id for m in messages for o in m.outputs}


def _finished(req_id: str):
    return lambda got: any(o.request_id == req_id and o.finished for m in got for o in m.outputs)


def test_outputs_go_back_to_their_api_server_and_a_closed_one_loses_only_its_requests():
    launcher, core_end = Channel.pair(make_codec(), capacity=1 << 16)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    core = StubCore()
    proc = EngineCoreProc(core, core_end, 0, FrontendAttacher(theirs, "shm", READY))
    loop = threading.Thread(target=_serve, args=(proc,))
    loop.start()
    servers = []
    try:
        for _ in range(2):
            ch = Channel.create(make_codec(), capacity=1 << 16)
            ch.set_peer(os.getpid())
            send_peer_end(ours, ch, json.dumps({"pid": os.getpid()}).encode())
            ch.close_peer_fds()
            servers.append(ch)
            assert isinstance(ch.recv(timeout=10), EngineReady)
        a, b = servers
        a.send(_request("a-long", 10**6))
        a.send(_request("a-short", 3))
        b.send(_request("b-long", 10**6))
        b.send(_request("b-short", 3))
        got_a = _outputs_until(a, _finished("a-short"))
        got_b = _outputs_until(b, _finished("b-short"))
        assert _ids(got_a) == {"a-long", "a-short"} and _ids(got_b) == {"b-long", "b-short"}
        # each step's gauges reach both; its counters only one of them (so that sums count them once)
        assert all(m.scheduler_stats is not None for m in got_a + got_b)
        assert {sum(m.scheduler_stats.prefix_cache_queries for m in got) > 0 for got in (got_a, got_b)} == {True, False}
        a.close()
        got_b = _outputs_until(b, lambda got: "a-long" in core.aborted and len(got) > 2)
        assert core.aborted == ["a-long"] and _ids(got_b) == {"b-long"} and "b-long" in core.live
    finally:
        launcher.send(Shutdown())
        loop.join(10)
        for ch in servers + [launcher]:
            ch.close()
        ours.close()
        theirs.close()
    assert not loop.is_alive()


def test_by_default_the_launch_channel_is_the_one_frontend_and_its_shutdown_ends_the_loop():
    frontend, core_end = Channel.pair(make_codec(), capacity=1 << 16)
    core = StubCore()
    proc = EngineCoreProc(core, core_end, 0)
    loop = threading.Thread(target=_serve, args=(proc,))
    loop.start()
    try:
        frontend.send(_request("a", 3))
        frontend.send(_request("b", 5))
        got = _outputs_until(frontend, _finished("b"))
        assert _ids(got) == {"a", "b"} and sum(len(o.new_token_ids) for m in got for o in m.outputs) == 8
        assert sum(m.scheduler_stats.prefix_cache_queries for m in got) > 0  # the one frontend counts
        frontend.send(Shutdown())
        loop.join(10)
        assert not loop.is_alive()
    finally:
        if loop.is_alive():
            frontend.send(Shutdown())
            loop.join(10)
        frontend.close()
        core_end.close()
