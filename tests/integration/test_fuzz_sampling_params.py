"""Random SamplingParams, valid and not, against real engines (EngineCore in its own process):
every call either returns outputs or raises ValueError/TypeError at once, and the core
survives it. Whatever SamplingParams accepts must also cross the wire to the core intact.

One LLM and one AsyncLLM serve the whole module; examples are bounded (max_examples) so
the module stays within about a minute on the tiny dummy-weight model.
"""

from __future__ import annotations

import asyncio
import itertools

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from engine import LLM
from engine.async_llm import AsyncLLM
from engine.config import AsyncEngineArgs
from engine.sampling_params import RequestOutputKind, SamplingParams
from engine.wire_messages import EngineCoreRequest
from tests.helpers.engine_utils import TINY

PROMPT = "The capital of France is"
SANE = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
# Derandomized and without shrinking: a CI run is repeatable and a failure costs one example, not
# a search (shrinking once re-ran a 2**31-way fan-out for minutes before n was bounded).
FUZZ = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

HUGE = st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, -(10**30)])
JUNK = st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.floats(allow_nan=True, allow_infinity=True))


def ints(low: int, high: int) -> st.SearchStrategy:
    """Mostly in-range ints (so many examples reach the engine), then huge ones and junk."""
    return st.one_of(st.integers(low, high), st.integers(low, high), HUGE, JUNK)


def floats(low: float, high: float) -> st.SearchStrategy:
    return st.one_of(st.floats(low, high), st.floats(low, high), st.integers(-3, 3), HUGE, JUNK, st.just(10**400))


def flags() -> st.SearchStrategy:
    return st.one_of(st.booleans(), st.booleans(), st.integers(0, 1), st.none())


FIELDS = {
    "n": st.one_of(ints(-1, 3), st.just(100_000)),  # beyond any engine's capacity: refused
    "presence_penalty": floats(-3, 3),
    "frequency_penalty": floats(-3, 3),
    "repetition_penalty": floats(-1, 3),
    "temperature": floats(-1, 3),
    "top_p": floats(-0.5, 1.5),
    "top_k": st.one_of(ints(-2, 60000), st.integers(49000, 49300)),  # around the vocabulary size too
    "min_p": floats(-0.5, 1.5),
    "seed": ints(-5, 2**40),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.one_of(st.text(max_size=3), HUGE), max_size=3), JUNK),
    "stop_token_ids": st.one_of(st.lists(ints(-1, 50000), max_size=3), JUNK),
    "ignore_eos": flags(),
    "max_tokens": st.one_of(ints(-1, 6), st.none()),
    "min_tokens": ints(-1, 6),
    "logprobs": ints(-2, 25),
    "prompt_logprobs": ints(-2, 25),
    "detokenize": flags(),
    "skip_special_tokens": flags(),
    "include_stop_str_in_output": flags(),
    "output_kind": st.one_of(st.sampled_from(list(RequestOutputKind)), ints(-1, 4)),
}
KWARGS = st.fixed_dictionaries({}, optional=FIELDS)


def core_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def params_or_none(kwargs: dict):
    """The SamplingParams, or None when construction refused them (as it must: ValueError/TypeError)."""
    try:
        return SamplingParams(**kwargs)
    except (ValueError, TypeError):
        return None


@settings(max_examples=300, deadline=None)
@given(KWARGS)
def test_whatever_sampling_params_accepts_crosses_the_wire_intact(kwargs):
    params = params_or_none(kwargs)
    if params is None:
        return
    request = EngineCoreRequest("r", [1, 2, 3], params, 2)
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(request), type=EngineCoreRequest)
    assert decoded.sampling_params == params


# ---- through LLM (EngineCore process) ----


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, **TINY)
    yield llm
    llm.shutdown()


@FUZZ
@given(KWARGS)
def test_llm_answers_or_refuses_at_once_and_the_core_survives(llm, kwargs):
    params = params_or_none(kwargs)
    if params is not None:
        try:
            outputs = llm.generate([PROMPT, [1, 2, 3]], params, use_tqdm=False)
        except (ValueError, TypeError):
            pass
        else:
            assert len(outputs) == 2 and all(o.finished for o in outputs)
            assert all(len(o.outputs) == params.n for o in outputs)
    assert core_alive(llm.llm_engine.engine_core.ready.pid)
    assert not llm.llm_engine.has_unfinished_requests()


def test_llm_still_serves_after_the_fuzzing(llm):
    assert len(llm.generate(PROMPT, SANE, use_tqdm=False)[0].outputs[0].token_ids) == 3
    assert core_alive(llm.llm_engine.engine_core.ready.pid)


# ---- through AsyncLLM (EngineCore process, one event loop for the module) ----


@pytest.fixture(scope="module")
def async_llm(tiny_model_dir):
    loop = asyncio.new_event_loop()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, **TINY))
    yield engine, loop
    engine.shutdown()
    loop.run_until_complete(asyncio.sleep(0))  # let the cancelled output handler finish
    loop.close()


_ids = itertools.count()


async def collect(engine: AsyncLLM, params: SamplingParams) -> list:
    return [out async for out in engine.generate(PROMPT, params, f"fuzz-{next(_ids)}")]


@FUZZ
@given(KWARGS)
def test_async_llm_answers_or_refuses_at_once_and_the_core_survives(async_llm, kwargs):
    engine, loop = async_llm
    params = params_or_none(kwargs)
    if params is not None:
        try:
            outputs = loop.run_until_complete(asyncio.wait_for(collect(engine, params), 60))
        except (ValueError, TypeError):
            pass
        else:
            assert outputs and outputs[-1].finished
    assert core_alive(engine.engine_core.ready.pid) and not engine.errored


def test_async_llm_still_serves_after_the_fuzzing(async_llm):
    engine, loop = async_llm
    outputs = loop.run_until_complete(asyncio.wait_for(collect(engine, SANE), 60))
    assert len(outputs[-1].outputs[0].token_ids) == 3
    assert core_alive(engine.engine_core.ready.pid)
