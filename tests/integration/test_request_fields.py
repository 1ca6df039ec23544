"""vLLM's extra request fields, each observed doing what it asks: over real ``ringllm serve``
processes on the tiny model (one generating, one pooling with the priority policy) and through
``LLM``/``AsyncLLM``. tests/helpers/field_evidence.py names these tests."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from engine import LLM, BeamSearchParams, RequestOutputKind, SamplingParams
from engine.async_llm import AsyncLLM
from engine.beam_search import BeamSearch, BeamSearchSequence
from engine.config import AsyncEngineArgs
from engine.core.kv_cache import KVCacheManager
from engine.core.request import Request
from engine.entrypoints.openai.http_bodies import ChatCompletionRequest, CompletionRequest, decode_request
from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer, parse_sse
from tests.helpers.engine_utils import TINY

PROMPT = "The capital of France is a city that has been home to many famous artists and"
MESSAGES = [{"role": "user", "content": "Hello! Who are you?"}]


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with RemoteServer(tiny_model_dir, *TINY_SERVE_ARGS, "--enable-request-id-headers") as remote:
        yield remote


@pytest.fixture(scope="module")
def pooling_server(tiny_model_dir):
    with RemoteServer(
        tiny_model_dir, "--runner", "pooling", "--scheduling-policy", "priority", *TINY_SERVE_ARGS
    ) as remote:
        yield remote


def post(server, path, payload, headers=None, status=200):
    code, body, resp_headers = server.post_json(path, payload, headers)
    assert code == status, body
    return body if headers is None else (body, resp_headers)


def complete(server, **kw):
    return post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0.0, **kw})


def chat(server, **kw):
    return post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "temperature": 0.0, **kw})


def stream(server, path, payload):
    code, raw, _ = server.request(
        "POST", path, json.dumps({**payload, "stream": True}).encode(), {"Content-Type": "application/json"}
    )
    assert code == 200, raw
    return parse_sse(raw)


def tokenize(server, prompt=PROMPT):
    return post(server, "/tokenize", {"prompt": prompt})["tokens"]


def assert_400(server, path, payload, param):
    body = post(server, path, payload, status=400)
    assert body["error"]["param"] == param, body


# ---- what every sampling field turns into ----

SAMPLING = [
    ("temperature", 0.5, 0.5),
    ("top_p", 0.5, 0.5),
    ("top_k", 3, 3),
    ("min_p", 0.2, 0.2),
    ("repetition_penalty", 1.3, 1.3),
    ("presence_penalty", 0.5, 0.5),
    ("frequency_penalty", 0.5, 0.5),
    ("seed", 7, 7),
    ("ignore_eos", True, True),
    ("include_stop_str_in_output", True, True),
    ("skip_special_tokens", False, False),
    ("min_tokens", 2, 2),
    ("stop_token_ids", [5], [5]),
    ("truncate_prompt_tokens", 3, 3),
    ("truncation_side", "right", "right"),
]


@pytest.mark.parametrize(
    "cls,base", [(CompletionRequest, {"prompt": "x"}), (ChatCompletionRequest, {"messages": MESSAGES})]
)
@pytest.mark.parametrize("field,value,expected", SAMPLING, ids=[s[0] for s in SAMPLING])
def test_sampling_fields_reach_the_engine(cls, base, field, value, expected):
    """Each field lands in the SamplingParams the engine runs (the sampler tests observe each
    one's effect on the logits); a request without it keeps the default."""
    params = decode_request(json.dumps({**base, field: value}).encode(), cls).to_sampling_params({})
    default = decode_request(json.dumps(base).encode(), cls).to_sampling_params({})
    assert getattr(params, field) == expected != getattr(default, field)


def _first_new(ids):
    """The first position whose token did not occur before it."""
    return next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])


def test_stop_token_ids_and_min_tokens_over_http(server):
    seeded = dict(temperature=1.0, seed=3)  # the tiny model's greedy text repeats one token
    ids = complete(server, max_tokens=12, ignore_eos=True, return_token_ids=True, **seeded)["choices"][0]["token_ids"]
    i = _first_new(ids)
    stopped = complete(server, max_tokens=12, ignore_eos=True, return_token_ids=True, stop_token_ids=[ids[i]], **seeded)
    choice = stopped["choices"][0]
    assert choice["token_ids"] == ids[: i + 1] and choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == ids[i]
    first = complete(server, max_tokens=12, return_token_ids=True, stop_token_ids=[ids[0]], **seeded)["choices"][0]
    assert len(first["token_ids"]) == 1
    held = complete(server, max_tokens=12, return_token_ids=True, stop_token_ids=[ids[0]], min_tokens=3, **seeded)
    assert len(held["choices"][0]["token_ids"]) >= 3


def test_stream_options_without_stream_is_400(server):
    options = {"stream_options": {"include_usage": True}}
    assert_400(server, "/v1/completions", {"prompt": PROMPT, **options}, "stream_options")
    assert_400(server, "/v1/chat/completions", {"messages": MESSAGES, **options}, "stream_options")


def test_max_tokens_beyond_the_context_is_400(server):
    limit = json.loads(server.get("/v1/models")[1])["data"][0]["max_model_len"]
    assert_400(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": limit + 1}, "max_tokens")
    assert_400(
        server,
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_completion_tokens": limit + 1},
        "max_completion_tokens",
    )
    assert_400(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": limit + 1}, "max_tokens")


def test_add_generation_prompt_changes_the_prompt(server):
    opened = chat(server, return_token_ids=True)
    closed = chat(server, return_token_ids=True, add_generation_prompt=False)
    header = tokenize(server, "<|im_start|>assistant\n")
    assert opened["prompt_token_ids"] == closed["prompt_token_ids"] + header
    assert opened["usage"]["prompt_tokens"] == closed["usage"]["prompt_tokens"] + len(header)


def test_truncate_prompt_tokens_keeps_the_chosen_side(server):
    full = tokenize(server)
    left = complete(server, truncate_prompt_tokens=3, return_token_ids=True)
    assert left["choices"][0]["prompt_token_ids"] == full[-3:] and left["usage"]["prompt_tokens"] == 3
    right = complete(server, truncate_prompt_tokens=3, truncation_side="right", return_token_ids=True)
    assert right["choices"][0]["prompt_token_ids"] == full[:3]
    assert complete(server, truncate_prompt_tokens=-1, return_token_ids=True)["choices"][0]["prompt_token_ids"] == full
    whole = chat(server, return_token_ids=True)["prompt_token_ids"]
    cut = chat(server, return_token_ids=True, truncate_prompt_tokens=5)
    assert cut["prompt_token_ids"] == whole[-5:] and cut["usage"]["prompt_tokens"] == 5
    limit = json.loads(server.get("/v1/models")[1])["data"][0]["max_model_len"]
    assert_400(
        server, "/v1/completions", {"prompt": PROMPT, "truncate_prompt_tokens": limit + 1}, "truncate_prompt_tokens"
    )


def test_prompt_logprobs_without_echo_and_in_chat(server):
    full = tokenize(server)
    choice = complete(server, prompt_logprobs=1)["choices"][0]
    rows = choice["prompt_logprobs"]
    assert not choice["text"].startswith(PROMPT)  # no echo
    assert len(rows) == len(full) and rows[0] is None
    for token_id, row in zip(full[1:], rows[1:]):
        assert str(token_id) in row and 1 <= len(row) <= 2
        assert all(entry["logprob"] <= 0 and entry["rank"] >= 1 for entry in row.values())
    assert complete(server)["choices"][0]["prompt_logprobs"] is None
    answer = chat(server, prompt_logprobs=0)
    assert len(answer["prompt_logprobs"]) == answer["usage"]["prompt_tokens"]
    assert answer["prompt_logprobs"][0] is None and all(len(r) == 1 for r in answer["prompt_logprobs"][1:])
    assert_400(server, "/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs")


def test_return_tokens_as_token_ids_in_logprobs(server):
    out = complete(server, logprobs=2, return_tokens_as_token_ids=True, return_token_ids=True)["choices"][0]
    assert out["logprobs"]["tokens"] == [f"token_id:{i}" for i in out["token_ids"]]
    assert all(re.fullmatch(r"token_id:\d+", t) for top in out["logprobs"]["top_logprobs"] for t in top)
    plain = complete(server, logprobs=2)["choices"][0]["logprobs"]["tokens"]
    assert "".join(plain) == complete(server)["choices"][0]["text"]
    answer = chat(server, logprobs=True, top_logprobs=2, return_tokens_as_token_ids=True, return_token_ids=True)
    content = answer["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == [f"token_id:{i}" for i in answer["choices"][0]["token_ids"]]
    assert all(re.fullmatch(r"token_id:\d+", t["token"]) for c in content for t in c["top_logprobs"])
    assert content[0]["bytes"] == list(content[0]["token"].encode())


def test_return_token_ids_whole_and_streamed(server):
    whole = complete(server, max_tokens=6, ignore_eos=True, return_token_ids=True)
    choice = whole["choices"][0]
    assert choice["prompt_token_ids"] == tokenize(server) and len(choice["token_ids"]) == 6
    assert complete(server)["choices"][0]["token_ids"] is None
    chunks = stream(
        server,
        "/v1/completions",
        {"prompt": PROMPT, "max_tokens": 6, "temperature": 0.0, "ignore_eos": True, "return_token_ids": True},
    )
    assert chunks[0]["choices"][0]["prompt_token_ids"] == choice["prompt_token_ids"]
    assert all(c["choices"][0]["prompt_token_ids"] is None for c in chunks[1:])
    assert sum((c["choices"][0]["token_ids"] for c in chunks), []) == choice["token_ids"]
    answer = chat(server, max_tokens=6, ignore_eos=True, return_token_ids=True)
    assert len(answer["prompt_token_ids"]) == answer["usage"]["prompt_tokens"]
    assert len(answer["choices"][0]["token_ids"]) == 6
    chunks = stream(
        server,
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 6, "temperature": 0.0, "ignore_eos": True, "return_token_ids": True},
    )
    assert chunks[0]["prompt_token_ids"] == answer["prompt_token_ids"]
    assert sum((c["choices"][0]["token_ids"] or [] for c in chunks), []) == answer["choices"][0]["token_ids"]


def test_priority_needs_the_priority_policy_and_is_honoured(server, pooling_server):
    """fcfs refuses a priority (400 naming it, as vLLM); the priority policy serves it. Which
    request goes first under that policy:
    tests/integration/test_llm.py::test_priority_policy_serves_the_most_important_first."""
    assert_400(server, "/v1/completions", {"prompt": PROMPT, "priority": 1}, "priority")
    assert_400(server, "/v1/chat/completions", {"messages": MESSAGES, "priority": -1}, "priority")
    assert complete(server, priority=0)["choices"]
    assert post(pooling_server, "/v1/embeddings", {"input": PROMPT, "priority": 5})["data"]


def test_request_id_and_the_x_request_id_header(server):
    body, headers = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "request_id": "abc"}, {})
    assert body["id"] == "cmpl-abc" and headers["X-Request-Id"] == "abc"
    body, headers = post(
        server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2}, {"X-Request-Id": "hdr-1"}
    )
    assert body["id"] == "chatcmpl-hdr-1" and headers["X-Request-Id"] == "hdr-1"
    body, headers = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2}, {})
    assert body["id"] == f"cmpl-{headers['X-Request-Id']}"
    code, raw, headers = server.request(
        "POST",
        "/v1/completions",
        json.dumps({"prompt": PROMPT, "max_tokens": 2, "stream": True, "request_id": "s-1"}).encode(),
        {"Content-Type": "application/json"},
    )
    assert code == 200 and headers["X-Request-Id"] == "s-1" and parse_sse(raw)[0]["id"] == "cmpl-s-1"
    with ThreadPoolExecutor(4) as pool:  # one id sent by several clients at once: all are served
        bodies = list(pool.map(lambda _: complete(server, max_tokens=8, request_id="same"), range(4)))
    assert all(b["id"] == "cmpl-same" and b["choices"] for b in bodies)


def test_salted_blocks_hash_apart():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    tokens = list(range(12))

    def hashes(salt):
        return kv.block_hashes(Request("r", tokens, SamplingParams(), cache_salt=salt), len(tokens))

    assert hashes("a") == hashes("a") and hashes(None) == hashes(None)
    assert not set(hashes("a")) & set(hashes("b")) and not set(hashes("a")) & set(hashes(None))


def test_cache_salt_separates_prefix_cache_hits(server):
    """Over HTTP (usage.prompt_tokens_details.cached_tokens) and through LLM (num_cached_tokens):
    a salt hits only what the same salt cached."""
    prompt = PROMPT * 4  # several full blocks

    def cached(**kw):
        usage = complete(server, prompt=prompt, max_tokens=1, **kw)["usage"]
        return usage["prompt_tokens_details"]["cached_tokens"]

    cached(cache_salt="tenant-a")
    assert cached(cache_salt="tenant-a") > 0
    assert cached(cache_salt="tenant-b") == 0
    assert cached(cache_salt="tenant-c") == 0
    cached()
    assert cached() > 0 and cached(cache_salt="tenant-d") == 0
    assert_400(server, "/v1/completions", {"prompt": PROMPT, "cache_salt": ""}, "cache_salt")


# ---- chat echo and continuous usage ----


def test_chat_echo_starts_with_the_assistant_message(server):
    started = MESSAGES + [{"role": "assistant", "content": "I am"}]
    plain = chat(server, messages=started, continue_final_message=True, add_generation_prompt=False)
    echoed = chat(server, messages=started, continue_final_message=True, add_generation_prompt=False, echo=True)
    assert echoed["choices"][0]["message"]["content"] == "I am" + plain["choices"][0]["message"]["content"]
    content = chat(server)["choices"][0]["message"]["content"]
    assert chat(server, echo=True)["choices"][0]["message"]["content"] == content  # the last message is the user's
    chunks = stream(
        server,
        "/v1/chat/completions",
        {
            "messages": started,
            "max_tokens": 4,
            "temperature": 0.0,
            "continue_final_message": True,
            "add_generation_prompt": False,
            "echo": True,
        },
    )
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert chunks[1]["choices"][0]["delta"]["content"] == "I am" and text == echoed["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "path,base", [("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", {"messages": MESSAGES})]
)
def test_continuous_usage_stats_in_every_chunk(server, path, base):
    payload = {
        **base,
        "max_tokens": 5,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    chunks = [c for c in stream(server, path, payload)]
    with_text = [
        c
        for c in chunks
        if c["choices"] and (c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content"))
    ]
    assert with_text and all(c["usage"] is not None for c in with_text)
    counts = [c["usage"]["completion_tokens"] for c in with_text]
    assert counts == sorted(counts) and chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    if path == "/v1/chat/completions":  # as vLLM's, the role chunk says the prompt's tokens
        prompt = chunks[-1]["usage"]["prompt_tokens"]
        assert chunks[0]["usage"] == {
            "prompt_tokens": prompt,
            "completion_tokens": 0,
            "total_tokens": prompt,
            "prompt_tokens_details": None,
        }
    plain = stream(server, path, {**payload, "stream_options": {"include_usage": True}})
    assert all(c["usage"] is None for c in plain if c["choices"])


def test_continuous_usage_starts_at_the_chat_role_chunk(server):
    """vLLM's: the opening (role) chunk carries the prompt's usage, nothing generated yet;
    before, its usage was null."""
    chunks = stream(
        server,
        "/v1/chat/completions",
        {
            "messages": MESSAGES,
            "max_tokens": 3,
            "temperature": 0.0,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    role, prompt = chunks[0], chunks[-1]["usage"]["prompt_tokens"]
    assert role["choices"][0]["delta"]["role"] == "assistant" and prompt > 0
    assert {k: role["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == {
        "prompt_tokens": prompt,
        "completion_tokens": 0,
        "total_tokens": prompt,
    }


@pytest.mark.parametrize(
    "path,base",
    [
        ("/v1/completions", {"prompt": PROMPT * 4}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT * 4}]}),
    ],
)
def test_streamed_usage_reports_cached_prompt_tokens_as_the_whole_one_does(server, path, base):
    """Before, a stream's usage had ``prompt_tokens_details`` null where the whole response's
    counted the prompt tokens found in the prefix cache."""
    payload = {**base, "max_tokens": 2, "temperature": 0.0}
    post(server, path, payload)  # the prompt's full blocks are cached from here on
    whole = post(server, path, payload)["usage"]
    assert whole["prompt_tokens_details"]["cached_tokens"] > 0
    streamed = stream(server, path, {**payload, "stream_options": {"include_usage": True}})[-1]["usage"]
    assert streamed["prompt_tokens_details"] == whole["prompt_tokens_details"]
    assert streamed["prompt_tokens"] == whole["prompt_tokens"]


# ---- embeddings ----


def _embed(pooling_server, **kw):
    return post(pooling_server, "/v1/embeddings", {"input": PROMPT, **kw})


def test_embedding_dtype_endianness_and_activation(pooling_server):
    reference = torch.tensor(_embed(pooling_server)["data"][0]["embedding"])
    assert math.isclose(float(reference.norm()), 1.0, rel_tol=1e-5)
    raw = _embed(pooling_server, use_activation=False)["data"][0]["embedding"]
    assert not math.isclose(float(torch.tensor(raw).norm()), 1.0, rel_tol=1e-3)
    assert torch.allclose(torch.nn.functional.normalize(torch.tensor(raw), dim=0), reference, atol=1e-6)
    for dtype, numpy_dtype in (("float32", "f4"), ("float16", "f2")):
        for endianness, mark in (("little", "<"), ("big", ">")):
            encoded = _embed(pooling_server, encoding_format="base64", embed_dtype=dtype, endianness=endianness)[
                "data"
            ][0]["embedding"]
            values = np.frombuffer(base64.b64decode(encoded), mark + numpy_dtype)
            assert np.array_equal(values.astype(np.float32), reference.to(getattr(torch, dtype)).float().numpy())
    bf16 = _embed(pooling_server, encoding_format="base64", embed_dtype="bfloat16", endianness="big")
    bits = np.frombuffer(base64.b64decode(bf16["data"][0]["embedding"]), ">u2").astype(np.uint32) << 16
    assert np.array_equal(bits.view(np.float32), reference.to(torch.bfloat16).float().numpy())
    rounded = _embed(pooling_server, embed_dtype="float16")["data"][0]["embedding"]
    assert rounded == reference.to(torch.float16).float().tolist() != reference.tolist()


def test_embedding_truncation_salt_priority_and_request_id(pooling_server, server):
    ids = tokenize(server)
    left = _embed(pooling_server, truncate_prompt_tokens=3)
    assert left["usage"]["prompt_tokens"] == 3
    assert left["data"][0]["embedding"] == _embed(pooling_server, input=ids[-3:])["data"][0]["embedding"]
    right = _embed(pooling_server, truncate_prompt_tokens=3, truncation_side="right")
    assert right["data"][0]["embedding"] == _embed(pooling_server, input=ids[:3])["data"][0]["embedding"]
    salted = _embed(pooling_server, cache_salt="tenant", request_id="e-1", priority=2)
    assert salted["id"] == "embd-e-1"
    assert salted["data"][0]["embedding"] == _embed(pooling_server)["data"][0]["embedding"]


def test_embedding_input_of_strings_and_token_ids_mixed_is_a_400_naming_input(pooling_server):
    """vLLM's schema (``str | list[str] | list[int] | list[list[int]]``) refuses a mix, so the
    README's example once written as ``["some text", [1, 2, 3]]`` could not work: it says why."""
    for mixed in (["some text", [1, 2, 3]], [[1, 2, 3], "some text"], ["some text", 7]):
        code, body, _ = pooling_server.post_json("/v1/embeddings", {"input": mixed})
        assert (
            code == 400
            and body["error"]["param"] == "input"
            and "mixes strings and token ids" in body["error"]["message"]
        ), body
    texts, ids = _embed(pooling_server, input=["some text", "more"]), _embed(pooling_server, input=[[1, 2, 3], [4]])
    assert len(texts["data"]) == len(ids["data"]) == 2


# ---- the Python API ----


def test_llm_truncates_prompts_and_refuses_multi_modal_data(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, **TINY)
    try:
        full = llm.get_tokenizer().encode(PROMPT)
        params = SamplingParams(max_tokens=1, truncate_prompt_tokens=4)
        (out,) = llm.generate(PROMPT, params, use_tqdm=False)
        assert out.prompt_token_ids == full[-4:]
        (out,) = llm.generate(
            PROMPT, SamplingParams(max_tokens=1, truncate_prompt_tokens=4, truncation_side="right"), use_tqdm=False
        )
        assert out.prompt_token_ids == full[:4]
        salted = {"prompt": PROMPT * 4, "cache_salt": "a"}
        llm.generate(salted, SamplingParams(max_tokens=1), use_tqdm=False)
        assert llm.generate(salted, SamplingParams(max_tokens=1), use_tqdm=False)[0].num_cached_tokens > 0
        assert (
            llm.generate({**salted, "cache_salt": "b"}, SamplingParams(max_tokens=1), use_tqdm=False)[
                0
            ].num_cached_tokens
            == 0
        )
        skipping = SamplingParams(max_tokens=1, skip_reading_prefix_cache=True)
        assert llm.generate(salted, skipping, use_tqdm=False)[0].num_cached_tokens == 0
        for key in ("multi_modal_data", "mm_processor_kwargs"):
            with pytest.raises(ValueError, match=key):
                llm.generate({"prompt": PROMPT, key: {"image": [0]}}, params, use_tqdm=False)
        assert not llm.llm_engine.has_unfinished_requests()
    finally:
        llm.shutdown()

    async def run():
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, **TINY))
        try:
            with pytest.raises(ValueError, match="multi_modal_data"):
                async for _ in engine.generate(
                    {"prompt": PROMPT, "multi_modal_data": {"image": [0]}}, SamplingParams(max_tokens=1), "mm"
                ):
                    pass
        finally:
            engine.shutdown()

    asyncio.run(run())


# ---- beam search over HTTP ----


def test_use_beam_search_gives_the_beams_llm_beam_search_finds(server, tiny_model_dir):
    """The n best beams, best first, exactly those of LLM.beam_search on the same model and
    weights (--seed 0), length_penalty included; what a beam search cannot honour is a 400."""
    ask = dict(n=3, max_tokens=4, ignore_eos=True, length_penalty=0.5, use_beam_search=True, return_token_ids=True)
    out = complete(server, **ask)
    beams = [c["token_ids"] for c in sorted(out["choices"], key=lambda c: c["index"])]
    assert len(beams) == 3 and len({tuple(b) for b in beams}) == 3 and all(len(b) == 4 for b in beams)
    assert out["usage"]["completion_tokens"] == 12
    answer = chat(server, **ask)
    assert len(answer["choices"]) == 3 and all(len(c["token_ids"]) == 4 for c in answer["choices"])
    llm = LLM(model=tiny_model_dir, **TINY)
    try:
        (expected,) = llm.beam_search(
            [PROMPT], BeamSearchParams(beam_width=3, max_tokens=4, ignore_eos=True, length_penalty=0.5)
        )
        prompt_len = len(llm.get_tokenizer().encode(PROMPT))
    finally:
        llm.shutdown()
    assert beams == [seq.tokens[prompt_len:] for seq in expected.sequences]
    for field, value in (("stream", True), ("logprobs", 1), ("stop", ["x"]), ("top_p", 0.5)):
        assert_400(server, "/v1/completions", {"prompt": PROMPT, "use_beam_search": True, field: value}, field)


def test_length_penalty_divides_the_score_by_length_to_its_power():
    search = BeamSearch([[1, 2]], BeamSearchParams(beam_width=2, max_tokens=2, length_penalty=0.5), eos_token_id=0)
    beam = BeamSearchSequence([1, 2, 3, 4], cum_logprob=-8.0)
    assert search.score(beam) == -8.0 / 4**0.5
    search.params = BeamSearchParams(beam_width=2, max_tokens=2, length_penalty=2.0)
    assert search.score(beam) == -8.0 / 16


def test_a_prompt_longer_than_the_context_fits_once_truncated(server):
    """The size check that refuses text too long for max_model_len before tokenizing it steps
    aside when the request truncates: vLLM cuts any prompt to truncate_prompt_tokens."""
    limit = json.loads(server.get("/v1/models")[1])["data"][0]["max_model_len"]
    text = "word " * (limit * 100)  # far more bytes than max_model_len tokens can hold
    assert_400(server, "/v1/completions", {"prompt": text, "max_tokens": 1}, "prompt")
    out = complete(server, prompt=text, max_tokens=1, truncate_prompt_tokens=8)
    assert out["usage"]["prompt_tokens"] == 8
    answer = chat(server, messages=[{"role": "user", "content": text}], max_tokens=1, truncate_prompt_tokens=8)
    assert answer["usage"]["prompt_tokens"] == 8
    assert_400(
        server, "/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": 1}, "messages"
    )


# ---- add_special_tokens, on a tokenizer that adds a BOS ----


@pytest.fixture(scope="module")
def bos_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model, its tokenizer made to add <|im_start|> (id 1) in front of every text, as
    Llama's adds its BOS (the default tokenizer adds nothing, so the field would show nothing)."""
    path = tmp_path_factory.mktemp("bos-model")
    shutil.copytree(tiny_model_dir, path, dirs_exist_ok=True)
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    bos = {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}
    tokenizer["post_processor"]["single"] = [bos, *tokenizer["post_processor"]["single"]]
    tokenizer["post_processor"]["special_tokens"] = {
        "<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}
    }
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    return str(path)


def test_add_special_tokens_adds_the_tokenizers_bos_or_not(bos_model_dir):
    with RemoteServer(bos_model_dir, *TINY_SERVE_ARGS) as remote:
        full = post(remote, "/tokenize", {"prompt": PROMPT})["tokens"]
        assert full[0] == 1
        with_bos = complete(remote, return_token_ids=True)["choices"][0]["prompt_token_ids"]
        without = complete(remote, return_token_ids=True, add_special_tokens=False)["choices"][0]["prompt_token_ids"]
        assert with_bos == full and without == full[1:]
        rendered = chat(remote, return_token_ids=True)["prompt_token_ids"]
        assert (
            rendered[0] == 1
            and chat(remote, return_token_ids=True, add_special_tokens=True)["prompt_token_ids"] == [1] + rendered
        )
    with RemoteServer(bos_model_dir, "--runner", "pooling", *TINY_SERVE_ARGS) as remote:
        usage = post(remote, "/v1/embeddings", {"input": PROMPT})["usage"]["prompt_tokens"]
        plain = post(remote, "/v1/embeddings", {"input": PROMPT, "add_special_tokens": False})
        assert plain["usage"]["prompt_tokens"] == usage - 1
        by_ids = post(remote, "/v1/embeddings", {"input": full[1:]})
        assert plain["data"][0]["embedding"] == by_ids["data"][0]["embedding"]


def test_documents_reasoning_effort_and_return_prompt_text(server):
    """documents and reasoning_effort reach the template as vLLM passes them; return_prompt_text
    sends back what it rendered (whole, and in a stream's first chunk)."""
    template = (
        "{% for d in documents %}[{{ d.title }}: {{ d.text }}]{% endfor %}<{{ reasoning_effort }}>"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    ask = dict(
        chat_template=template,
        documents=[{"title": "T", "text": "body"}],
        reasoning_effort="high",
        return_prompt_text=True,
    )
    answer = chat(server, **ask)
    assert answer["prompt_text"] == "[T: body]<high>" + MESSAGES[0]["content"]
    assert answer["usage"]["prompt_tokens"] == len(tokenize(server, answer["prompt_text"]))
    assert chat(server)["prompt_text"] is None
    kwargs_win = chat(server, **ask, chat_template_kwargs={"reasoning_effort": "low"})
    assert "<low>" in kwargs_win["prompt_text"]
    chunks = stream(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, **ask})
    assert chunks[0]["prompt_text"] == answer["prompt_text"] and all(c["prompt_text"] is None for c in chunks[1:])


def test_a_request_id_longer_than_its_bound_is_400(server):
    long_id = "x" * 257
    assert_400(server, "/v1/completions", {"prompt": PROMPT, "request_id": long_id}, "request_id")
    code, body, _ = server.post_json("/v1/completions", {"prompt": PROMPT, "max_tokens": 1}, {"X-Request-Id": long_id})
    assert code == 400 and body["error"]["param"] == "X-Request-Id"


def test_stream_interval_batches_the_streamed_tokens(server, tiny_model_dir):
    """Every chunk but the first and the last carries at least stream_interval tokens (vLLM's
    meaning), over HTTP and through AsyncLLM.generate; the tokens are the same as without it."""
    payload = {"prompt": PROMPT, "max_tokens": 13, "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}
    plain = sum((c["choices"][0]["token_ids"] for c in stream(server, "/v1/completions", payload)), [])
    batched = stream(server, "/v1/completions", {**payload, "stream_interval": 4})
    chunks = [c["choices"][0]["token_ids"] for c in batched]
    assert sum(chunks, []) == plain and len(plain) == 13
    assert all(len(ids) >= 4 for ids in chunks[1:-1]) and len(chunks) <= 2 + (13 - 1) // 4
    assert_400(server, "/v1/completions", {**payload, "stream": True, "stream_interval": 0}, "stream_interval")

    async def run(kind):
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, **TINY))
        try:
            params = SamplingParams(
                max_tokens=10, ignore_eos=True, temperature=0.0, stream_interval=3, output_kind=kind
            )
            return [[len(c.token_ids) for c in out.outputs] async for out in engine.generate(PROMPT, params, "si")]
        finally:
            engine.shutdown()

    deltas = [n for (n,) in asyncio.run(run(RequestOutputKind.DELTA))]
    assert sum(deltas) == 10 and all(n >= 3 for n in deltas[1:-1])
    totals = [n for (n,) in asyncio.run(run(RequestOutputKind.CUMULATIVE))]
    assert totals[-1] == 10 and all(b - a >= 3 for a, b in zip(totals, totals[1:-1]))
    with pytest.raises(ValueError, match="stream_interval"):
        SamplingParams(stream_interval=0)
