"""Bad sampling settings are refused where they are given, naming the field, and nothing the
EngineCore cannot execute reaches it: values checked with vLLM's ranges, ints that are not
bools and fit int64 (the wire and the tensors), finite floats, one SamplingParams per prompt.
The engine tests run an EngineCore process on the tiny dummy-weight model.
"""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest

from engine import LLM
from engine.exceptions import ParameterError
from engine.sampling_params import RequestOutputKind, SamplingParams
from tests.helpers.engine_utils import TINY

PROMPT = "The capital of France is"
GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
INT_FIELDS = ["n", "top_k", "seed", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs"]
FLOAT_FIELDS = ["presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "min_p"]
FLAG_FIELDS = [
    "ignore_eos",
    "detokenize",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
]


def refused(field: str, **kwargs) -> ParameterError:
    with pytest.raises(ParameterError) as info:
        SamplingParams(**kwargs)
    assert info.value.parameter == field and f"SamplingParams.{field}" in str(info.value)
    assert isinstance(info.value, ValueError)
    return info.value


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"n": 0}, "n"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ({"logprobs": -2}, "logprobs"),
        ({"prompt_logprobs": -2}, "prompt_logprobs"),
        ({"stop": [""]}, "stop"),
        ({"stop": ["a", 3]}, "stop"),
        ({"stop": 3}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stop_token_ids": 5}, "stop_token_ids"),
        ({"output_kind": 7}, "output_kind"),
        ({"output_kind": "delta"}, "output_kind"),
    ],
)
def test_out_of_range_values_are_refused_naming_the_field(kwargs, field):
    refused(field, **kwargs)


@pytest.mark.parametrize("field", INT_FIELDS)
@pytest.mark.parametrize(
    "value",
    [True, False, 1.0, "3", 2**63, 2**64, -(2**63) - 1, 10**5000],
    ids=["True", "False", "1.0", "str", "2**63", "2**64", "-2**63-1", "10**5000"],
)
def test_int_fields_take_only_ints_within_int64(field, value):
    refused(field, **{field: value})


@pytest.mark.parametrize("field", FLOAT_FIELDS)
@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -math.inf, True, "0.5", None, 10**400],
    ids=["nan", "inf", "-inf", "True", "str", "None", "10**400"],
)
def test_float_fields_take_only_finite_numbers(field, value):
    refused(field, **{field: value})


@pytest.mark.parametrize("field", FLAG_FIELDS)
@pytest.mark.parametrize("value", [1, 0, None, "yes"])
def test_flags_take_only_bools(field, value):
    refused(field, **{field: value})


def test_token_id_lists_take_only_int64_ints():
    for ids in ([True], [2**64], [1.0], ["1"]):
        refused("stop_token_ids", stop_token_ids=ids)
        refused("all_stop_token_ids", all_stop_token_ids=ids)


def test_a_huge_value_makes_a_short_message():
    assert len(str(refused("top_k", top_k=10**5000))) < 200
    assert len(str(refused("stop_token_ids", stop_token_ids=[-1] * 10000))) < 200


def test_vllm_shorthands_are_accepted_and_normalised():
    p = SamplingParams(
        top_k=-1,
        temperature=1,
        top_p=1,
        stop="end",
        stop_token_ids=(7,),
        logprobs=-1,
        prompt_logprobs=0,
        seed=-(2**63),
        output_kind=1,
    )
    assert (p.top_k, p.stop, p.stop_token_ids, p.logprobs, p.output_kind) == (
        0,
        ["end"],
        [7],
        -1,
        RequestOutputKind.DELTA,
    )
    assert isinstance(p.temperature, float) and isinstance(p.top_p, float)
    assert SamplingParams(top_k=(2**63) - 1).top_k == (2**63) - 1  # above the vocabulary: no top-k


def test_numpy_numbers_become_python_ones_that_the_wire_carries():
    p = SamplingParams(seed=np.int64(5), top_p=np.float32(0.5), max_tokens=np.uint8(3), stop_token_ids=[np.int32(7)])
    assert (type(p.seed), type(p.top_p), type(p.max_tokens), type(p.stop_token_ids[0])) == (int, float, int, int)
    msgspec.msgpack.encode(p)
    refused("n", n=np.bool_(True))
    refused("temperature", temperature=np.float64("nan"))


def test_a_value_set_after_construction_is_checked_again_on_copy():
    params = SamplingParams()
    params.logprobs = True
    with pytest.raises(ParameterError, match="logprobs"):
        msgspec.structs.replace(params, max_tokens=3)


# ---- through LLM, with the EngineCore in its own process ----


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, **TINY)
    yield llm
    llm.shutdown()


def core_alive(llm: LLM) -> bool:
    with open(f"/proc/{llm.llm_engine.engine_core.ready.pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")


def still_serves(llm: LLM) -> None:
    assert core_alive(llm)
    assert len(llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 3


@pytest.mark.parametrize("top_k", [49153, 10**6, (2**63) - 1])
def test_top_k_above_the_vocabulary_with_top_p_samples_like_no_top_k(llm, top_k):
    """It used to index past the end of the row in the top-p path and kill the EngineCore."""
    for top_p in (0.5, 0.9999):
        params = SamplingParams(top_k=top_k, top_p=top_p, max_tokens=3, ignore_eos=True, seed=7)
        got = llm.generate([PROMPT, "Once upon a time"], params, use_tqdm=False)
        want = llm.generate(
            [PROMPT, "Once upon a time"],
            SamplingParams(top_p=top_p, max_tokens=3, ignore_eos=True, seed=7),
            use_tqdm=False,
        )
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    still_serves(llm)


def test_an_n_beyond_the_engines_capacity_is_refused_before_the_fan_out(llm):
    """``n=2**31`` used to be fanned out into 2**31 requests in the frontend (tens of GB)."""
    with pytest.raises(ParameterError, match="n must be") as info:
        llm.generate(PROMPT, SamplingParams(n=2**31, max_tokens=1), use_tqdm=False)
    assert info.value.parameter == "n"
    assert not llm.llm_engine.has_unfinished_requests()
    still_serves(llm)


def test_logprobs_true_is_refused_before_it_reaches_the_core(llm):
    """``logprobs=True`` used to reach the sampler's ``topk`` and kill the EngineCore."""
    with pytest.raises(ParameterError, match="logprobs"):
        SamplingParams(logprobs=True)
    params = SamplingParams(max_tokens=3)
    params.logprobs = True  # set after construction: checked again when generate copies it
    with pytest.raises(ValueError, match="logprobs"):
        llm.generate(PROMPT, params, use_tqdm=False)
    still_serves(llm)


def test_logprobs_minus_one_is_the_whole_vocabulary_within_max_logprobs(llm):
    with pytest.raises(ParameterError, match="max_logprobs=20") as info:
        llm.generate(PROMPT, SamplingParams(logprobs=-1, max_tokens=1), use_tqdm=False)
    assert info.value.parameter == "logprobs"
    out = llm.generate(PROMPT, SamplingParams(logprobs=0, prompt_logprobs=20, max_tokens=1), use_tqdm=False)[0]
    assert len(out.outputs[0].logprobs[0]) == 1 and len(out.prompt_logprobs[1]) >= 20
    still_serves(llm)


@pytest.mark.parametrize(
    "field,value",
    [
        ("seed", 2**64),
        ("max_tokens", 2**64),
        ("min_tokens", 2**64),
        ("stop_token_ids", [2**64]),
        ("top_k", -(2**64)),
        ("n", 2**63),
    ],
)
def test_ints_beyond_64_bits_are_refused_before_the_wire(llm, field, value):
    """They used to fail with OverflowError while being sent to the core."""
    with pytest.raises(ParameterError) as info:
        llm.generate(PROMPT, SamplingParams(**{field: value}), use_tqdm=False)
    assert info.value.parameter == field
    params = SamplingParams(max_tokens=3)
    setattr(params, field, value)
    with pytest.raises(ParameterError):
        llm.generate(PROMPT, params, use_tqdm=False)
    with pytest.raises(ParameterError, match="priority"):
        llm.generate(PROMPT, GREEDY, priority=[2**64], use_tqdm=False)
    still_serves(llm)


@pytest.mark.parametrize(
    "params,error,match",
    [
        ([GREEDY, {"max_tokens": 3}], TypeError, r"sampling_params\[1\] must be a SamplingParams, got dict"),
        ([GREEDY, None], TypeError, r"sampling_params\[1\]"),
        ({"max_tokens": 3}, TypeError, "got dict"),
        ("greedy", TypeError, "got str"),
        ([GREEDY], ValueError, "list of 1, but there are 2 prompts"),
        ([GREEDY] * 3, ValueError, "list of 3, but there are 2 prompts"),
    ],
)
def test_wrong_sampling_params_for_generate_are_type_or_value_errors(llm, params, error, match):
    with pytest.raises(error, match=match):
        llm.generate(["a", "b"], params, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    still_serves(llm)


@pytest.mark.parametrize(
    "kwargs,error",
    [
        ({"arrival_time": 10**400}, TypeError),
        ({"arrival_time": math.nan}, TypeError),
        ({"arrival_time": "now"}, TypeError),
        ({"priority": True}, TypeError),
        ({"priority": 2**63}, ParameterError),
    ],
)
def test_other_request_fields_that_cross_the_wire_are_checked_too(llm, kwargs, error):
    with pytest.raises(error):
        llm.llm_engine.add_request("odd", PROMPT, GREEDY, **kwargs)
    assert not llm.llm_engine.has_unfinished_requests()
    still_serves(llm)
