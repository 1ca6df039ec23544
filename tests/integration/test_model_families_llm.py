"""The new families end to end: ``LLM`` (the EngineCore in its own process, over the ring) on a
random-weight Gemma 2 and Phi-4-mini directory with the default model's tokenizer (Gemma's own is
not available offline; the vocabulary is sized to match it), greedy tokens equal to transformers'
float32 on real text, through the frontend's config reading (transformers for these types)."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.models.default_model import default_tokenizer_path
from tests.unit.test_model_families import _hf_model, hf_greedy

TEXTS = ["The capital of France is", "Once upon a time, in a small village by the sea, there lived"]


@pytest.mark.parametrize("name", ["gemma2", "phi4-mini"])
def test_llm_runs_the_family_as_transformers_does(name, tmp_path):
    from transformers import AutoTokenizer

    hf = _hf_model(name, vocab_size=49152)
    hf.save_pretrained(str(tmp_path))
    tok = AutoTokenizer.from_pretrained(default_tokenizer_path())
    llm = LLM(model=str(tmp_path), tokenizer=default_tokenizer_path(), dtype="float32", device="cpu",
              max_model_len=256, kv_cache_memory=32 << 20, block_size=16)
    try:
        outs = llm.generate(TEXTS, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    finally:
        llm.shutdown()
    for text, out in zip(TEXTS, outs):
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        assert list(out.prompt_token_ids) == prompt
        with torch.no_grad():
            assert list(out.outputs[0].token_ids) == hf_greedy(hf, prompt, 24)
