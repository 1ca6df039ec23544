"""The keywords vLLM scripts pass to ``LLM`` and its methods, with vLLM's meaning, through a
real LLM (EngineCore process, real tokenizer): chat_template, lora_request,
tokenization_kwargs, disable_log_stats, the queued offline API (enqueue / enqueue_chat /
wait_for_completion), the single-device keywords and their CLI flags."""

from __future__ import annotations

import argparse

import pytest

from engine import LLM, BeamSearchParams, EngineArgs, SamplingParams
from engine.entrypoints.cli_args import add_engine_args, engine_args_from
from tests.helpers.engine_utils import TINY

PARAMS = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}:{{ m['content'] }}>{% endfor %}"


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    llm = LLM(
        model=tiny_model_dir,
        chat_template=TEMPLATE,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        quantization=None,
        **TINY,
    )
    yield llm
    llm.shutdown()


def test_llm_turns_log_stats_off_unless_given(llm, tiny_model_dir):
    assert llm.llm_engine.config.disable_log_stats is True
    given = LLM(model=tiny_model_dir, disable_log_stats=False, **TINY)
    try:
        assert given.llm_engine.config.disable_log_stats is False
    finally:
        given.shutdown()


def test_chat_template_on_the_constructor_and_on_chat(llm, tmp_path):
    messages = [{"role": "user", "content": "hi"}]
    (out,) = llm.chat(messages, PARAMS, use_tqdm=False)
    assert out.prompt == "<user:hi>"
    path = tmp_path / "template.jinja"
    path.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    (out,) = llm.chat(messages, PARAMS, use_tqdm=False, chat_template=str(path))
    assert out.prompt == "[hi]"
    with pytest.raises(ValueError, match="neither a file nor a template"):
        llm.chat(messages, PARAMS, chat_template="no/such/template.jinja")


def test_lora_request_none_is_accepted_and_a_lora_request_is_refused(llm):
    (out,) = llm.generate("hello", PARAMS, use_tqdm=False, lora_request=None)
    assert len(out.outputs[0].token_ids) == 2
    for call in (
        lambda: llm.generate("hello", PARAMS, lora_request=object()),
        lambda: llm.chat([{"role": "user", "content": "x"}], PARAMS, lora_request=object()),
        lambda: llm.llm_engine.add_request("x", "hello", PARAMS, lora_request=object()),
    ):
        with pytest.raises(ValueError, match="LoRA"):
            call()
    assert not llm.llm_engine.has_unfinished_requests()


def test_tokenization_kwargs_truncate_the_prompt_as_the_tokenizer_does(llm, tiny_model_dir):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(tiny_model_dir)  # its own: encode(truncation=...) changes it
    text = "one two three four five six seven eight nine ten eleven twelve"
    full = reference.encode(text)
    for kwargs in (
        {"truncation": True, "max_length": 5},
        {"max_length": 3},
        {"truncation": True, "max_length": 4, "add_special_tokens": False},
    ):
        (out,) = llm.generate(text, PARAMS, use_tqdm=False, tokenization_kwargs=kwargs)
        assert out.prompt == text and len(full) > 5
        assert out.prompt_token_ids == reference.encode(text, **kwargs)
        assert len(out.prompt_token_ids) == kwargs["max_length"]
    # the truncation stays with the request that asked for it
    (untouched,) = llm.generate(text, PARAMS, use_tqdm=False, tokenization_kwargs=None)
    assert untouched.prompt_token_ids == full
    with pytest.raises(ValueError, match="unsupported key"):
        llm.generate(text, PARAMS, tokenization_kwargs={"padding": "max_length"})


def test_enqueue_then_wait_for_completion_returns_the_queued_outputs_in_order(llm):
    ids = llm.enqueue(["first", "second"], PARAMS)
    chat_ids = llm.enqueue_chat([{"role": "user", "content": "third"}], PARAMS)
    (meanwhile,) = llm.generate("in between", PARAMS, use_tqdm=False)  # runs the queued ones too
    assert meanwhile.prompt == "in between"
    outs = llm.wait_for_completion(use_tqdm=False)
    assert [o.request_id for o in outs] == ids + chat_ids and all(o.finished for o in outs)
    assert [o.prompt for o in outs] == ["first", "second", "<user:third>"]
    assert all(len(o.outputs[0].token_ids) == 2 for o in outs)
    assert llm.wait_for_completion(use_tqdm=False) == []


def test_single_device_keywords_other_than_one_are_refused_before_launch(tiny_model_dir):
    for kwargs, match in [
        ({"tensor_parallel_size": 2}, "tensor_parallel_size=2 is not supported"),
        ({"pipeline_parallel_size": 4}, "pipeline_parallel_size=4 is not supported"),
        ({"quantization": "awq"}, r"quantization='awq' is not supported; supported: None"),
        ({"shutdown_timeout": -1}, "shutdown_timeout"),
    ]:
        with pytest.raises(ValueError, match=match):
            LLM(model=tiny_model_dir, **{**TINY, **kwargs})


def test_kv_cache_memory_bytes_and_its_alias(tiny_model_dir):
    tiny = {k: v for k, v in TINY.items() if k != "kv_cache_memory"}

    def kv_bytes(**kwargs) -> int:
        return EngineArgs(model=tiny_model_dir, **tiny, **kwargs).create_engine_config().cache_config.kv_cache_memory

    assert kv_bytes(kv_cache_memory_bytes=8 << 20) == kv_bytes(kv_cache_memory=8 << 20) == 8 << 20
    assert kv_bytes() == 2 << 30
    with pytest.raises(ValueError, match="disagree"):
        kv_bytes(kv_cache_memory_bytes=8 << 20, kv_cache_memory=4 << 20)
    with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
        kv_bytes(kv_cache_memory_bytes=0)


def test_the_new_engine_args_have_cli_flags():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = engine_args_from(
        parser.parse_args(
            [
                "--kv-cache-memory-bytes",
                "1048576",
                "--tensor-parallel-size",
                "1",
                "--pipeline-parallel-size",
                "1",
                "--quantization",
                "awq",
                "--shutdown-timeout",
                "2.5",
                "--worker-cls",
                "faulty_runner.FaultyWorker",
            ]
        )
    )
    assert (
        args.kv_cache_memory_bytes,
        args.tensor_parallel_size,
        args.pipeline_parallel_size,
        args.quantization,
        args.shutdown_timeout,
        args.worker_cls,
    ) == (1 << 20, 1, 1, "awq", 2.5, "faulty_runner.FaultyWorker")


def test_beam_search_params_is_exported_beside_llm(llm):
    (out,) = llm.beam_search(["hi"], BeamSearchParams(beam_width=2, max_tokens=2))
    assert len(out.sequences) == 2
