"""LLMEngine driven step by step with its EngineCore in another process: a request id may be
reused at once after the earlier request with that id was aborted or finished by a stop
string, while the core's outputs for the earlier one are still on their way."""

from __future__ import annotations

import time

import pytest

from engine.config import EngineArgs
from engine.llm_engine import LLMEngine
from engine.sampling_params import RequestOutputKind, SamplingParams
from tests.helpers.engine_utils import TINY


def greedy(**kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "ignore_eos": True, "output_kind": RequestOutputKind.FINAL_ONLY, **kw})


@pytest.fixture(scope="module", params=["shm", "zmq"])
def engine(request, tiny_model_dir):
    engine = LLMEngine.from_engine_args(
        EngineArgs(model=tiny_model_dir, transport=request.param, **TINY), enable_multiprocessing=True
    )
    yield engine
    engine.shutdown()


def run_all(engine: LLMEngine) -> dict:
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id not in finished, f"{out.request_id} finished twice"
            finished[out.request_id] = out
    return finished


def reference(engine: LLMEngine, prompt: str, params: SamplingParams):
    engine.add_request("reference", prompt, params)
    return run_all(engine)["reference"].outputs[0]


def test_id_reused_after_abort_gets_only_its_own_outputs(engine):
    expected = reference(engine, "the second request", greedy(max_tokens=3))
    engine.add_request("x", "the first request", greedy(max_tokens=200, output_kind=RequestOutputKind.DELTA))
    while not engine.step():  # the core is generating "x"
        pass
    time.sleep(0.3)  # and runs ahead: its next outputs are in flight when "x" is aborted
    engine.abort_request("x")
    engine.add_request("x", "the second request", greedy(max_tokens=3))
    got = run_all(engine)["x"].outputs[0]
    assert (got.token_ids, got.text, got.finish_reason) == (expected.token_ids, expected.text, "length")
    assert engine.get_stats()["num_running_reqs"] == 0


def test_id_reused_after_a_stop_string_gets_only_its_own_outputs(engine):
    long = reference(engine, "the first request", greedy(max_tokens=60))
    stop = long.text[4:7]  # ends the request early, in the frontend; the core ran on
    expected = reference(engine, "the second request", greedy(max_tokens=3))
    engine.add_request("x", "the first request", greedy(max_tokens=60, stop=[stop]))
    time.sleep(0.3)  # the core runs ahead: outputs past the stop string are in flight when it is found
    first = run_all(engine)["x"].outputs[0]
    assert first.finish_reason == "stop" and first.stop_reason == stop and len(first.token_ids) < 60
    engine.add_request("x", "the second request", greedy(max_tokens=3))
    got = run_all(engine)["x"].outputs[0]
    assert (got.token_ids, got.text, got.finish_reason) == (expected.token_ids, expected.text, "length")
