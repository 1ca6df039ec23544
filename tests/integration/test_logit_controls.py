"""logit_bias, allowed_token_ids and bad_words (vLLM's SamplingParams fields), observed in the
tokens the engine samples: the tiny random-weight model, in-process, and AsyncLLM over the ring."""

from __future__ import annotations

import asyncio

import pytest

from engine import LLM, AsyncLLM, SamplingParams, StructuredOutputsParams
from engine.config import AsyncEngineArgs
from engine.frontend.bad_words import tokenize_bad_words
from engine.frontend.tokenizer import FastTokenizer
from engine.worker.logit_controls import banned_bad_words

BANANA = 21285  # " banana" in the default tokenizer


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RINGLLM_ENABLE_MULTIPROCESSING", "0")
        llm = LLM(
            model=tiny_model_dir,
            load_format="dummy",
            device="cpu",
            dtype="float32",
            max_model_len=256,
            kv_cache_memory=32 << 20,
        )
    yield llm
    llm.shutdown()


def generate(llm, prompt="The fruit is", **kw):
    kw.setdefault("max_tokens", 6)
    kw.setdefault("ignore_eos", True)
    return llm.generate(prompt, SamplingParams(**kw), use_tqdm=False)[0].outputs[0]


def test_logit_bias_forces_a_token(llm):
    assert generate(llm, temperature=1.0, seed=3, logit_bias={BANANA: 100}).token_ids == [BANANA] * 6
    greedy = generate(llm, temperature=0.0).token_ids
    banned = generate(llm, temperature=0.0, logit_bias={greedy[0]: -100}).token_ids
    assert banned[0] != greedy[0]
    assert generate(llm, temperature=0.0, logit_bias={greedy[0]: 0.0}).token_ids == greedy


def test_allowed_token_ids_are_the_only_ones_sampled(llm):
    allowed = [BANANA, 28, 4000]
    out = generate(llm, temperature=1.5, seed=1, max_tokens=30, allowed_token_ids=allowed)
    assert set(out.token_ids) <= set(allowed) and len(set(out.token_ids)) > 1


def test_bad_words_are_never_generated(llm, tiny_model_dir):
    greedy = generate(llm, temperature=0.0, max_tokens=8).token_ids
    tok = FastTokenizer.from_dir(tiny_model_dir)
    word = tok.decode([greedy[0]])
    out = generate(llm, temperature=0.0, max_tokens=8, bad_words=[word]).token_ids
    assert greedy[0] not in out
    # A two-token word: its second token is banned only right after its first.
    assert banned_bad_words([5, 9], [[9, 7], [3]]) == [7, 3]
    assert banned_bad_words([5, 8], [[9, 7], [3]]) == [3]
    assert banned_bad_words([], [[9, 7]]) == []


def test_bad_words_are_tokenized_with_and_without_a_leading_space(tiny_model_dir):
    tok = FastTokenizer.from_dir(tiny_model_dir)
    assert tokenize_bad_words(tok, ["cat", " dog"]) == [[9786], [2644], [22676], [2767]]
    # vLLM's rule: the spaced form is kept only when it has as many tokens as the bare one.
    assert tokenize_bad_words(tok, ["banana"]) == [tok.encode("banana", add_special_tokens=False)]


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"logit_bias": {5: 101}}, "logit_bias"),
        ({"logit_bias": {5: float("nan")}}, "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"allowed_token_ids": [-3]}, "allowed_token_ids"),
        ({"bad_words": [""]}, "bad_words"),
    ],
)
def test_bad_values_name_their_field(kwargs, field):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("field", ["logit_bias", "allowed_token_ids"])
def test_token_ids_outside_the_vocabulary_are_refused_before_the_engine(llm, field):
    value = {10**6: 1.0} if field == "logit_bias" else [10**6]
    with pytest.raises(ValueError, match=f"{field} has token id"):
        llm.generate("x", SamplingParams(**{field: value}), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


@pytest.mark.slow
async def test_async_llm_carries_the_controls_and_a_constraint_over_the_ring(tiny_model_dir):
    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=tiny_model_dir,
            load_format="dummy",
            device="cpu",
            dtype="float32",
            max_model_len=256,
            kv_cache_memory=32 << 20,
        )
    )
    try:

        async def run(rid, params):
            async for out in engine.generate("The fruit is", params, rid):
                last = out
            return last.outputs[0]

        forced, choice = await asyncio.gather(
            run("bias", SamplingParams(max_tokens=4, ignore_eos=True, logit_bias={BANANA: 100})),
            run(
                "choice",
                SamplingParams(max_tokens=20, structured_outputs=StructuredOutputsParams(choice=["red", "green"])),
            ),
        )
    finally:
        engine.shutdown()
    assert forced.token_ids == [BANANA] * 4
    assert choice.text in ("red", "green") and choice.finish_reason == "stop"
