"""InputProcessor with the default model's tokenizer: prompt forms, validation, params filling."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from engine.config import EngineArgs, create_engine_config
from engine.frontend.input_processor import InputProcessor, get_tokenizer
from engine.frontend.renderer import INLINE_MAX_BYTES
from engine.sampling_params import SamplingParams, StructuredOutputsParams


def make_processor(model_dir, **kwargs):
    config = create_engine_config(EngineArgs(model=model_dir, load_format="dummy", device="cpu", **kwargs))
    return InputProcessor(config, get_tokenizer(config))


@pytest.fixture(scope="module")
def processor(tiny_model_dir):
    return make_processor(tiny_model_dir, max_model_len=64)


def test_prompt_forms_tokenize_alike(processor):
    ids = processor.tokenizer.encode("Hello there")
    for prompt in ("Hello there", {"prompt": "Hello there"}):
        request, text = processor.process("a", prompt, SamplingParams())
        assert request.prompt_token_ids == ids and text == "Hello there"
    request, text = processor.process("b", {"prompt_token_ids": ids}, SamplingParams())
    assert request.prompt_token_ids == ids and text is None
    assert processor.process("c", ids, SamplingParams())[0].prompt_token_ids == ids
    assert request.eos_token_id == 2 and request.arrival_time > 0


@pytest.mark.parametrize(
    "prompt,match",
    [
        ("", "empty"),
        ({"prompt_token_ids": []}, "empty"),
        ([5] * 65, "max_model_len=64"),
        ([5, 49152], "out of the vocabulary"),
        ([-1], "out of the vocabulary"),
        ({"text": "hi"}, "prompt_token_ids"),
    ],
)
def test_bad_prompts_raise_value_error_naming_the_problem(processor, prompt, match):
    with pytest.raises(ValueError, match=match):
        processor.process("x", prompt, SamplingParams())


def test_prompt_of_exactly_max_model_len_is_accepted(processor):
    assert len(processor.process("x", [5] * 64, SamplingParams())[0].prompt_token_ids) == 64


def test_bad_types_raise_type_error(processor):
    with pytest.raises(TypeError, match="prompt must be"):
        processor.process("x", 3.5, SamplingParams())
    with pytest.raises(TypeError, match="prompt_token_ids"):
        processor.process("x", {"prompt_token_ids": ["a"]}, SamplingParams())
    with pytest.raises(TypeError, match="sampling_params"):
        processor.process("x", "hi", {"temperature": 0})


def test_params_are_filled_in_a_copy(processor):
    params = SamplingParams(stop_token_ids=[7])
    request, _ = processor.process("x", "hi", params)
    assert request.sampling_params is not params
    assert params.all_stop_token_ids == [] and params.stop_token_ids == [7]
    assert request.sampling_params.all_stop_token_ids == [2, 7]
    ignoring = processor.process("y", "hi", SamplingParams(ignore_eos=True))[0].sampling_params
    assert ignoring.all_stop_token_ids == []


def test_generation_config_eos_ids_become_stop_tokens(tiny_model_dir, tmp_path):
    model_dir = shutil.copytree(tiny_model_dir, tmp_path / "m")
    with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [2, 5], "temperature": 0.7, "max_new_tokens": 33}, f)
    processor = make_processor(str(model_dir))
    params = processor.process("x", "hi", SamplingParams())[0].sampling_params
    assert params.stop_token_ids == [5] and params.all_stop_token_ids == [2, 5]
    defaults = processor.default_sampling_params()
    assert defaults.temperature == 0.7 and defaults.max_tokens == 33


def test_logprobs_over_the_limit_and_stop_strings_without_text_are_refused(processor):
    with pytest.raises(ValueError, match="max_logprobs"):
        processor.process("x", "hi", SamplingParams(logprobs=21))
    with pytest.raises(ValueError, match="stop"):
        processor.process("x", "hi", SamplingParams(stop=["a"], detokenize=False))


def test_prompt_logprobs_over_the_entries_limit_are_refused_naming_it(tiny_model_dir):
    processor = make_processor(tiny_model_dir, max_prompt_logprobs_entries=1000, max_logprobs=49152)
    ids = list(range(100, 150))
    with pytest.raises(ValueError, match="max_prompt_logprobs_entries=1000") as info:  # 50 x (20 + 1)
        processor.process("x", {"prompt_token_ids": ids}, SamplingParams(prompt_logprobs=20))
    assert info.value.parameter == "prompt_logprobs"
    processor.process("y", {"prompt_token_ids": ids}, SamplingParams(prompt_logprobs=19))  # 1000
    with pytest.raises(ValueError, match="with n=2"):  # each sample computes and answers them
        processor.process("w", {"prompt_token_ids": ids}, SamplingParams(prompt_logprobs=19, n=2))
    with pytest.raises(ValueError, match="max_prompt_logprobs_entries"):  # -1: the whole vocabulary
        processor.process("z", {"prompt_token_ids": ids[:1]}, SamplingParams(prompt_logprobs=-1))


def test_chat_renders_the_template_with_a_generation_prompt(processor):
    text = processor.render_chat([{"role": "user", "content": "Hi!"}])
    assert "<|im_start|>user\nHi!<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="continue_final_message"):
        processor.render_chat([{"role": "user", "content": "Hi!"}], continue_final_message=True)


def test_priority_needs_the_priority_policy(processor, tiny_model_dir):
    with pytest.raises(ValueError, match="scheduling_policy"):
        processor.process("x", "hi", SamplingParams(), priority=1)
    prioritized = make_processor(tiny_model_dir, scheduling_policy="priority")
    assert prioritized.process("x", "hi", SamplingParams(), priority=-3)[0].priority == -3


def test_admit_verifies_the_params_once_and_the_n_children_are_not_verified_again(processor, monkeypatch):
    params = SamplingParams(n=4, seed=7, max_tokens=5, stop_token_ids=[9])
    calls = []
    verify = SamplingParams.verify
    monkeypatch.setattr(SamplingParams, "verify", lambda self: calls.append(self) or verify(self))
    internal_id = processor.internal_id("req", in_use={})
    admission = processor.admit(internal_id, [5, 6, 7], params)
    assert calls == [params]  # the caller's object, once; the filled-in copy and the children: never
    children = [request for request, _, _ in admission.children]
    assert [c.sampling_params.seed for c in children] == [7, 8, 9, 10]
    assert {c.sampling_params.n for c in children} == {1} and len({c.request_id for c in children}) == 4
    assert all(c.sampling_params.all_stop_token_ids == [2, 9] for c in children)  # filled in: eos added
    assert params.n == 4 and params.all_stop_token_ids == []  # the caller's object is unchanged


def test_admit_refuses_what_the_caller_changed_after_building_the_params(processor):
    params = SamplingParams()
    params.temperature = -1.0  # past __post_init__: only admission's own check sees it
    with pytest.raises(ValueError, match="temperature"):
        processor.admit("x-0", [5], params)


def test_a_seed_that_cannot_be_offset_for_every_child_is_refused(processor):
    with pytest.raises(ValueError, match="seed") as info:
        processor.admit("x-0", [5], SamplingParams(n=3, seed=2**63 - 2))
    assert info.value.parameter == "seed"
    assert len(processor.admit("x-1", [5], SamplingParams(n=2, seed=2**63 - 2)).children) == 2


def test_internal_ids_number_the_caller_ids_and_refuse_one_in_use(processor):
    first, second = processor.internal_id("a", in_use=set()), processor.internal_id("a", in_use=set())
    assert first.startswith("a-") and second.startswith("a-") and first != second
    with pytest.raises(ValueError, match="already in use"):
        processor.internal_id("a", in_use={"a"})
    with pytest.raises(TypeError, match="request_id"):
        processor.internal_id(3, in_use=set())


def test_only_text_is_worth_a_pool_hop(processor):
    text = "x" * 5000
    assert processor.offload_size(text) == processor.offload_size({"prompt": text}) == 5000
    assert processor.offload_size([5] * 5000) == processor.offload_size({"prompt_token_ids": [5] * 5000}) == 0
    assert processor.offload_size({"prompt_token_ids": [5], "prompt": text}) == 0  # its text is only echoed


def test_the_offload_size_weighs_the_params_too(processor):
    words = [f"word{i}" for i in range(1000)]
    assert processor.offload_size("Hi", SamplingParams(bad_words=words)) == 2 + sum(map(len, words)) + len(words)
    assert processor.offload_size([5], SamplingParams(logit_bias={i: 1.0 for i in range(600)})) >= INLINE_MAX_BYTES
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(100_000)}}
    so = StructuredOutputsParams(json=schema)
    assert processor.offload_size("Hi", SamplingParams(structured_outputs=so)) >= INLINE_MAX_BYTES
    assert processor.offload_size("Hi", SamplingParams(stop=["a", "b"])) < INLINE_MAX_BYTES  # small: inline


def test_a_chat_prompt_is_rendered_and_tokenized_in_one_call(processor):
    text, ids = processor.chat_prompt([{"role": "user", "content": "Hi!"}])
    assert text == processor.render_chat([{"role": "user", "content": "Hi!"}])
    assert ids == processor.tokenizer.encode(text, add_special_tokens=False)
    with pytest.raises(ValueError, match="max_model_len=64") as info:  # refused before it is tokenized
        processor.chat_prompt([{"role": "user", "content": "word " * 5000}])
    assert info.value.parameter == "messages"
