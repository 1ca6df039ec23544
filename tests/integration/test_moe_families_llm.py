"""A sparse family end to end: ``LLM`` (the EngineCore in its own process, over the ring) on a
random-weight Qwen3-MoE directory (4 experts, top-2, a dense layer among sparse ones) with the
default model's tokenizer (the vocabulary sized to match it), greedy tokens equal to
transformers' float32 on real text, through the frontend's config reading (transformers for
this type)."""

from __future__ import annotations

from tests.helpers.hf_families import llm_generate_texts
from tests.unit.test_models import hf_greedy
from tests.unit.test_moe_families import hf_moe_model


def test_llm_runs_a_moe_family_as_transformers_does(tmp_path):
    hf = hf_moe_model("qwen3-moe", vocab_size=49152)
    for out, prompt in llm_generate_texts(hf, str(tmp_path)):
        assert list(out.prompt_token_ids) == prompt
        assert list(out.outputs[0].token_ids) == hf_greedy(hf, prompt, 24)
