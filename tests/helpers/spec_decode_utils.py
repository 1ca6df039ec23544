"""Speculative decoding through LLM, shared by the n-gram and draft-model tests
(tests/integration/test_spec_decode_llm.py, test_draft_model_llm.py): the tiny engine's
settings, prompts whose continuations repeat, and the check that two runs gave the same outputs."""

from __future__ import annotations

import pytest

from engine.llm import LLM

TINY = dict(load_format="dummy", dtype="float32", max_model_len=256, kv_cache_memory=16 << 20, num_threads=1, seed=0)
PROMPTS = [
    [11, 12, 13, 14, 11, 12, 13, 14, 11, 12, 13],
    [500, 600, 700, 500, 600, 700, 500, 600],
    [9, 8, 7, 6, 5, 4, 3],
    list(range(1000, 1040)) + list(range(1000, 1010)),
]


def write_untied_model(dst: str, **overrides) -> str:
    """Untied, so each token depends on the context and drafts are sometimes rejected (the tied
    dummy model repeats its last token whatever comes before)."""
    from engine.models.default_model import write_tiny_model

    return write_tiny_model(dst, tie_word_embeddings=False, **overrides)


def make_llm(model, speculative_config=None, in_process=True, **kw) -> LLM:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RINGLLM_ENABLE_MULTIPROCESSING", "0" if in_process else "1")
        return LLM(model, speculative_config=speculative_config, **kw)


def generate(llm, prompts, params):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def spec_stats(llm):
    """The drafts' counters of an LLM whose core runs in this process (drafts.py SpecStats)."""
    return llm.llm_engine.engine_core.engine_core.scheduler.spec.stats


def assert_same(base, spec) -> None:
    for a, b in zip(base, spec, strict=True):
        assert len(a.outputs) == len(b.outputs)
        for x, y in zip(a.outputs, b.outputs):
            assert y.token_ids == x.token_ids and y.text == x.text and y.finish_reason == x.finish_reason
            if x.logprobs is not None:
                for lx, ly, t in zip(x.logprobs, y.logprobs, x.token_ids, strict=True):
                    assert lx.keys() == ly.keys() and ly[t].logprob == pytest.approx(lx[t].logprob, abs=1e-4)
