"""Speculative decoding through LLM: greedy output (tokens and logprobs) the same with and without
n-gram drafts, in process and with the core in its own process; max_tokens, stop strings and stop
token ids cut where they would without drafts; the default model on a prompt where lookups hit."""

from __future__ import annotations

import json
import subprocess

import pytest

from engine.config import AsyncEngineArgs
from engine.entrypoints.cli_args import engine_args_from
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from tests.helpers.cli_utils import serve_parser
from tests.helpers.openai_server_utils import RINGLLM
from tests.helpers.spec_decode_utils import PROMPTS, TINY, assert_same, generate, make_llm, write_untied_model

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_untied_model(str(tmp_path_factory.mktemp("untied")))


@pytest.fixture(scope="module")
def llms(model_dir):
    """(without drafts, with drafts), the core in this process."""
    base, spec = make_llm(model_dir, None, **TINY), make_llm(model_dir, NGRAM, **TINY)
    yield base, spec
    base.shutdown()
    spec.shutdown()


def test_greedy_output_is_the_same_with_drafts(llms):
    base, spec = llms
    stats = spec.llm_engine.engine_core.engine_core.scheduler.spec.stats
    for p in (
        SamplingParams(max_tokens=48, temperature=0, logprobs=2, ignore_eos=True),
        SamplingParams(max_tokens=37, temperature=0, n=2, ignore_eos=True),
    ):
        out = generate(spec, PROMPTS, p)
        assert_same(generate(base, PROMPTS, p), out)
        assert all(len(o.token_ids) == p.max_tokens for r in out for o in r.outputs)
    assert stats.num_drafts > 0 and 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # some rejected
    assert spec.llm_engine.engine_core.engine_core.scheduler.kv_cache.usage == 0.0


def test_greedy_output_is_the_same_with_drafts_and_the_core_in_its_own_process(model_dir):
    params = SamplingParams(max_tokens=40, temperature=0, logprobs=1, ignore_eos=True)
    outs = []
    for config in (None, NGRAM):
        llm = make_llm(model_dir, config, in_process=False, **TINY)
        try:
            outs.append(generate(llm, PROMPTS, params))
        finally:
            llm.shutdown()
    assert_same(*outs)


def test_max_tokens_stop_ids_and_sampling_end_as_without_drafts(llms):
    base, spec = llms
    ref = generate(base, PROMPTS, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    # stop on a token the reference emits mid-way (an accepted draft or the target's own)
    for prompt, r in zip(PROMPTS, ref):
        for params in (
            SamplingParams(max_tokens=40, temperature=0, stop_token_ids=[r.outputs[0].token_ids[17]], ignore_eos=True),
            SamplingParams(max_tokens=11, temperature=0, ignore_eos=True),
        ):
            assert_same(generate(base, [prompt], params), generate(spec, [prompt], params))
    # temperature > 0 with drafts: the right count (the distribution: tests/unit/test_spec_decode.py)
    out = generate(spec, PROMPTS, SamplingParams(max_tokens=30, temperature=0.8, top_k=50, ignore_eos=True))
    assert all(len(r.outputs[0].token_ids) == 30 for r in out)


CODE = (
    "def add(a, b):\n    total = a + b\n    print('adding', a, b)\n    return total\n\n\n"
    "def mul(a, b):\n    total = a * b\n    print('multiplying', a, b)\n    return total\n"
)
REPEAT = (
    "Repeat this code exactly, but rename the function add to plus:\n\n"
    + CODE
    + "\nHere is the code with add renamed to plus:\n\n"
)


@pytest.mark.model
@pytest.mark.slow
def test_the_default_model_gives_the_same_greedy_text_with_drafts_that_hit():
    """``deterministic=True``: the default model's Q4_1 projections compute a 5-row verification
    with the int8 GEMM and a 1-row decode with the GEMV, whose results differ in the last bits,
    which can flip a near-tie; the row-invariant path makes both the same arithmetic."""
    kw = dict(deterministic=True, num_threads=1, max_model_len=1024)
    params = [
        SamplingParams(max_tokens=64, temperature=0, logprobs=1),
        SamplingParams(max_tokens=64, temperature=0, stop=["return total"]),
        SamplingParams(max_tokens=9, temperature=0),
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RINGLLM_ENABLE_MULTIPROCESSING", "0")
        base_llm = LLM(**kw)
        spec_llm = LLM(
            speculative_config={
                "method": "ngram",
                "num_speculative_tokens": 4,
                "prompt_lookup_min": 2,
                "prompt_lookup_max": 4,
            },
            **kw,
        )
    try:
        for p in params:
            base = base_llm.generate([REPEAT], p, use_tqdm=False)
            spec = spec_llm.generate([REPEAT], p, use_tqdm=False)
            assert_same(base, spec)
        assert base[0].outputs[0].finish_reason == "length" and len(spec[0].outputs[0].token_ids) == 9
        stats = spec_llm.llm_engine.engine_core.engine_core.scheduler.spec.stats
        assert stats.num_accepted_tokens >= stats.num_draft_tokens // 2 > 0  # the lookups hit
    finally:
        base_llm.shutdown()
        spec_llm.shutdown()


@pytest.mark.parametrize(
    "config, named",
    [
        ('{"method": "eagle", "model": "/models/draft", "num_speculative_tokens": 3}', "'eagle' is not supported"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "acceptance_method": "typical"}', "acceptance_method"),
    ],
)
def test_serve_refuses_a_speculative_config_it_does_not_carry_out(model_dir, config, named):
    out = subprocess.run(
        [*RINGLLM, "serve", model_dir, "--load-format", "dummy", "--port", "21437", "--speculative-config", config],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "ringllm serve: error: speculative_config: " in out.stderr and named in out.stderr
    assert "Traceback" not in out.stderr


def test_serve_parses_speculative_config_as_json():
    args = serve_parser().parse_args(["--speculative-config", json.dumps(NGRAM)])
    assert engine_args_from(args, AsyncEngineArgs).speculative_config == NGRAM


def test_greedy_output_is_the_same_with_drafts_under_preemption(model_dir):
    """A KV cache of 24 blocks for four requests that need ~9 each: requests are preempted and
    recomputed, with and without drafts (which never preempt: they take only free blocks)."""
    kw = {**TINY, "kv_cache_memory": 24 * (8 << 10)}
    params = SamplingParams(max_tokens=100, temperature=0, ignore_eos=True)
    outs, preemptions = [], []
    for config in (None, NGRAM):
        llm = make_llm(model_dir, config, **kw)
        try:
            outs.append(generate(llm, PROMPTS, params))
            preemptions.append(llm.llm_engine.engine_core.engine_core.scheduler.total_preemptions)
        finally:
            llm.shutdown()
    assert_same(*outs)
    assert all(preemptions), preemptions


def test_the_server_streams_the_same_greedy_text_with_drafts_and_counts_them(model_dir, llms):
    import openai

    from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer

    base, _ = llms
    prompt = PROMPTS[0]
    ref = generate(base, [prompt], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))[0].outputs[0]
    stop = ref.text[len(ref.text) // 2 : len(ref.text) // 2 + 3]
    with RemoteServer(
        model_dir,
        *TINY_SERVE_ARGS,
        "--max-model-len",
        "256",
        "--served-model-name",
        "tiny",
        "--speculative-config",
        json.dumps(NGRAM),
    ) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        kw = dict(model="tiny", prompt=prompt, max_tokens=40, temperature=0.0, extra_body={"ignore_eos": True})
        whole = client.completions.create(**kw).choices[0]
        streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
        assert whole.text == streamed == ref.text
        cut = client.completions.create(stop=[stop], **kw).choices[0]
        assert cut.text == ref.text[: ref.text.index(stop)] and cut.finish_reason == "stop"
        client.completions.create(**{**kw, "prompt": PROMPTS, "max_tokens": 64})
        status, body, _ = server.get("/metrics")
        assert status == 200
        counts = {
            line.split("{")[0]: float(line.rsplit(" ", 1)[1])
            for line in body.decode().splitlines()
            if line.startswith("vllm:spec_decode_num_")
        }
        drafted, accepted = (counts[f"vllm:spec_decode_num_{k}_tokens_total"] for k in ("draft", "accepted"))
        assert counts["vllm:spec_decode_num_drafts_total"] > 0 and 0 < accepted < drafted
