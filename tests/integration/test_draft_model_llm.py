"""Speculative decoding with a draft model (``speculative_config`` method "draft_model") through
LLM, AsyncLLM and the server: greedy output (tokens and logprobs) the same as without drafts;
max_tokens, stop ids and strings, n, preemption, structured outputs and abort behave as without drafts;
random sampling emits the right count with the emitted tokens' logprobs; a draft equal to the
target accepts everything; a draft of another vocabulary is refused naming the key."""

from __future__ import annotations

import asyncio
import json

import pytest

from engine.async_llm import AsyncLLM
from engine.config import AsyncEngineArgs
from engine.sampling_params import SamplingParams, StructuredOutputsParams
from tests.helpers.spec_decode_utils import (
    PROMPTS,
    TINY,
    assert_same,
    generate,
    make_llm,
    spec_stats,
    write_untied_model,
)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """(target, draft): the draft is the target's first layer's shape with one layer, so its
    random weights agree with the target's only now and then (some drafts rejected)."""
    root = tmp_path_factory.mktemp("pair")
    return write_untied_model(str(root / "target")), write_untied_model(str(root / "draft"), num_hidden_layers=1)


def draft_config(path: str, k: int = 3) -> dict:
    return {"method": "draft_model", "model": path, "num_speculative_tokens": k}


@pytest.fixture(scope="module")
def llms(dirs):
    """(without drafts, with the draft model), the core in this process."""
    target, draft = dirs
    base, spec = make_llm(target, None, **TINY), make_llm(target, draft_config(draft), **TINY)
    yield base, spec
    base.shutdown()
    spec.shutdown()


def test_greedy_output_is_the_same_with_a_draft_model(llms):
    base, spec = llms
    stats = spec_stats(spec)
    for p in (
        SamplingParams(max_tokens=48, temperature=0, logprobs=2, ignore_eos=True),
        SamplingParams(max_tokens=37, temperature=0, n=2, ignore_eos=True),
    ):
        out = generate(spec, PROMPTS, p)
        assert_same(generate(base, PROMPTS, p), out)
        assert all(len(o.token_ids) == p.max_tokens for r in out for o in r.outputs)
    assert stats.num_drafts > 0 and 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # some rejected
    assert spec.llm_engine.engine_core.engine_core.scheduler.kv_cache.usage == 0.0


def test_stop_ids_max_tokens_and_structured_outputs_end_as_without_drafts(llms):
    base, spec = llms
    ref = generate(base, PROMPTS, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    for prompt, r in zip(PROMPTS, ref):
        for params in (
            SamplingParams(max_tokens=40, temperature=0, stop_token_ids=[r.outputs[0].token_ids[17]], ignore_eos=True),
            SamplingParams(max_tokens=11, temperature=0, ignore_eos=True),
        ):
            assert_same(generate(base, [prompt], params), generate(spec, [prompt], params))
    constrained = SamplingParams(
        max_tokens=20, temperature=0, structured_outputs=StructuredOutputsParams(choice=["yes", "no", "maybe"])
    )
    out = generate(spec, PROMPTS[:2], constrained)
    assert_same(generate(base, PROMPTS[:2], constrained), out)
    assert all(r.outputs[0].text in ("yes", "no", "maybe") for r in out)


def test_sampling_with_a_draft_model_emits_the_count_asked_with_the_emitted_tokens_logprobs(llms):
    _, spec = llms
    stats = spec_stats(spec)
    before = stats.num_draft_tokens
    out = generate(spec, PROMPTS, SamplingParams(max_tokens=30, temperature=0.8, top_k=50, logprobs=1, ignore_eos=True))
    assert stats.num_draft_tokens > before
    for r in out:
        o = r.outputs[0]
        assert len(o.token_ids) == len(o.logprobs) == 30
        assert all(t in lp for t, lp in zip(o.token_ids, o.logprobs))


def test_a_draft_equal_to_the_target_has_every_draft_accepted_greedy_and_sampled(dirs):
    target, _ = dirs
    llm = make_llm(target, draft_config(target, k=4), **TINY)
    try:
        stats = spec_stats(llm)
        for temperature in (0.0, 1.0):
            generate(llm, PROMPTS, SamplingParams(max_tokens=25, temperature=temperature, ignore_eos=True))
            assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens == stats.num_draft_tokens
    finally:
        llm.shutdown()


def test_greedy_output_is_the_same_with_a_draft_model_under_preemption(dirs):
    """A KV cache of 24 blocks (target and draft together) for four requests that need ~9 each:
    requests are preempted and recomputed, with and without drafts."""
    target, draft = dirs
    layer = 16 * 2 * 2 * 16 * 4  # one layer's block: block_size x K,V x KV heads x head_dim x float32
    outs, preemptions = [], []
    for config, per_block in ((None, 2 * layer), (draft_config(draft), 3 * layer)):  # 2 + 1 layers
        llm = make_llm(target, config, **{**TINY, "kv_cache_memory": 24 * per_block})
        try:
            outs.append(generate(llm, PROMPTS, SamplingParams(max_tokens=100, temperature=0, ignore_eos=True)))
            preemptions.append(llm.llm_engine.engine_core.engine_core.scheduler.total_preemptions)
        finally:
            llm.shutdown()
    assert_same(*outs)
    assert all(preemptions), preemptions


def test_a_draft_model_of_another_vocabulary_is_refused_naming_the_key(dirs, tmp_path):
    target, _ = dirs
    other = write_untied_model(str(tmp_path / "other"), vocab_size=32000)
    with pytest.raises(ValueError, match=r"speculative_config\.model: .* vocabulary of 32000 tokens"):
        make_llm(target, draft_config(other), **TINY)


async def test_asyncllm_with_a_draft_model_matches_and_an_abort_leaves_nothing(dirs, llms):
    target, draft = dirs
    base, _ = llms
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    ref = generate(base, PROMPTS[:1], params)[0].outputs[0]
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=target, speculative_config=draft_config(draft), **TINY))
    try:
        finals = [out async for out in engine.generate({"prompt_token_ids": PROMPTS[0]}, params, "whole")]
        assert finals[-1].outputs[0].token_ids == ref.token_ids

        long = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
        stream = engine.generate({"prompt_token_ids": PROMPTS[1]}, long, "aborted")
        first = await stream.__anext__()
        assert not first.finished
        await engine.abort("aborted")
        rest = [out async for out in stream]
        assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
        for _ in range(500):  # the abort reaches the core, which frees its blocks
            stats = await engine.engine_core.call_utility_async("get_stats")
            if stats["num_running_reqs"] + stats["num_waiting_reqs"] == 0:
                break
            await asyncio.sleep(0.01)
        assert stats["kv_cache_usage"] == 0.0
    finally:
        engine.shutdown()


def test_the_server_serves_a_draft_model_and_counts_its_drafts(dirs, llms):
    import openai

    from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer

    target, draft = dirs
    base, _ = llms
    ref = generate(base, PROMPTS[:1], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))[0].outputs[0]
    with RemoteServer(
        target,
        *TINY_SERVE_ARGS,
        "--max-model-len",
        "256",
        "--served-model-name",
        "tiny",
        "--speculative-config",
        json.dumps(draft_config(draft)),
    ) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        kw = dict(model="tiny", prompt=PROMPTS[0], max_tokens=40, temperature=0.0, extra_body={"ignore_eos": True})
        whole = client.completions.create(**kw).choices[0]
        streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
        assert whole.text == streamed == ref.text
        stop = ref.text[len(ref.text) // 2 : len(ref.text) // 2 + 3]
        cut = client.completions.create(stop=[stop], **kw).choices[0]
        assert cut.text == ref.text[: ref.text.index(stop)] and cut.finish_reason == "stop"
        status, body, _ = server.get("/metrics")
        assert status == 200
        lines = [line for line in body.decode().splitlines() if line.startswith("vllm:spec_decode_num_")]
        counts = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in lines}
        drafted, accepted = (counts[f"vllm:spec_decode_num_{k}_tokens_total"] for k in ("draft", "accepted"))
        assert counts["vllm:spec_decode_num_drafts_total"] > 0 and 0 < accepted < drafted
        per_pos = sum(float(line.rsplit(" ", 1)[1]) for line in lines if "_per_pos_total" in line)
        assert per_pos == accepted  # each accepted token counted once, at its position
