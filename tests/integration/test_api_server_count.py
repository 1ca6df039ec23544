"""``ringllm serve --api-server-count 2``: two API-server processes on one port over one EngineCore.

One launcher for the module (tests run in file order, the core's death last). Shown, through
real HTTP: connections land on both API servers and /metrics on either sums them; a killed API
server costs only its own streams (the core aborts them and frees their KV blocks, the other
server's streams go on) and is replaced in its slot; a killed core ends every API server and
the launcher exits 1, leaving nothing behind (the conftest leak fixture).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from typing import Optional

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.entrypoints.openai.api_server_pool import admission_shares, check_pool_args
from engine.entrypoints.openai.metrics_fanin import merge
from tests.helpers.openai_server_utils import RINGLLM, TINY_SERVE_ARGS, RemoteServer, descendants, parse_sse, wait_for

PROMPT = "The capital of France is"
LONG = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8000, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def long_model(tmp_path_factory) -> str:
    from engine.models.default_model import write_tiny_model

    return write_tiny_model(str(tmp_path_factory.mktemp("tiny-asc")), max_position_embeddings=8192)


@pytest.fixture(scope="module")
def server(long_model, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("asc-tmp"))  # the launcher's private metrics directory lands here
    with RemoteServer(
        long_model, *TINY_SERVE_ARGS, "--served-model-name", "tiny", "--api-server-count", "2", env={"TMPDIR": tmp}
    ) as remote:
        remote.tmp = tmp
        assert wait_for(lambda: _both_serving(remote), 60, 0.1)  # /health answered: one of them, at least
        yield remote


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def api_pids(server) -> set[int]:
    return {p for p in descendants(server.proc.pid) if "api_server_proc" in _cmdline(p)}


def core_pid(server) -> int:
    (pid,) = [p for p in descendants(server.proc.pid) if "engine.core" in _cmdline(p)]
    return pid


def _both_serving(server) -> bool:
    try:
        return len(local_metrics(server)) == 2
    except (OSError, ValueError, aiohttp.ClientError):
        return False


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def _local_metrics(path: str) -> dict[str, float]:
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path)) as session:
        async with session.get("http://localhost/metrics?scope=local") as resp:
            return _samples(await resp.text())


def local_metrics(server) -> dict[int, dict[str, float]]:
    """Each API server's own figures, by pid, through its socket in the private directory."""
    (fanin_dir,) = [os.path.join(server.tmp, d) for d in os.listdir(server.tmp) if d.startswith("ringllm-metrics-")]
    return {pid: asyncio.run(_local_metrics(os.path.join(fanin_dir, f"api-{pid}.sock"))) for pid in api_pids(server)}


def _fresh_completion(server) -> openai.types.Completion:
    """One request on a connection of its own (a new client), so the kernel picks the server anew."""
    with openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0) as client:
        return client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, extra_body={"ignore_eos": True})


def test_shares_of_the_admission_limit_sum_to_it():
    assert admission_shares(None, 2) == [None, None]
    assert admission_shares(5, 2) == [3, 2] and admission_shares(4, 4) == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="max-waiting-requests"):
        admission_shares(1, 2)


def test_what_several_api_servers_cannot_share_is_refused_naming_the_flag():
    from engine.config import AsyncEngineArgs

    with pytest.raises(ValueError, match="--transport shm"):
        check_pool_args(2, AsyncEngineArgs(transport="zmq"))
    with pytest.raises(ValueError, match="--data-parallel-external-lb"):
        check_pool_args(2, AsyncEngineArgs(data_parallel_size=2, data_parallel_external_lb=True))
    check_pool_args(2, AsyncEngineArgs(data_parallel_size=2))  # each API server balances over the ranks
    with pytest.raises(ValueError, match="--api-server-count must be >= 1"):
        check_pool_args(0, AsyncEngineArgs())


def test_merge_sums_counters_and_histograms_and_keeps_the_first_gauge():
    a = (
        '# HELP c_total c\n# TYPE c_total counter\nc_total{x="1"} 2.0\n'
        "# HELP g g\n# TYPE g gauge\ng 5.0\n"
        '# HELP h h\n# TYPE h histogram\nh_bucket{le="1.0"} 1.0\nh_bucket{le="+Inf"} 2.0\nh_count 2.0\nh_sum 3.0\n'
    )
    b = a.replace('c_total{x="1"} 2.0', 'c_total{x="1"} 3.0').replace("g 5.0", "g 7.0")
    merged = _samples(merge([a, b]))
    assert merged == {"c_total": 5.0, "g": 5.0, "h_bucket": 6.0, "h_count": 4.0, "h_sum": 6.0}


def test_a_share_below_one_per_api_server_is_refused_at_start(long_model):
    run = subprocess.run(
        [*RINGLLM, "serve", long_model, *TINY_SERVE_ARGS, "--api-server-count", "2", "--max-waiting-requests", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0 and "--max-waiting-requests 1 cannot be shared" in run.stderr


def test_connections_reach_both_api_servers_and_metrics_on_either_sum_them(server):
    before = local_metrics(server)
    answers = [_fresh_completion(server) for _ in range(12)]
    assert all(a.usage.completion_tokens == 3 for a in answers)
    after = local_metrics(server)
    served = {
        pid: after[pid]["vllm:request_success_total"] - before[pid]["vllm:request_success_total"] for pid in after
    }
    assert sum(served.values()) == 12 and all(n > 0 for n in served.values()), served
    total = server.metrics()  # whichever server the scrape reaches answers for both
    assert total["vllm:request_success_total"] == sum(m["vllm:request_success_total"] for m in after.values())
    assert total["vllm:generation_tokens_total"] == sum(m["vllm:generation_tokens_total"] for m in after.values())
    # the core's step counters reach one server only: the sum counts each prompt's lookup once
    assert (
        total["vllm:prefix_cache_queries_total"]
        == sum(m["vllm:prefix_cache_queries_total"] for m in after.values())
        > 0
    )


def _server_of(server, resp: aiohttp.ClientResponse) -> int:
    """The API server holding this connection: the pid with a socket whose peer is our port."""
    port = resp.connection.transport.get_extra_info("sockname")[1]
    inodes = {}
    with open(f"/proc/{server.proc.pid}/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if int(fields[2].split(":")[1], 16) == port:
                inodes[fields[9]] = True
    for pid in api_pids(server):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return pid
    raise AssertionError(f"no API server holds the connection from port {port}")


def _scrape(server) -> dict[str, float]:
    """/metrics from whichever server a scrape reaches; {} when it met the killed server's
    listener on its way out (a connection in its accept queue is reset)."""
    try:
        return server.metrics()
    except OSError:
        return {}


def _running(server) -> Optional[float]:
    return _scrape(server).get("vllm:num_requests_running")


async def _rest(resp: aiohttp.ClientResponse) -> bytes:
    """What a stream still sends until it ends (by its end or a broken connection), within 10 s."""
    got = b""
    try:
        async with asyncio.timeout(10):
            while chunk := await resp.content.read(1 << 16):
                got += chunk
    except (aiohttp.ClientError, ConnectionError):
        pass
    resp.close()
    return got


def test_a_killed_api_server_costs_only_its_streams_and_is_replaced(server):
    pids = api_pids(server)
    assert len(pids) == 2

    async def scenario():
        streams: dict[int, list] = {pid: [] for pid in pids}
        sessions = []
        for _ in range(32):  # until each server holds a stream (each session: a connection of its own)
            session = aiohttp.ClientSession()
            sessions.append(session)
            resp = await session.post(server.url + "/v1/completions", json=LONG)
            await resp.content.readuntil(b"\n\n")
            streams[_server_of(server, resp)].append(resp)
            if all(streams.values()):
                break
        victim, survivor = sorted(pids, key=lambda p: len(streams[p]))
        running = len(streams[victim]) + len(streams[survivor])
        assert await asyncio.to_thread(wait_for, lambda: server.metrics()["vllm:num_requests_running"] == running, 10)
        while (await asyncio.to_thread(local_metrics, server))[victim]["vllm:request_success_total"] == 0:
            await asyncio.to_thread(_fresh_completion, server)  # the victim has counts of its own
        await asyncio.to_thread(server.metrics)  # a sum that includes them
        counted = (await asyncio.to_thread(local_metrics, server))[victim]["vllm:request_success_total"]
        os.kill(victim, signal.SIGKILL)
        for resp in streams[victim]:  # cut off (an error or an early end, never [DONE]), never hung
            assert b"[DONE]" not in await _rest(resp)
        # the core aborted the victim's requests; the survivor's streams go on
        kept = len(streams[survivor])
        assert await asyncio.to_thread(wait_for, lambda: _running(server) == kept, 10)
        for resp in streams[survivor]:
            async with asyncio.timeout(10):
                assert (await resp.content.readuntil(b"\n\n")).startswith(b"data: {")
            resp.close()
        for session in sessions:
            await session.close()
        return victim, counted

    victim, counted = asyncio.run(scenario())
    assert wait_for(lambda: len(api_pids(server)) == 2 and victim not in api_pids(server), 60, 0.1)
    assert wait_for(
        lambda: (lambda m: m.get("vllm:num_requests_running") == 0 and m["vllm:kv_cache_usage_perc"] == 0)(
            _scrape(server)
        ),
        10,
    )  # every KV block freed, the victim's included
    assert all(_fresh_completion(server).usage.completion_tokens == 3 for _ in range(4))
    # counters never go down: the dead server's part of the sum stays beside the living's counts
    assert wait_for(lambda: _both_serving(server), 30)  # the replacement listens on its socket
    living = sum(m["vllm:request_success_total"] for m in local_metrics(server).values())
    assert _scrape(server)["vllm:request_success_total"] == living + counted, (living, counted)


def test_a_killed_core_ends_every_api_server_and_the_launcher_exits(server):
    async def scenario():
        async with aiohttp.ClientSession() as session:
            resp = await session.post(server.url + "/v1/completions", json=LONG)
            first = await resp.content.readuntil(b"\n\n")
            os.kill(core_pid(server), signal.SIGKILL)
            async with asyncio.timeout(10):
                return parse_sse(first + await resp.read())

    events = asyncio.run(scenario())
    assert events[-1]["error"]["code"] == "engine_dead"
    assert server.proc.wait(60) == 1
    assert not descendants(server.proc.pid)
    assert not [d for d in os.listdir(server.tmp) if d.startswith("ringllm-metrics-")]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_launcher_stopped_or_killed_leaves_nothing_running(long_model, sig):
    """SIGTERM: each API server drains (a stream still running at the drain timeout ends with an
    error event and [DONE]), then the core is told SHUTDOWN and the launcher exits 0. SIGKILL:
    the core and the API servers follow the launcher through their parent-death signal."""
    with RemoteServer(
        long_model, *TINY_SERVE_ARGS, "--served-model-name", "tiny", "--api-server-count", "2", "--drain-timeout", "1"
    ) as remote:
        below = descendants(remote.proc.pid)
        assert len(below) == 3

        async def scenario():
            async with aiohttp.ClientSession() as session:
                resp = await session.post(remote.url + "/v1/completions", json=LONG)
                first = await resp.content.readuntil(b"\n\n")
                remote.proc.send_signal(sig)
                return first + await _rest(resp)

        raw = asyncio.run(scenario())
        if sig == signal.SIGTERM:
            assert parse_sse(raw)[-1]["error"]["code"]  # ended with an error event, then [DONE]
            assert remote.proc.wait(60) == 0
        else:
            remote.proc.wait(10)
        assert wait_for(lambda: not any(map(_alive, below)), 10, 0.05)


def _by_engine(server, name: str) -> dict[str, float]:
    """One metric's samples summed per ``engine`` label (the data-parallel rank)."""
    status, body, _ = server.get("/metrics")
    assert status == 200
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name:
                out[sample.labels["engine"]] = out.get(sample.labels["engine"], 0.0) + sample.value
    return out


def test_api_servers_over_two_data_parallel_cores_use_both_and_a_dead_rank_stops_all(long_model, tmp_path_factory):
    """--api-server-count 2 --data-parallel-size 2: each API server has a ring pair to each core
    and balances its requests over them; a core killed ends everything, nothing left behind."""
    tmp = str(tmp_path_factory.mktemp("asc-dp"))  # short: the metrics sockets' paths must fit AF_UNIX's 108 bytes
    with RemoteServer(
        long_model,
        *TINY_SERVE_ARGS,
        "--served-model-name",
        "tiny",
        "--api-server-count",
        "2",
        "--data-parallel-size",
        "2",
        env={"TMPDIR": tmp},
    ) as remote:
        remote.tmp = tmp
        assert wait_for(lambda: _both_serving(remote), 60, 0.1)
        cores = [p for p in descendants(remote.proc.pid) if "engine.core" in _cmdline(p)]
        assert len(cores) == 2

        async def burst():  # concurrent, so each server's balancer spreads its share over both ranks
            async with aiohttp.ClientSession() as session:

                async def one():
                    body = dict(LONG, max_tokens=16, stream=False)
                    async with session.post(remote.url + "/v1/completions", json=body) as resp:
                        return resp.status, await resp.json()

                return await asyncio.gather(*(one() for _ in range(16)))

        answers = asyncio.run(burst())
        assert all(status == 200 and a["usage"]["completion_tokens"] == 16 for status, a in answers), answers
        per_rank = _by_engine(remote, "vllm:generation_tokens_total")
        assert sum(per_rank.values()) == 16 * 16 and all(per_rank.get(r, 0) > 0 for r in ("0", "1")), per_rank
        os.kill(cores[1], signal.SIGKILL)
        assert remote.proc.wait(60) == 1
        assert not descendants(remote.proc.pid)
        assert not [d for d in os.listdir(remote.tmp) if d.startswith("ringllm-metrics-")]
