"""``AsyncLLM.shutdown()`` with requests in flight: their ``generate`` raises
``EngineShutdownError`` at once (it used to await for ever, its output handler cancelled),
whether shutdown is called on the loop or from another thread, and later requests are refused
with it; the core is gone and nothing is left behind (conftest's and the module's checks)."""

from __future__ import annotations

import asyncio

import pytest

from engine.async_llm import AsyncLLM
from engine.config import AsyncEngineArgs
from engine.exceptions import EngineShutdownError
from engine.sampling_params import SamplingParams
from tests.helpers.engine_utils import EXIT_DEADLINE_S, TINY, nothing_left_behind, pid_gone, wait_until  # noqa: F401

LONG = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=240)


@pytest.mark.parametrize("transport", ["shm", "zmq"])
@pytest.mark.parametrize("caller", ["loop", "thread"])
async def test_shutdown_ends_running_generates_with_engine_shutdown_error(tiny_model_dir, transport, caller):
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, transport=transport, **TINY))
    pid = engine.engine_core.ready.pid
    started = [asyncio.Event() for _ in range(3)]

    async def stream(i: int) -> None:
        async for _ in engine.generate(f"long {i}", LONG, f"r{i}"):
            started[i].set()

    tasks = [asyncio.create_task(stream(i)) for i in range(3)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
    if caller == "loop":
        engine.shutdown()
    else:
        await asyncio.to_thread(engine.shutdown)
    # Generous: the failure this catches is a generate that never returns.
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    for result in results:
        assert isinstance(result, EngineShutdownError), repr(result)
        assert str(result).startswith("the engine was shut down")
    if caller == "loop":
        assert {str(r) for r in results} == {"the engine was shut down while the request was running"}
    with pytest.raises(EngineShutdownError, match="^the engine was shut down"):
        async for _ in engine.generate("after", LONG, "after"):
            pass
    wait_until(lambda: pid_gone(pid), timeout=EXIT_DEADLINE_S)
