"""A step that raises fails its own requests, not the EngineCore; a core that cannot go on
ends with ENGINE_DEAD and is reaped at once; ``worker_cls`` is checked before any launch.

Faults are injected in a real EngineCore process through ``worker_cls`` (tests/helpers/faulty_runner.py,
Worker subclasses), not by mocking.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from engine.async_llm import AsyncLLM
from engine.client.mp_client import SyncMPClient
from engine.config import AsyncEngineArgs, EngineArgs
from engine.exceptions import EngineDeadError, EngineStepError
from engine.sampling_params import SamplingParams
from engine.wire_messages import FinishReason
from tests.helpers.faulty_runner import FAULT_TEXT, POISON, BrokenWorker, FaultyWorker, NotAWorker
from tests.helpers.engine_utils import (
    EXIT_DEADLINE_S,
    TINY,
    nothing_left_behind,  # noqa: F401 (a fixture)
    request,
    tiny_config,
    wait_until,
)


def reaped(pid: int) -> bool:
    """The process has exited and its parent has collected it (no zombie left)."""
    return not os.path.exists(f"/proc/{pid}")


def exited_unreaped(pid: int) -> bool:
    """The process has exited and nobody has collected it yet (a zombie)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0] == "Z"


def final_outputs(client, ids: set[str]) -> dict:
    """Each request's tokens and final output."""
    tokens = {i: [] for i in ids}
    final = {}
    while set(final) != ids:
        for out in client.get_output().outputs:
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                final[out.request_id] = out
    return {i: (tokens[i], final[i]) for i in ids}


def test_a_failed_step_fails_its_request_and_the_core_serves_on(tiny_model_dir, capfd):
    # One request per step, so the poisoned request's step holds it alone.
    client = SyncMPClient(tiny_config(tiny_model_dir, worker_cls=FaultyWorker, max_num_seqs=1))
    try:
        client.add_request(request("a", max_tokens=5))
        client.add_request(request("poisoned", prompt=(1, 2, POISON)))
        client.add_request(request("b", max_tokens=6))
        results = final_outputs(client, {"a", "poisoned", "b"})
        tokens, failed = results["poisoned"]
        assert failed.finish_reason is FinishReason.ERROR and failed.internal_error and not tokens
        assert "RuntimeError" in failed.error and "/" not in failed.error and "Traceback" not in failed.error
        assert [(len(results[i][0]), results[i][1].finish_reason) for i in ("a", "b")] == [
            (5, FinishReason.LENGTH),
            (6, FinishReason.LENGTH),
        ]
        client.add_request(request("later", max_tokens=3))
        assert len(final_outputs(client, {"later"})["later"][0]) == 3
        stats = client.call_utility("get_stats")
        assert (stats["num_running_reqs"], stats["num_waiting_reqs"], stats["kv_cache_usage"]) == (0, 0, 0.0)
    finally:
        client.shutdown()
    log = capfd.readouterr().err
    assert "EngineCore step failed" in log and "Traceback" in log and FAULT_TEXT in log


def test_requests_sharing_the_failed_step_fail_with_it_and_their_blocks_return(tiny_model_dir):
    client = SyncMPClient(tiny_config(tiny_model_dir, worker_cls=FaultyWorker))
    try:
        client.add_request(request("running", max_tokens=200))
        client.get_output()  # it runs
        client.add_request(request("poisoned", prompt=(POISON, 5, 6)))
        results = final_outputs(client, {"running", "poisoned"})
        assert all(out.finish_reason is FinishReason.ERROR and out.internal_error for _, out in results.values())
        stats = client.call_utility("get_stats")
        assert (stats["num_running_reqs"], stats["num_waiting_reqs"], stats["kv_cache_usage"]) == (0, 0, 0.0)
        client.add_request(request("later", max_tokens=3))
        assert len(final_outputs(client, {"later"})["later"][0]) == 3
    finally:
        client.shutdown()


def test_a_core_whose_every_step_fails_dies_with_engine_dead_and_is_reaped(tiny_model_dir):
    client = SyncMPClient(tiny_config(tiny_model_dir, worker_cls=BrokenWorker, max_num_seqs=1))
    pid = client.ready.pid
    try:
        for i in range(4):
            client.add_request(request(f"r{i}"))
        # Read nothing until the core has exited: its error outputs and ENGINE_DEAD then arrive
        # in one batch, and the outputs must still come out before the death is raised.
        wait_until(lambda: exited_unreaped(pid), timeout=EXIT_DEADLINE_S)
        errors = []
        with pytest.raises(EngineDeadError, match="RuntimeError") as dead:
            while True:
                errors += [o for o in client.get_output().outputs if o.finish_reason is FinishReason.ERROR]
        assert 1 <= len(errors) < 4  # the first failures were blamed on their requests, then it gave up
        assert FAULT_TEXT not in str(dead.value) and "Traceback" not in str(dead.value)
        wait_until(lambda: reaped(pid), timeout=EXIT_DEADLINE_S)
    finally:
        client.shutdown()


async def test_async_engine_fails_the_poisoned_request_alone_and_stays_healthy(tiny_model_dir):
    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=tiny_model_dir, worker_cls=FaultyWorker, **{**TINY, "max_num_seqs": 1})
    )
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)

    async def run(prompt, request_id):
        return [out async for out in engine.generate(prompt, params, request_id)]

    try:
        results = await asyncio.gather(
            run("before", "a"),
            run({"prompt_token_ids": [1, POISON]}, "poisoned"),
            run("after", "b"),
            return_exceptions=True,
        )
        assert isinstance(results[1], EngineStepError) and "/" not in str(results[1])
        assert [len(r[-1].outputs[0].token_ids) for r in (results[0], results[2])] == [4, 4]
        await engine.check_health()
        assert len((await run("later", "c"))[-1].outputs[0].token_ids) == 4
        stats = await engine.engine_core.call_utility_async("get_stats")
        assert (stats["num_running_reqs"], stats["num_waiting_reqs"], stats["kv_cache_usage"]) == (0, 0, 0.0)
    finally:
        engine.shutdown()


async def test_async_engine_dead_of_failed_steps_reaps_its_core(tiny_model_dir):
    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=tiny_model_dir, worker_cls=BrokenWorker, **{**TINY, "max_num_seqs": 1})
    )
    pid = engine.engine_core.ready.pid

    async def run(i):
        return [out async for out in engine.generate(f"p{i}", SamplingParams(max_tokens=4), f"r{i}")]

    try:
        results = await asyncio.gather(*(run(i) for i in range(4)), return_exceptions=True)
        assert isinstance(results[0], EngineStepError) and isinstance(results[-1], EngineDeadError)
        deadline = asyncio.get_running_loop().time() + EXIT_DEADLINE_S
        while not reaped(pid) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)  # the loop runs the pidfd watch, which reaps it
        assert reaped(pid)
    finally:
        engine.shutdown()


def test_worker_cls_must_be_a_worker_before_any_launch(tiny_model_dir):
    class Local(FaultyWorker):  # not importable by name: cloudpickled by value at launch
        pass

    for bad, match in [
        (NotAWorker, "subclass of engine.worker.Worker"),
        ("tests.helpers.faulty_runner.NotAWorker", "subclass"),
        ("no_such_module.Worker", "cannot import"),
        ("tests.helpers.faulty_runner.Missing", "has no"),
        ("Worker", "dotted path"),
        (3, "worker_cls"),
    ]:
        with pytest.raises(ValueError, match=match):
            EngineArgs(model=tiny_model_dir, worker_cls=bad, **TINY).create_engine_config()
    for good in (FaultyWorker, "tests.helpers.faulty_runner.FaultyWorker", Local, "engine.worker.Worker"):
        assert EngineArgs(model=tiny_model_dir, worker_cls=good, **TINY).create_engine_config().worker_cls is good


def test_llm_generate_returns_the_failed_request_with_an_internal_error(tiny_model_dir):
    from engine import LLM

    llm = LLM(model=tiny_model_dir, worker_cls=FaultyWorker, **{**TINY, "max_num_seqs": 1})
    try:
        params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        failed, ok = llm.generate([{"prompt_token_ids": [1, POISON]}, "fine"], params, use_tqdm=False)
        assert failed.outputs[0].finish_reason == "error" and failed.internal_error and failed.error
        assert ok.outputs[0].finish_reason == "length" and len(ok.outputs[0].token_ids) == 3
    finally:
        llm.shutdown()
