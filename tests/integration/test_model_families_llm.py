"""The new families end to end: ``LLM`` (the EngineCore in its own process, over the ring) on a
random-weight Gemma 2 and Phi-4-mini directory with the default model's tokenizer (Gemma's own is
not available offline; the vocabulary is sized to match it), greedy tokens equal to transformers'
float32 on real text, through the frontend's config reading (transformers for these types)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.hf_families import llm_generate_texts
from tests.unit.test_model_families import _hf_model, hf_greedy


@pytest.mark.parametrize("name", ["gemma2", "phi4-mini"])
def test_llm_runs_the_family_as_transformers_does(name, tmp_path):
    hf = _hf_model(name, vocab_size=49152)
    for out, prompt in llm_generate_texts(hf, str(tmp_path)):
        assert list(out.prompt_token_ids) == prompt
        with torch.no_grad():
            assert list(out.outputs[0].token_ids) == hf_greedy(hf, prompt, 24)
