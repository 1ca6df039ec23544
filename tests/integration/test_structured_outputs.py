"""Structured outputs through LLM, in-process, on the tiny random-weight model: the constraint
does all the work (the model's own choices are noise), so every finished output must match its
constraint exactly, with either backend, through sampling, preemption, chunked prefill and
prefix-cache hits; a spec that cannot compile is refused naming structured_outputs."""

from __future__ import annotations

import json
import re

import jsonschema
import msgspec
import pytest

from engine import LLM, SamplingParams, StructuredOutputsParams
from engine import sampling_params as sampling_params_module
from engine.wire_messages import EngineCoreRequest

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog"]},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
    },
    "required": ["name", "age", "pet", "ok", "tags"],
    "additionalProperties": False,
}
REGEX = r"[0-9]{3}-[a-z]{2}"
CHOICES = ["yes", "no", "maybe so"]
EBNF = 'root ::= "(" digit+ ("+" digit+)* ")"\ndigit ::= [0-9]'
LARK = 'start: "x=" NUM ";"\nNUM: /[0-9]{1,4}/'


def random_params(so: StructuredOutputsParams, **kw) -> SamplingParams:
    kw.setdefault("max_tokens", 300)
    kw.setdefault("temperature", 1.0)
    kw.setdefault("seed", 7)
    return SamplingParams(structured_outputs=so, **kw)


def check(so: StructuredOutputsParams, text: str) -> None:
    """``text`` satisfies ``so`` (AssertionError otherwise)."""
    kind = so.kind
    if kind == "json":
        jsonschema.validate(json.loads(text), json.loads(so.json) if isinstance(so.json, str) else so.json)
    elif kind == "json_object":
        assert isinstance(json.loads(text), dict), text
    elif kind == "regex":
        assert re.fullmatch(so.regex, text), text
    elif kind == "choice":
        assert text in so.choice, text
    elif so.grammar == EBNF:
        assert re.fullmatch(r"\(\d+(\+\d+)*\)", text), text
    else:
        assert re.fullmatch(r"x=\d{1,4};", text), text


# A random model would fill free JSON whitespace forever: these JSON constraints allow none.
CONSTRAINTS = [
    StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True),
    StructuredOutputsParams(json=json.dumps(SCHEMA), disable_any_whitespace=True),
    StructuredOutputsParams(json_object=True, disable_any_whitespace=True),
    StructuredOutputsParams(regex=REGEX),
    StructuredOutputsParams(choice=CHOICES),
    StructuredOutputsParams(grammar=EBNF),
    StructuredOutputsParams(grammar=LARK),
]


@pytest.fixture(scope="module", autouse=True)
def in_process():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RINGLLM_ENABLE_MULTIPROCESSING", "0")
        yield


def make_llm(model_dir, backend="auto", **kwargs):
    kwargs.setdefault("max_model_len", 512)
    kwargs.setdefault("kv_cache_memory", 32 << 20)
    return LLM(
        model=model_dir,
        load_format="dummy",
        device="cpu",
        dtype="float32",
        structured_outputs_config={"backend": backend},
        **kwargs,
    )


@pytest.fixture(scope="module", params=["xgrammar", "guidance"])
def llm(request, tiny_model_dir):
    llm = make_llm(tiny_model_dir, request.param)
    yield llm
    llm.shutdown()


# ---------------------------------------------------------------- the Python API


def test_params_are_exported_and_take_exactly_one_constraint():
    assert sampling_params_module.StructuredOutputsParams is StructuredOutputsParams
    with pytest.raises(ValueError, match="none are specified"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="multiple are specified: json, regex"):
        StructuredOutputsParams(json=SCHEMA, regex="a")
    with pytest.raises(ValueError, match="structured_outputs.choice"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ValueError, match="structured_outputs.json"):
        StructuredOutputsParams(json="{not json")
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(structured_outputs={"json": SCHEMA})


def test_params_cross_the_wire_and_key_by_content():
    params = SamplingParams(structured_outputs=StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True))
    wire = msgspec.msgpack.encode(EngineCoreRequest("r", [1, 2], params))
    back = msgspec.msgpack.decode(wire, type=EngineCoreRequest).sampling_params.structured_outputs
    assert back == params.structured_outputs
    as_text = StructuredOutputsParams(json=json.dumps(SCHEMA, indent=2), disable_any_whitespace=True)
    assert as_text.key() == back.key() != StructuredOutputsParams(json=SCHEMA).key()
    # Property order is the order of generation: a reordered schema is another grammar.
    reordered = StructuredOutputsParams(
        json={**SCHEMA, "properties": dict(reversed(SCHEMA["properties"].items()))}, disable_any_whitespace=True
    )
    assert reordered.key() != back.key()


# ---------------------------------------------------------------- every constraint, both backends


def test_every_constraint_type_is_matched_by_every_output(llm):
    outs = llm.generate(
        ["Describe a person:"] * len(CONSTRAINTS), [random_params(c) for c in CONSTRAINTS], use_tqdm=False
    )
    for so, out in zip(CONSTRAINTS, outs):
        completion = out.outputs[0]
        if so.kind != "json_object":  # an object of unbounded size may run out of tokens
            assert completion.finish_reason == "stop", (so.kind, completion.text)
        if completion.finish_reason == "stop":
            check(so, completion.text)


def test_a_choice_of_thousands_of_strings_is_matched(llm):
    # llguidance's parser took a choice as a rule of alternatives and refused more than 2,000 of
    # them at the first token ("no token was allowed").
    so = StructuredOutputsParams(choice=[f"option {i}" for i in range(3000)])
    (out,) = llm.generate("Pick one:", random_params(so), use_tqdm=False)
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].text in so.choice, out.outputs[0].text


def test_samples_penalties_and_filters_all_see_the_mask(llm):
    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    params = random_params(
        so,
        n=3,
        top_k=50,
        top_p=0.9,
        min_p=0.01,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        repetition_penalty=1.2,
        logprobs=3,
    )
    (out,) = llm.generate("Describe a person:", params, use_tqdm=False)
    assert len(out.outputs) == 3
    for completion in out.outputs:
        assert completion.finish_reason == "stop"
        check(so, completion.text)
        for token, row in zip(completion.token_ids, completion.logprobs):
            assert row[token].logprob > float("-inf")
    again = llm.generate("Describe a person:", params, use_tqdm=False)[0]
    assert [c.text for c in again.outputs] == [c.text for c in out.outputs]  # seeded


def test_greedy_rows_and_unconstrained_rows_share_a_batch(llm):
    so = StructuredOutputsParams(regex=REGEX)
    plain = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = llm.generate(["a", "b", "c"], [plain, random_params(so, temperature=0.0), plain], use_tqdm=False)
    check(so, outs[1].outputs[0].text)
    assert outs[0].outputs[0].token_ids == llm.generate("a", plain, use_tqdm=False)[0].outputs[0].token_ids


def test_the_grammar_end_is_a_stop_even_with_ignore_eos(llm):
    so = StructuredOutputsParams(choice=CHOICES)
    (out,) = llm.generate("Answer:", random_params(so, ignore_eos=True), use_tqdm=False)
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].text in CHOICES


def test_chat_takes_structured_outputs(llm):
    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    (out,) = llm.chat([{"role": "user", "content": "A person, as JSON"}], random_params(so), use_tqdm=False)
    check(so, out.outputs[0].text)


# ---------------------------------------------------------------- scheduling does not disturb the matcher


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        {"max_num_batched_tokens": 16, "enable_chunked_prefill": True},  # prompts in chunks
        {"kv_cache_memory": 40 * 2 * 2 * 16 * 2 * 16 * 4},  # 40 blocks: streams preempt each other
    ],
    ids=["chunked-prefill", "preemption"],
)
def test_outputs_stay_valid_and_equal_under_chunked_prefill_and_preemption(tiny_model_dir, llm, engine_kwargs):
    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    prompts = [f"Person number {i} " * 20 for i in range(8)]
    params = [random_params(so, seed=i) for i in range(8)]
    reference = [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]
    other = make_llm(tiny_model_dir, llm.llm_engine.config.structured_outputs_config.backend, **engine_kwargs)
    try:
        texts = [o.outputs[0].text for o in other.generate(prompts, params, use_tqdm=False)]
        if "kv_cache_memory" in engine_kwargs:
            assert other.llm_engine.get_stats()["num_preemptions"] > 0
    finally:
        other.shutdown()
    assert texts == reference
    for text in texts:
        check(so, text)


def test_prefix_cache_hits_do_not_change_the_output(llm):
    so = StructuredOutputsParams(regex=REGEX)
    prompt = "A shared prefix of a few blocks of tokens. " * 4
    first = llm.generate(prompt, random_params(so), use_tqdm=False)[0]
    second = llm.generate(prompt, random_params(so), use_tqdm=False)[0]
    assert second.num_cached_tokens > 0 and second.outputs[0].text == first.outputs[0].text


def test_padding_rows_of_a_wider_lm_head_are_never_sampled(tmp_path):
    from engine.models.default_model import write_tiny_model

    wide = make_llm(write_tiny_model(str(tmp_path), vocab_size=49152 + 64))
    try:
        so = StructuredOutputsParams(json_object=True, disable_any_whitespace=True)
        outs = wide.generate(["x"] * 4, [random_params(so, seed=i, max_tokens=40) for i in range(4)], use_tqdm=False)
    finally:
        wide.shutdown()
    assert all(t < 49152 for o in outs for t in o.outputs[0].token_ids)


# ---------------------------------------------------------------- failures stay with their request


@pytest.mark.parametrize(
    "so,match",
    [
        (StructuredOutputsParams(regex="a(b"), "structured_outputs.regex"),
        (StructuredOutputsParams(grammar="root ::= undefined_rule"), "structured_outputs.grammar"),
        (
            StructuredOutputsParams(json={"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}),
            "structured_outputs.json",
        ),
    ],
)
def test_a_spec_that_cannot_compile_is_refused_before_the_engine(llm, so, match):
    with pytest.raises(ValueError, match=match):
        llm.generate("x", random_params(so), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_a_request_left_with_no_allowed_token_fails_alone(llm):
    doomed = random_params(StructuredOutputsParams(choice=["yes"]), min_tokens=20)  # EOS banned after "yes"
    fine = random_params(StructuredOutputsParams(regex=REGEX))
    engine = llm.llm_engine
    engine.add_request("doomed", "x", doomed)
    engine.add_request("fine", "x", fine)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert finished["doomed"].outputs[0].finish_reason == "error"
    assert "no token was allowed" in (finished["doomed"].error or "")
    check(fine.structured_outputs, finished["fine"].outputs[0].text)


def test_a_compile_past_its_bound_fails_that_request_and_no_other(tiny_model_dir):
    llm = LLM(
        model=tiny_model_dir,
        load_format="dummy",
        device="cpu",
        dtype="float32",
        max_model_len=256,
        kv_cache_memory=32 << 20,
        structured_outputs_config={"compile_timeout_s": 1e-6},
    )
    try:
        engine = llm.llm_engine
        engine.add_request("slow", "x", random_params(StructuredOutputsParams(json=SCHEMA)))
        engine.add_request("plain", "x", SamplingParams(max_tokens=5, ignore_eos=True))
        finished = {}
        while engine.has_unfinished_requests():
            finished.update({o.request_id: o for o in engine.step() if o.finished})
    finally:
        llm.shutdown()
    assert finished["slow"].outputs[0].finish_reason == "error"
    assert "compile_timeout_s" in finished["slow"].error
    assert len(finished["plain"].outputs[0].token_ids) == 5


def test_unknown_backend_is_refused_naming_the_field(tiny_model_dir):
    with pytest.raises(ValueError, match="structured_outputs_config.backend"):
        make_llm(tiny_model_dir, "outlines")


def test_aborts_free_parked_and_running_constrained_requests(llm):
    engine = llm.llm_engine
    so = StructuredOutputsParams(json={"type": "object", "properties": {"aborted_while_parked": {"type": "string"}}})
    engine.add_request("parked", "x", random_params(so))  # a new spec: still compiling
    engine.add_request("running", "x", random_params(StructuredOutputsParams(regex="a{1,200}"), min_tokens=150))
    for _ in range(3):
        engine.step()
    engine.abort_request(["parked", "running"])
    while engine.has_unfinished_requests():
        engine.step()
    scheduler = engine.engine_core.engine_core.scheduler
    assert not scheduler.waiting_for_grammar and not scheduler.requests
    (out,) = llm.generate("x", random_params(StructuredOutputsParams(regex=REGEX)), use_tqdm=False)
    check(StructuredOutputsParams(regex=REGEX), out.outputs[0].text)


def test_auto_starts_on_llguidance_and_moves_to_xgrammar_when_its_compile_is_done():
    from concurrent.futures import Future

    import tokenizers

    from engine.models.default_model import default_tokenizer_path
    from engine.structured_output.backend_guidance import GuidanceBackend, GuidanceMatcher
    from engine.structured_output.backend_xgrammar import XgrammarBackend, XgrammarMatcher
    from engine.structured_output.config import StructuredOutputsConfig
    from engine.structured_output.manager import GrammarState, StructuredOutputManager
    from engine.structured_output.vocab import load_vocabulary

    vocab = load_vocabulary(default_tokenizer_path(), 49152, 2)
    tok = tokenizers.Tokenizer.from_file(f"{default_tokenizer_path()}/tokenizer.json")
    manager = StructuredOutputManager(StructuredOutputsConfig(), default_tokenizer_path(), 49152, 4)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}

    class Req:
        request_id, output_token_ids = "r", []

    # Without free whitespace llguidance writes '{"a":1}', xgrammar '{"a": 1}': a prefix xgrammar would
    # not have written stays on llguidance.
    for text, compact, moves in [('{"a": 1', False, True), ('{"a":1', True, False)]:
        so = StructuredOutputsParams(json=schema, disable_any_whitespace=compact)
        quick, slow = Future(), Future()
        quick.set_result(GuidanceBackend(vocab).compile(so))
        req = Req()
        req.output_token_ids = []
        req.structured_output = GrammarState(slow, quick, deadline=float("inf"))
        assert manager.poll(req, 0.0) and isinstance(req.structured_output.matcher, GuidanceMatcher)
        for token in tok.encode(text, add_special_tokens=False).ids:
            manager.fill_bitmask([req])
            assert manager.accept(req, token)
            req.output_token_ids.append(token)
        slow.set_result(XgrammarBackend(vocab).compile(so))
        manager.fill_bitmask([req])
        assert isinstance(req.structured_output.matcher, XgrammarMatcher if moves else GuidanceMatcher), text
        for token in tok.encode("}", add_special_tokens=False).ids + [2]:
            manager.fill_bitmask([req])
            assert manager.accept(req, token)
        assert manager.is_terminated(req)


def test_structural_tag_on_xgrammar_and_refused_on_guidance(llm):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    }
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "tag",
            "begin": "<call>",
            "end": "</call>",
            "content": {"type": "json_schema", "json_schema": schema},
        },
    }
    so = StructuredOutputsParams(structural_tag=json.dumps(tag), disable_any_whitespace=True)
    if llm.llm_engine.config.structured_outputs_config.backend == "guidance":
        with pytest.raises(ValueError, match="structural_tag is supported by the xgrammar backend only"):
            llm.generate("x", random_params(so), use_tqdm=False)
        return
    (out,) = llm.generate("x", random_params(so), use_tqdm=False)
    match = re.fullmatch(r"<call>(.*)</call>", out.outputs[0].text, re.S)
    assert match and out.outputs[0].finish_reason == "stop", out.outputs[0].text
    jsonschema.validate(json.loads(match.group(1)), schema)
