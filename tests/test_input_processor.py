"""InputProcessor with the default model's tokenizer: prompt forms, validation, params filling."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from engine.config import EngineArgs, create_engine_config
from engine.frontend.input_processor import InputProcessor, get_tokenizer
from engine.sampling_params import SamplingParams


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


@pytest.mark.parametrize("prompt,match", [
    ("", "empty"), ({"prompt_token_ids": []}, "empty"), ([5] * 65, "max_model_len=64"),
    ([5, 49152], "out of the vocabulary"), ([-1], "out of the vocabulary"), ({"text": "hi"}, "prompt_token_ids"),
])
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
