"""``worker_cls`` as a class the EngineCore process cannot import: cloudpickled into the
launch spec by LLM/AsyncLLM, rebuilt in the core, driven once per step, observed from the
caller through ``collective_rpc``; a worker that fails on a chosen request fails that request
alone."""

from __future__ import annotations

import pytest

from engine import LLM, AsyncEngineArgs, AsyncLLM, SamplingParams
from engine.worker import Worker, rpc_method
from tests.helpers.engine_utils import TINY

GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


def recording_worker_cls():
    """Defined in a function: importable by no name, so it can only travel by value."""

    class RecordingWorker(Worker):
        def load_model(self) -> None:
            super().load_model()
            self.steps: list[list] = []

        def execute_model(self, scheduler_output):
            self.steps.append(
                [
                    [req.prompt_token_ids, n]
                    for req, n in zip(scheduler_output.requests, scheduler_output.num_scheduled_tokens)
                ]
            )
            return super().execute_model(scheduler_output)

        @rpc_method
        def get_steps(self) -> list:
            return self.steps

        def unmarked(self) -> list:
            return self.steps

    return RecordingWorker


def test_a_worker_class_defined_here_records_every_step_seen_by_collective_rpc(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, worker_cls=recording_worker_cls(), **TINY)
    try:
        (out,) = llm.generate({"prompt_token_ids": [5, 6, 7]}, GREEDY, use_tqdm=False)
        (steps,) = llm.collective_rpc("get_steps")
        # one prefill step of the whole prompt, then one decode step per further token
        assert steps == [[[[5, 6, 7], 3]], [[[5, 6, 7], 1]], [[[5, 6, 7], 1]]]
        assert len(out.outputs[0].token_ids) == 3
        with pytest.raises(RuntimeError, match="no method '_private' marked callable"):
            llm.collective_rpc("_private")
        # public, but not marked @rpc_method: unreachable (as are load_model and the rest)
        for name in ("unmarked", "load_model", "execute_model"):
            with pytest.raises(RuntimeError, match=f"no method '{name}' marked callable"):
                llm.collective_rpc(name)
        with pytest.raises(TypeError, match="name"):
            llm.collective_rpc(lambda worker: 1)
    finally:
        llm.shutdown()


def failing_worker_cls(poison: int):
    class FailOnPoison(Worker):
        def execute_model(self, scheduler_output):
            if any(poison in req.prompt_token_ids for req in scheduler_output.requests):
                raise RuntimeError("this worker refuses the poisoned request")
            return super().execute_model(scheduler_output)

    return FailOnPoison


def test_a_worker_failing_on_a_chosen_request_fails_that_request_alone(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, worker_cls=failing_worker_cls(999), **{**TINY, "max_num_seqs": 1})
    try:
        failed, ok = llm.generate(
            [{"prompt_token_ids": [1, 999]}, {"prompt_token_ids": [1, 2]}], GREEDY, use_tqdm=False
        )
        assert failed.outputs[0].finish_reason == "error" and failed.internal_error
        assert "RuntimeError" in failed.error
        assert ok.outputs[0].finish_reason == "length" and len(ok.outputs[0].token_ids) == 3
    finally:
        llm.shutdown()


async def test_async_llm_takes_a_worker_class_and_calls_it_on_every_rank(tiny_model_dir):
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, worker_cls=recording_worker_cls(), **TINY))
    try:
        outs = [o async for o in engine.generate({"prompt_token_ids": [9, 8]}, GREEDY, "r")]
        assert outs[-1].finished
        (steps,) = await engine.collective_rpc("get_steps")
        assert steps[0] == [[[9, 8], 2]] and len(steps) == 3
    finally:
        engine.shutdown()


def test_a_class_that_is_no_worker_is_refused_before_launch(tiny_model_dir):
    class NotAWorker:
        def execute_model(self, scheduler_output):
            return None

    with pytest.raises(ValueError, match="subclass of engine.worker.Worker"):
        LLM(model=tiny_model_dir, worker_cls=NotAWorker, **TINY)
