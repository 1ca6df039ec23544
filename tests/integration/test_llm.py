"""LLM / LLMEngine / EngineCore end to end, in-process, on the tiny dummy-weight model:
scheduling features change nothing in the output, bad input harms only its own request."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.config import EngineArgs
from engine.core.engine_core import EngineCore
from engine.llm_engine import LLMEngine
from engine.sampling_params import RequestOutputKind
from engine.wire_messages import EngineCoreRequest, FinishReason

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
SHARED = "You are a careful assistant. Answer briefly and precisely, and never make anything up. "
PROMPTS = [SHARED + "What is two plus two?", SHARED + "Name a color.", "Short one", SHARED * 3 + "Long one"]


def make_llm(model_dir, **kwargs):
    kwargs.setdefault("dtype", "float32")
    kwargs.setdefault("max_model_len", 256)
    kwargs.setdefault("kv_cache_memory", 32 << 20)  # the 2 GiB default costs seconds of page faults
    return LLM(model=model_dir, load_format="dummy", device="cpu", **kwargs)


def token_ids(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module", autouse=True)
def in_process():
    """These tests drive the EngineCore in this process (test_llm_mp.py runs it in its own)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RINGLLM_ENABLE_MULTIPROCESSING", "0")
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny model with an untied LM head. With tied embeddings and small random weights the
    dummy model just repeats the last token whatever the context, so comparisons of outputs
    would prove nothing about the KV cache; untied, each token depends on the attention."""
    from engine.models.default_model import write_tiny_model

    return write_tiny_model(str(tmp_path_factory.mktemp("untied")), tie_word_embeddings=False)


@pytest.fixture(scope="module")
def llm(model_dir):
    llm = make_llm(model_dir)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def reference(llm):
    """Greedy tokens of PROMPTS, one at a time, with a cold prefix cache."""
    out = []
    for prompt in PROMPTS:
        llm.reset_prefix_cache()
        out += token_ids(llm.generate(prompt, GREEDY, use_tqdm=False))
    return out


def test_generate_returns_outputs_in_input_order(llm):
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (3, 1, 7)]
    ids = llm.get_tokenizer().encode("Hi there")
    prompts = ["Hello", {"prompt_token_ids": ids}, {"prompt": "Hey"}]
    outputs = llm.generate(prompts, params, use_tqdm=True)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [3, 1, 7]
    assert [o.prompt for o in outputs] == ["Hello", None, "Hey"] and outputs[1].prompt_token_ids == ids
    assert all(o.finished and o.outputs[0].finish_reason == "length" for o in outputs)
    assert int(outputs[0].request_id) < int(outputs[1].request_id) < int(outputs[2].request_id)
    assert all(p.output_kind == RequestOutputKind.CUMULATIVE for p in params)  # the caller's objects are untouched


def test_batched_greedy_equals_one_at_a_time(llm, reference):
    assert token_ids(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == reference


def test_prefix_caching_on_and_off_agree_and_hits_are_reported(llm, reference, model_dir):
    llm.reset_prefix_cache()
    before = llm.llm_engine.get_stats()["prefix_cache_hits"]
    first = llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)
    second = llm.generate(PROMPTS[1], GREEDY, use_tqdm=False)  # shares SHARED with the first
    assert llm.llm_engine.get_stats()["prefix_cache_hits"] > before
    assert first[0].num_cached_tokens == 0 and second[0].num_cached_tokens >= 16
    assert token_ids(first + second) == reference[:2]
    no_cache = make_llm(model_dir, enable_prefix_caching=False)
    assert token_ids(no_cache.generate(PROMPTS, GREEDY, use_tqdm=False)) == reference
    assert no_cache.llm_engine.get_stats()["prefix_cache_hits"] == 0


def test_chunked_prefill_at_a_tiny_token_budget_agrees(model_dir, reference):
    small = make_llm(model_dir, max_num_batched_tokens=8, max_num_seqs=4, enable_prefix_caching=False)
    assert token_ids(small.generate(PROMPTS, GREEDY, use_tqdm=False)) == reference


@pytest.mark.parametrize("caching", [True, False])
def test_forced_preemption_with_a_tiny_kv_cache_agrees(llm, model_dir, caching):
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    expected = token_ids(llm.generate(PROMPTS, params, use_tqdm=False))
    block_bytes = 2 * 2 * 2 * 16 * 16 * 4  # k and v, 2 layers, 2 kv heads, head_dim 16, 16 slots, fp32
    tiny = make_llm(model_dir, kv_cache_memory=10 * block_bytes, max_model_len=128, enable_prefix_caching=caching)
    assert tiny.llm_engine.get_stats()["num_kv_blocks"] == 10  # 8 requests growing to 4-7 blocks each
    assert token_ids(tiny.generate(PROMPTS * 2, params, use_tqdm=False)) == expected * 2
    assert tiny.llm_engine.get_stats()["num_preemptions"] > 0


def test_stop_string_ends_the_text_and_names_the_string(llm):
    text = llm.generate("Once upon", GREEDY, use_tqdm=False)[0].outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), "the dummy model's text should have something to stop on"
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[stop])
    out = llm.generate("Once upon", params, use_tqdm=False)[0].outputs[0]
    assert out.text == text[: text.index(stop)]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.llm_engine.get_stats()["num_running_reqs"] == 0  # aborted in the core too


def test_n_samples_and_logprobs(llm):
    params = SamplingParams(n=3, seed=1, temperature=1.0, max_tokens=5, ignore_eos=True, logprobs=2)
    (out,) = llm.generate("Pick a word:", params, use_tqdm=False)
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for completion in out.outputs:
        assert len(completion.token_ids) == len(completion.logprobs) == 5
        for token, row in zip(completion.token_ids, completion.logprobs):
            assert next(iter(row)) == token and 2 <= len(row) <= 3
        assert completion.cumulative_logprob == pytest.approx(
            sum(row[t].logprob for t, row in zip(completion.token_ids, completion.logprobs))
        )
    assert llm.generate("Pick a word:", params, use_tqdm=False)[0].outputs[1].token_ids == out.outputs[1].token_ids


def test_chat_renders_the_template(llm):
    out = llm.chat([{"role": "user", "content": "Hi!"}], GREEDY, use_tqdm=False)
    assert len(out) == 1 and out[0].prompt.endswith("<|im_start|>assistant\n")
    assert out[0].prompt_token_ids[0] == 1  # <|im_start|>, written by the template


@pytest.mark.parametrize(
    "prompt,params,match",
    [
        ("x " * 300, GREEDY, "max_model_len=256"),
        ("", GREEDY, "empty"),
    ],
)
def test_bad_prompt_is_refused_and_the_engine_keeps_serving(llm, prompt, params, match):
    with pytest.raises(ValueError, match=match):
        llm.generate(["fine prompt", prompt], params, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.llm_engine.get_stats()["num_waiting_reqs"] == 0
    assert len(llm.generate("fine prompt", GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 12


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_bad_sampling_params_name_their_field(kwargs, field):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**kwargs)


def test_engine_serves_others_while_refusing_a_bad_request(llm):
    engine: LLMEngine = llm.llm_engine
    engine.add_request("good", "A fine prompt", GREEDY)
    for prompt in ("", "x " * 300):
        with pytest.raises(ValueError):
            engine.add_request("bad", prompt, GREEDY)
    finished = []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in finished] == ["good"] and len(finished[0].outputs[0].token_ids) == 12


def test_core_answers_invalid_requests_with_an_error_output(llm):
    core: EngineCore = llm.llm_engine.engine_core.engine_core
    bad_params = SamplingParams(max_tokens=4)
    bad_params.temperature = -1.0  # as if it arrived undecoded: the core checks again
    good = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0)
    core.add_request(EngineCoreRequest("ok", [5, 6, 7], good, 2))
    for req_id, ids, params in (
        ("empty", [], good),
        ("long", [5] * 300, good),
        ("vocab", [49152], good),
        ("temp", [5], bad_params),
        ("ok", [5], good),
    ):
        core.add_request(EngineCoreRequest(req_id, ids, params, 2))
    outputs = {}
    while core.has_unfinished_requests():
        for out in core.step().outputs:
            outputs.setdefault(out.request_id, []).append(out)
    errors = {k: v[0].error for k, v in outputs.items() if v[0].finish_reason is FinishReason.ERROR}
    assert set(errors) == {"empty", "long", "vocab", "temp", "ok"}
    assert "empty" in errors["empty"] and "max_model_len" in errors["long"] and "temperature" in errors["temp"]
    assert "already in use" in errors["ok"]
    assert sum(len(o.new_token_ids) for o in outputs["ok"]) == 4  # the first "ok" ran to the end


@pytest.mark.parametrize(
    "case,ids,params",
    [
        ("empty", [], GREEDY),
        ("long", [5] * 300, GREEDY),
        ("vocab", [49152], GREEDY),
        ("logprobs", [5], SamplingParams(max_tokens=2, logprobs=21)),
        ("logit_bias", [5], SamplingParams(max_tokens=2, logit_bias={49152: 1.0})),
    ],
)
def test_the_core_refuses_with_the_frontends_own_message(llm, case, ids, params):
    """One check (engine.request_check) on both sides of the ring: a request that reaches the
    core without the frontend's validation is refused in the words a caller would have got."""
    engine: LLMEngine = llm.llm_engine
    with pytest.raises(ValueError) as frontend:
        engine.add_request(case, {"prompt_token_ids": ids}, params)
    core: EngineCore = engine.engine_core.engine_core
    core.add_request(EngineCoreRequest(case, ids, params, 2))
    (refused,) = core.step().outputs
    assert refused.finish_reason is FinishReason.ERROR and refused.error == str(frontend.value)


def test_ctrl_c_during_generate_aborts_its_requests(llm, monkeypatch):
    engine = llm.llm_engine
    real_step, calls = engine.step, []

    def interrupted_step():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_step()

    monkeypatch.setattr(engine, "step", interrupted_step)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    monkeypatch.undo()
    assert not engine.has_unfinished_requests() and engine.get_stats()["num_running_reqs"] == 0


def test_wrong_model_path_and_unsupported_architecture_fail_at_construction(tmp_path):
    from engine.models.default_model import write_tiny_model

    with pytest.raises(ValueError, match="not a local directory"):
        LLM(model=str(tmp_path / "missing"), device="cpu")
    bad = write_tiny_model(str(tmp_path / "bert"), architectures=["BertForMaskedLM"])
    with pytest.raises(ValueError, match="not supported"):
        LLM(model=bad, load_format="dummy", device="cpu")
    with pytest.raises(TypeError):
        LLM(model=bad, no_such_argument=1)


def test_from_engine_args(model_dir):
    llm = LLM.from_engine_args(
        EngineArgs(model=model_dir, load_format="dummy", device="cpu", max_model_len=64, kv_cache_memory=1 << 20)
    )
    assert len(llm.generate("Hi", GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 12


@pytest.mark.model
def test_default_model_answers_a_question():
    llm = LLM(max_model_len=512)
    out = llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(temperature=0.0, max_tokens=24),
        use_tqdm=False,
    )
    assert "Paris" in out[0].outputs[0].text


def test_priority_policy_serves_the_most_important_first(model_dir):
    llm = make_llm(model_dir, scheduling_policy="priority", max_num_seqs=1)
    outputs = llm.generate(["a", "b", "c"], GREEDY, priority=[2, 0, 1], use_tqdm=False)
    assert sorted(range(3), key=lambda i: outputs[i].metrics.first_token_ts) == [1, 2, 0]
