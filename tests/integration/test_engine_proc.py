"""The EngineCore process: handshake, start-up failures, liveness both ways, idle cost,
utility allow-list, and the merge of outputs a full ring held back.

Real processes over real rings (and the zmq baseline). The tiny engine and the leak checks
shared with test_llm_mp.py, test_async_llm.py and the other engine modules are in
tests/helpers/engine_utils.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from engine.wire_messages import EngineCoreOutput, EngineCoreOutputs, FinishReason, LogprobsLists, merge_outputs
from tests.helpers.engine_utils import (
    TINY,
    pid_gone,
    request,  # noqa: F401 (a fixture)
    tiny_config,
    wait_until,
)
from tests.helpers.process_utils import live_children


@pytest.fixture(scope="module", params=["shm", "zmq"])
def config(request, tiny_model_dir):
    return tiny_config(tiny_model_dir, transport=request.param)


@pytest.fixture(scope="module")
def client(config):
    from engine.client.mp_client import SyncMPClient

    c = SyncMPClient(config)
    yield c
    c.shutdown()


def run_to_completion(client, ids: set[str]) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    done: set[str] = set()
    while done != ids:
        for out in client.get_output().outputs:
            if out.request_id in ids:  # skip the tail of an earlier test's aborted request
                tokens[out.request_id] += out.new_token_ids
                if out.finished:
                    done.add(out.request_id)
    return tokens


def test_handshake_reports_kv_cache_and_the_digest_of_the_config_sent(client, config):
    from engine.config.wire import config_digest

    ready = client.ready
    assert ready.num_kv_blocks > 0 and ready.config_digest == config_digest(config)
    assert ready.pid == client._core.proc.pid


def test_requests_run_to_completion_through_the_core(client):
    for i in range(3):
        client.add_request(request(f"r{i}", max_tokens=5 + i))
    tokens = run_to_completion(client, {"r0", "r1", "r2"})
    assert [len(tokens[f"r{i}"]) for i in range(3)] == [5, 6, 7]
    assert client.call_utility("get_stats")["num_running_reqs"] == 0


def test_abort_stops_the_request_in_the_core(client):
    client.add_request(request("long", max_tokens=200))
    client.get_output()  # it is running
    client.abort_requests(["long"])
    stats = client.call_utility("get_stats")
    assert stats["num_running_reqs"] == 0 and stats["num_waiting_reqs"] == 0


def test_core_ignores_sigint_and_sigterm_and_keeps_serving(client):
    # Ctrl-C or SIGTERM to the process group is the frontend's to handle (aborts, a drain);
    # the core is stopped by SHUTDOWN or dies with its frontend.
    client.add_request(request("during", max_tokens=100))
    client.get_output()  # it is running
    for sig in (signal.SIGINT, signal.SIGTERM):
        os.kill(client.ready.pid, sig)
    time.sleep(0.2)
    assert not pid_gone(client.ready.pid)
    client.add_request(request("after", max_tokens=4))
    tokens = run_to_completion(client, {"during", "after"})
    assert len(tokens["after"]) == 4 and len(tokens["during"]) > 0


def test_utility_calls_only_reach_allow_listed_methods(client):
    assert client.call_utility("reset_prefix_cache") in (True, False)
    for method in ("shutdown", "add_request", "__init__", "step"):
        with pytest.raises(RuntimeError, match="not allowed"):
            client.call_utility(method)


def test_idle_core_uses_no_cpu(client):
    pid = client.ready.pid

    def cpu_seconds() -> float:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    time.sleep(0.2)  # let it fall asleep after the previous test
    before = cpu_seconds()
    time.sleep(1.0)
    assert cpu_seconds() - before < 0.05


def test_startup_failure_raises_the_cause_and_leaves_nothing(tiny_model_dir):
    from engine.client.mp_client import SyncMPClient
    from engine.exceptions import EngineStartupError

    before = set(live_children())
    # Valid for the frontend, but the core cannot fit one request in this KV cache.
    with pytest.raises(EngineStartupError, match="kv_cache_memory"):
        SyncMPClient(tiny_config(tiny_model_dir, kv_cache_memory=4096))
    assert set(live_children()) <= before


def test_a_core_that_reads_the_config_as_another_one_refuses_to_start(tiny_model_dir, monkeypatch):
    """The core encodes the config it decoded again and compares digests: a launch spec whose
    digest names another config (as a core of other code would read it) never starts a core."""
    from engine.client import core_launcher
    from engine.client.mp_client import SyncMPClient
    from engine.exceptions import EngineStartupError

    monkeypatch.setattr(core_launcher, "config_digest", lambda config: "0" * 64)
    before = set(live_children())
    with pytest.raises(EngineStartupError, match="reads the frontend's config as another one .*frontend 000000000000"):
        SyncMPClient(tiny_config(tiny_model_dir))
    assert set(live_children()) <= before


def test_a_kv_cache_larger_than_the_machine_is_refused_at_startup(tiny_model_dir):
    from engine.client.mp_client import SyncMPClient
    from engine.exceptions import EngineStartupError

    before = set(live_children())
    with pytest.raises(EngineStartupError, match="does not fit in the .* GiB of memory available"):
        SyncMPClient(tiny_config(tiny_model_dir, kv_cache_memory=1 << 50))
    assert set(live_children()) <= before


def test_the_kv_cache_is_resident_once_the_core_is_ready(tiny_model_dir):
    """All of it, from the start: the core's RSS cannot creep up by the cache's size under load
    (as a lazily committed cache did, block by block, over minutes of soak)."""
    from engine.client.mp_client import SyncMPClient

    kv_bytes = 1 << 30  # over three times what the tiny model and torch take (~300 MiB)
    client = SyncMPClient(tiny_config(tiny_model_dir, kv_cache_memory=kv_bytes))
    try:
        with open(f"/proc/{client.ready.pid}/status") as f:
            rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        assert rss > kv_bytes, rss
    finally:
        client.shutdown()


_FRONTEND = textwrap.dedent("""
    import sys, time
    from engine.client.mp_client import SyncMPClient
    from engine.config import EngineArgs
    from engine.sampling_params import SamplingParams
    from engine.wire_messages import EngineCoreRequest
    cfg = EngineArgs(model=sys.argv[1], transport=sys.argv[2], **eval(sys.argv[3])).create_engine_config()
    client = SyncMPClient(cfg)
    client.add_request(EngineCoreRequest("r", [1, 2, 3], SamplingParams(max_tokens=250, ignore_eos=True)))
    client.get_output()
    print(client.ready.pid, flush=True)
    while True:  # mid-generate when it is killed
        client.get_output()
""")


def test_core_exits_within_1s_when_the_frontend_is_killed(tiny_model_dir):
    # The exit does not depend on the transport (PR_SET_PDEATHSIG and a parent pidfd watch).
    frontend = subprocess.Popen(
        [sys.executable, "-c", _FRONTEND, tiny_model_dir, "shm", repr(TINY)], stdout=subprocess.PIPE, text=True
    )
    try:
        core_pid = int(frontend.stdout.readline())
        os.kill(frontend.pid, signal.SIGKILL)
        frontend.wait()
        assert wait_until(lambda: pid_gone(core_pid), timeout=1.0) < 1.0
    finally:
        frontend.kill()
        frontend.wait()
        frontend.stdout.close()


def _out(req_id, tokens, finish=None, logprob_rows=0):
    lp = LogprobsLists([[t] for t in tokens][:logprob_rows], [[-1.0]] * logprob_rows, [1] * logprob_rows)
    return EngineCoreOutput(req_id, list(tokens), new_logprobs=lp if logprob_rows else None, finish_reason=finish)


def test_held_outputs_merge_into_one_entry_per_request():
    held = EngineCoreOutputs(outputs=[_out("a", [1], logprob_rows=1), _out("b", [5], FinishReason.LENGTH)])
    merge_outputs(held, EngineCoreOutputs(outputs=[_out("a", [2], logprob_rows=1), _out("c", [9])]))
    merge_outputs(
        held, EngineCoreOutputs(outputs=[_out("a", [3], FinishReason.STOP, logprob_rows=1), _out("b", [7])])
    )  # "b" again: a reused id
    by_id = [(o.request_id, o.new_token_ids, o.finish_reason) for o in held.outputs]
    assert by_id == [
        ("a", [1, 2, 3], FinishReason.STOP),
        ("b", [5], FinishReason.LENGTH),
        ("c", [9], None),
        ("b", [7], None),
    ]
    assert held.outputs[0].new_logprobs.token_ids == [[1], [2], [3]]


def test_held_stats_sum_their_counters_and_keep_the_newest_gauges():
    """Steps merged while the ring is full lose no prefix-cache lookup or preemption: the
    frontend's counters see every step, its gauges the newest state; events concatenate."""
    from engine.wire_messages import EngineCoreEvent, EngineCoreEventType, SchedulerStats

    queued, scheduled = (
        EngineCoreEvent(EngineCoreEventType.QUEUED, 1.0),
        EngineCoreEvent(EngineCoreEventType.SCHEDULED, 2.0),
    )
    held = EngineCoreOutputs(
        outputs=[EngineCoreOutput("a", [1], events=[queued])], scheduler_stats=SchedulerStats(3, 1, 0.5, 10, 4, 1)
    )
    merge_outputs(
        held,
        EngineCoreOutputs(
            outputs=[EngineCoreOutput("a", [2], events=[scheduled])],
            scheduler_stats=SchedulerStats(2, 0, 0.25, 6, 6, 0),
        ),
    )
    merge_outputs(held, EngineCoreOutputs(outputs=[], scheduler_stats=SchedulerStats(1, 0, 0.125, 0, 0, 2)))
    assert held.scheduler_stats == SchedulerStats(1, 0, 0.125, 16, 10, 3)
    assert held.outputs[0].events == [queued, scheduled]


def test_a_config_larger_than_a_command_line_argument_starts_the_core_and_stays_out_of_ps(tiny_model_dir):
    """Linux caps one argument at 128 KiB (and argv with the environment at ~2 MiB): the launch
    spec, the whole config inside, reaches the core another way, and neither it nor the channel's
    token shows in the core's command line (``ps``)."""
    from engine.client.mp_client import SyncMPClient
    from engine.config.wire import encode_config

    note = "a long note " * 25_000  # 300 KB, kept in the model's hf_config and in hf_overrides
    config = tiny_config(tiny_model_dir, hf_overrides={"ringllm_test_note": note})
    assert len(encode_config(config)) > 500_000
    client = SyncMPClient(config)
    try:
        with open(f"/proc/{client.ready.pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")[1:-1]
        assert args[:2] == [b"-m", b"engine.core"] and len(args) == 3 and args[2].isdigit()  # the spec's fd
        client.add_request(request("big", max_tokens=5))
        assert len(run_to_completion(client, {"big"})["big"]) == 5
    finally:
        client.shutdown()
