"""OutputProcessor with the default model's real tokenizer: detokenization, stop strings,
finish reasons, output kinds, n > 1 merging and logprobs."""

from __future__ import annotations

import pytest

from engine.frontend.output_processor import OutputProcessor, ParentRequest
from engine.sampling_params import RequestOutputKind, SamplingParams
from engine.wire_messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason, LogprobsLists

EOS = 2
TEXT = "héllo wörld 你好 🙂, the end"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from engine.models.default_model import default_tokenizer_path

    return AutoTokenizer.from_pretrained(default_tokenizer_path())


@pytest.fixture(params=["byte-level table", "DecodeStream"])
def processor(request, tokenizer):
    processor = OutputProcessor(tokenizer)
    assert processor._table is not None  # the default tokenizer is byte-level
    if request.param == "DecodeStream":  # as for a tokenizer of another kind
        processor._table = None
    return processor


def add(processor, tokenizer, request_id="r", prompt="Say:", **params):
    request = EngineCoreRequest(request_id, tokenizer.encode(prompt), SamplingParams(**params), EOS)
    processor.add_request(request, prompt)
    return request


def feed(processor, request_id, token_ids, finish_reason=None, stop_reason=None, per_step=1, **last):
    """Send ``token_ids`` as core outputs, ``per_step`` at a time; the last carries the finish."""
    results = []
    for i in range(0, len(token_ids), per_step):
        done = i + per_step >= len(token_ids)
        out = EngineCoreOutput(
            request_id,
            token_ids[i : i + per_step],
            finish_reason=finish_reason if done else None,
            stop_reason=stop_reason if done else None,
            **(last if done else {}),
        )
        results.append(processor.process_outputs([out]))
    return results


def texts(results):
    return [o.outputs[0].text for r in results for o in r.request_outputs]


def test_streaming_never_emits_a_broken_utf8_character(processor, tokenizer):
    ids = tokenizer.encode(TEXT)
    add(processor, tokenizer, output_kind=RequestOutputKind.DELTA)
    deltas = texts(feed(processor, "r", ids, FinishReason.LENGTH))
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == TEXT
    assert "" in deltas  # some tokens end inside a character and show nothing yet


def test_delta_concatenation_equals_cumulative_equals_final_only(processor, tokenizer):
    ids = tokenizer.encode(TEXT)
    for kind, rid in (
        (RequestOutputKind.DELTA, "d"),
        (RequestOutputKind.CUMULATIVE, "c"),
        (RequestOutputKind.FINAL_ONLY, "f"),
    ):
        add(processor, tokenizer, rid, output_kind=kind)
    delta = feed(processor, "d", ids, FinishReason.LENGTH)
    cumulative = feed(processor, "c", ids, FinishReason.LENGTH)
    final = feed(processor, "f", ids, FinishReason.LENGTH)
    assert "".join(texts(delta)) == texts(cumulative)[-1] == texts(final)[-1] == TEXT
    assert sum(len(o.outputs[0].token_ids) for r in delta for o in r.request_outputs) == len(ids)
    assert cumulative[-1].request_outputs[0].outputs[0].token_ids == ids
    assert [len(r.request_outputs) for r in final] == [0] * (len(final) - 1) + [1]
    assert final[-1].request_outputs[0].finished and final[-1].request_outputs[0].prompt == "Say:"


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_spanning_tokens_ends_the_request_and_asks_the_core_to_abort(processor, tokenizer, include):
    ids = tokenizer.encode("one two three four five")
    add(
        processor,
        tokenizer,
        stop=["ee fo"],
        include_stop_str_in_output=include,
        output_kind=RequestOutputKind.CUMULATIVE,
    )
    results = feed(processor, "r", ids)
    hit = next(i for i, r in enumerate(results) if r.reqs_to_abort)
    assert results[hit].reqs_to_abort == ["r"]
    out = results[hit].request_outputs[0]
    assert out.finished and out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == "ee fo"
    assert out.outputs[0].text == ("one two three fo" if include else "one two thr")
    assert not processor.has_unfinished_requests()
    assert feed(processor, "r", ids[:1])[0].request_outputs == []  # late core output: ignored


def test_streamed_text_holds_back_a_possible_stop_string_prefix(processor, tokenizer):
    text = "abc abc abc abc abd"
    ids = tokenizer.encode(text)
    add(processor, tokenizer, stop=["abc abd!"], output_kind=RequestOutputKind.DELTA)
    shown = ""
    for n, result in enumerate(feed(processor, "r", ids, FinishReason.LENGTH), 1):
        shown += "".join(texts([result]))
        so_far = tokenizer.decode(ids[:n])
        held = 0 if n == len(ids) else len("abc abd!") - 1  # everything comes out at the finish
        assert shown == so_far[: max(0, len(so_far) - held)]
    assert shown == text


def test_min_tokens_keeps_stop_strings_from_matching_early(processor, tokenizer):
    ids = tokenizer.encode(" stop here stop there")
    add(processor, tokenizer, stop=["stop"], min_tokens=2, output_kind=RequestOutputKind.FINAL_ONLY)
    results = feed(processor, "r", ids)
    out = next(o for r in results for o in r.request_outputs)
    assert out.outputs[0].text == " stop here "


def test_finish_reasons_and_stop_token_text(processor, tokenizer):
    ids = tokenizer.encode(" a b")
    add(processor, tokenizer, "eos", output_kind=RequestOutputKind.FINAL_ONLY)
    add(processor, tokenizer, "tok", output_kind=RequestOutputKind.FINAL_ONLY)
    add(processor, tokenizer, "len", output_kind=RequestOutputKind.FINAL_ONLY)
    add(processor, tokenizer, "abort", output_kind=RequestOutputKind.FINAL_ONLY)
    add(processor, tokenizer, "err", output_kind=RequestOutputKind.FINAL_ONLY)
    got = {}
    for rid, toks, reason, stop in (
        ("eos", ids + [EOS], FinishReason.STOP, None),
        ("tok", ids, FinishReason.STOP, ids[-1]),
        ("len", ids, FinishReason.LENGTH, None),
        ("abort", ids, FinishReason.ABORT, None),
    ):
        got[rid] = feed(processor, rid, toks, reason, stop, per_step=len(toks))[0].request_outputs[0]
    err = processor.process_outputs(
        [EngineCoreOutput("err", [], finish_reason=FinishReason.ERROR, error="bad thing")]
    ).request_outputs[0]
    assert (got["eos"].outputs[0].finish_reason, got["eos"].outputs[0].stop_reason) == ("stop", None)
    assert got["eos"].outputs[0].text == " a b" and got["eos"].outputs[0].token_ids[-1] == EOS
    assert (got["tok"].outputs[0].finish_reason, got["tok"].outputs[0].stop_reason) == ("stop", ids[-1])
    assert got["tok"].outputs[0].text == " a"  # the stop token's own text is left out
    assert got["len"].outputs[0].finish_reason == "length" and got["len"].outputs[0].text == " a b"
    assert got["abort"].outputs[0].finish_reason == "abort"
    assert err.finished and err.outputs[0].finish_reason == "error" and err.error == "bad thing"
    assert not processor.has_unfinished_requests()


def test_n_children_merge_into_one_output(processor, tokenizer):
    params = SamplingParams(n=3, seed=5, output_kind=RequestOutputKind.FINAL_ONLY)
    parent = ParentRequest("p", params)
    prompt_ids = tokenizer.encode("Hi")
    children = []
    for index in range(3):
        child_id, child_params = parent.child(index)
        assert child_params.n == 1 and child_params.seed == 5 + index
        processor.add_request(EngineCoreRequest(child_id, prompt_ids, child_params, EOS), "Hi", parent, index)
        children.append(child_id)
    assert children == ["0_p", "1_p", "2_p"]
    assert feed(processor, "1_p", tokenizer.encode(" one"), FinishReason.LENGTH)[-1].request_outputs == []
    assert feed(processor, "0_p", tokenizer.encode(" zero"), FinishReason.LENGTH)[-1].request_outputs == []
    final = feed(processor, "2_p", tokenizer.encode(" two"), FinishReason.LENGTH)[-1].request_outputs
    assert len(final) == 1 and final[0].request_id == "p" and final[0].finished
    assert [c.index for c in final[0].outputs] == [0, 1, 2]
    assert [c.text for c in final[0].outputs] == [" zero", " one", " two"]
    assert not processor.parent_requests and not processor.has_unfinished_requests()


def test_streaming_children_pass_through_and_abort_covers_them(processor, tokenizer):
    parent = ParentRequest("p", SamplingParams(n=2, output_kind=RequestOutputKind.DELTA))
    for index in range(2):
        child_id, child_params = parent.child(index)
        processor.add_request(EngineCoreRequest(child_id, [5], child_params, EOS), None, parent, index)
    out = processor.process_outputs([EngineCoreOutput("1_p", [300])]).request_outputs
    assert len(out) == 1 and out[0].request_id == "p" and out[0].outputs[0].index == 1 and not out[0].finished
    assert sorted(processor.abort_requests(["p"])) == ["0_p", "1_p"]
    assert not processor.has_unfinished_requests() and not processor.parent_requests


def test_logprobs_become_vllm_dicts_with_decoded_tokens(processor, tokenizer):
    hello, world, comma = tokenizer.encode("hello")[0], tokenizer.encode(" world")[0], tokenizer.encode(",")[0]
    add(processor, tokenizer, logprobs=2, prompt_logprobs=1, output_kind=RequestOutputKind.DELTA)
    prompt_rows = LogprobsLists([[hello, hello]], [[-0.5, -0.5]], [1])
    processor.process_outputs([EngineCoreOutput("r", [], new_prompt_logprobs=prompt_rows)])
    sample = LogprobsLists([[world, comma, world]], [[-1.5, -0.25, -1.5]], [2])
    first = processor.process_outputs([EngineCoreOutput("r", [world], new_logprobs=sample)]).request_outputs[0]
    row = first.outputs[0].logprobs[0]
    assert list(row) == [world, comma]  # the sampled token first, no duplicate entry
    assert (row[world].rank, row[world].logprob, row[world].decoded_token) == (2, -1.5, " world")
    assert (row[comma].rank, row[comma].decoded_token) == (1, ",")
    assert first.outputs[0].cumulative_logprob == -1.5
    assert first.prompt_logprobs[0] is None and first.prompt_logprobs[1][hello].decoded_token == "hello"
    second = processor.process_outputs(
        [
            EngineCoreOutput(
                "r",
                [comma],
                new_logprobs=LogprobsLists([[comma, comma]], [[-0.5, -0.5]], [1]),
                finish_reason=FinishReason.LENGTH,
            )
        ]
    ).request_outputs[0]
    assert second.prompt_logprobs is None  # DELTA: prompt logprobs come once
    assert len(second.outputs[0].logprobs) == 1 and second.outputs[0].cumulative_logprob == -2.0


def test_detokenize_false_gives_token_ids_only(processor, tokenizer):
    ids = tokenizer.encode(" plain")
    add(processor, tokenizer, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)
    out = feed(processor, "r", ids, FinishReason.LENGTH)[-1].request_outputs[0]
    assert out.outputs[0].text == "" and out.outputs[0].token_ids == ids


def test_duplicate_request_id_is_refused(processor, tokenizer):
    add(processor, tokenizer, "x")
    with pytest.raises(ValueError, match="already in use"):
        add(processor, tokenizer, "x")


def test_prompt_ending_inside_a_character_does_not_repeat_the_prompt(processor, tokenizer):
    ids = tokenizer.encode("wörld 你好")
    cut = next(i for i in range(1, len(ids)) if "\ufffd" in tokenizer.decode(ids[:i]))
    request = EngineCoreRequest("r", ids[:cut], SamplingParams(output_kind=RequestOutputKind.DELTA), EOS)
    processor.add_request(request, None)
    shown = "".join(texts(feed(processor, "r", ids[cut:], FinishReason.LENGTH)))
    # The character begun in the prompt comes out whole with the first output token.
    assert shown == tokenizer.decode(ids)[len(tokenizer.decode(ids[:cut]).rstrip("\ufffd")) :]


def test_fold_merges_each_run_of_one_cores_messages_and_keeps_the_others_apart():
    step = [
        EngineCoreOutputs(0, [EngineCoreOutput("a", [1])]),
        EngineCoreOutputs(0, [EngineCoreOutput("a", [2])]),
        EngineCoreOutputs(1, [EngineCoreOutput("b", [3])]),
        EngineCoreOutputs(0, [EngineCoreOutput("a", [4])]),
    ]
    folded = OutputProcessor.fold(step)
    assert [m.engine_index for m in folded] == [0, 1, 0]
    assert [[(o.request_id, o.new_token_ids) for o in m.outputs] for m in folded] == [
        [("a", [1, 2])],
        [("b", [3])],
        [("a", [4])],
    ]


def test_the_core_finished_requests_are_reported_and_a_stop_string_is_left_to_the_abort(processor, tokenizer):
    add(processor, tokenizer, "long", max_tokens=3)
    add(processor, tokenizer, "stopped", stop=["lo"])
    ids = tokenizer.encode(" hello")
    result = processor.process_outputs(
        [EngineCoreOutput("long", ids, finish_reason=FinishReason.LENGTH), EngineCoreOutput("stopped", ids)]
    )
    assert result.finished_by_core == ["long"] and result.reqs_to_abort == ["stopped"]
