"""LoRA through ``LLM`` (its EngineCore in its own process): vLLM's ``lora_request`` on generate
and chat, per prompt, against transformers with each adapter merged (float32); bad adapters and
a disabled engine refused with a ValueError naming the problem; prefix-cache blocks kept per
adapter."""

from __future__ import annotations

import os

import pytest

from engine import LLM, SamplingParams
from engine.lora.request import LoRARequest
from tests.helpers.engine_utils import nothing_left_behind  # noqa: F401
from tests.helpers.lora_utils import base_and_adapters, hf_greedy

NUM_TOKENS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
ENGINE = dict(dtype="float32", num_threads=1, kv_cache_memory=32 << 20, max_model_len=256, block_size=4, seed=0)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base, hf, adapters = base_and_adapters(str(tmp_path_factory.mktemp("lora-llm")))
    llm = LLM(model=base, enable_lora=True, max_loras=2, max_cpu_loras=2, **ENGINE)
    loras = {name: (LoRARequest(name, i, path), merged) for i, (name, (path, merged)) in enumerate(adapters.items(), 1)}
    yield llm, hf, loras
    llm.shutdown()


def test_generate_takes_one_lora_request_per_prompt(setup):
    llm, hf, loras = setup
    prompt = [5, 17, 300, 111, 77, 9, 12, 400]
    cases = [(None, hf), *loras.values()]  # three adapters over max_loras=2 slots: scheduled over steps
    outputs = llm.generate(
        [{"prompt_token_ids": prompt}] * len(cases), GREEDY, use_tqdm=False, lora_request=[lora for lora, _ in cases]
    )
    assert [o.outputs[0].token_ids for o in outputs] == [hf_greedy(model, prompt, NUM_TOKENS) for _, model in cases]


def test_chat_with_an_adapter_equals_its_merged_model(setup):
    llm, _, loras = setup
    lora, merged = loras["all"]
    messages = [{"role": "user", "content": "Name a colour."}]
    out = llm.chat(messages, GREEDY, lora_request=lora, use_tqdm=False)[0]
    assert list(out.outputs[0].token_ids) == hf_greedy(merged, list(out.prompt_token_ids), NUM_TOKENS)


def test_prefix_cache_blocks_are_kept_per_adapter(setup):
    llm, hf, loras = setup
    prompt = {"prompt_token_ids": list(range(1000, 1024))}  # six full blocks
    base_first, base_again = (llm.generate(prompt, GREEDY, use_tqdm=False)[0] for _ in range(2))
    assert base_again.num_cached_tokens > 0
    lora, merged = loras["mlp"]
    adapted = llm.generate(prompt, GREEDY, use_tqdm=False, lora_request=lora)[0]
    assert adapted.num_cached_tokens == 0  # the base model's blocks are not this adapter's
    assert list(adapted.outputs[0].token_ids) == hf_greedy(merged, prompt["prompt_token_ids"], NUM_TOKENS)
    assert llm.generate(prompt, GREEDY, use_tqdm=False, lora_request=lora)[0].num_cached_tokens > 0


def test_bad_adapters_are_a_value_error_and_the_engine_goes_on(setup, tmp_path):
    llm, hf, loras = setup
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ValueError, match="adapter_config.json not found"):
        llm.generate("Hi", GREEDY, use_tqdm=False, lora_request=LoRARequest("empty", 40, str(tmp_path / "empty")))
    with pytest.raises(ValueError, match="lora_int_id must be an int >= 1"):
        LoRARequest("zero", 0, str(tmp_path))
    with pytest.raises(TypeError, match="lora_request must be"):
        llm.generate("Hi", GREEDY, use_tqdm=False, lora_request="all")
    lora, merged = loras["all"]
    out = llm.generate({"prompt_token_ids": [7, 8, 9]}, GREEDY, use_tqdm=False, lora_request=lora)[0]
    assert list(out.outputs[0].token_ids) == hf_greedy(merged, [7, 8, 9], NUM_TOKENS)
    assert lora.lora_int_id in llm.list_loras()


def test_lora_request_without_enable_lora_is_refused_by_name(tiny_model_dir, tmp_path):
    from tests.helpers.engine_utils import TINY

    llm = LLM(model=tiny_model_dir, **TINY)
    try:
        with pytest.raises(ValueError, match="lora_request: LoRA adapters are not enabled"):
            llm.generate("Hi", GREEDY, use_tqdm=False, lora_request=LoRARequest("a", 1, str(tmp_path)))
    finally:
        llm.shutdown()
