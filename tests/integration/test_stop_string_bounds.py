"""Stop strings are bounded (SamplingParams.MAX_STOP_STRINGS of at most MAX_STOP_STRING_CHARS
each: ringllm's bound, vLLM documents none), and matching them costs a step little: through
SamplingParams, the detokenizer, and a real ``ringllm serve`` on the tiny model."""

from __future__ import annotations


import pytest

from engine.frontend.detokenizer import ByteLevelTable, make_detokenizer
from engine.frontend.tokenizer import FastTokenizer
from engine.sampling_params import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, SamplingParams
from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer, post_while_probing_health


@pytest.mark.parametrize(
    "stop",
    [[f"s{i}" for i in range(MAX_STOP_STRINGS + 1)], ["x" * (MAX_STOP_STRING_CHARS + 1)]],
    ids=["too-many", "too-long"],
)
def test_sampling_params_refuses_stop_strings_past_the_bound(stop):
    with pytest.raises(ValueError, match="SamplingParams.stop: at most 256 stop strings") as err:
        SamplingParams(stop=stop)
    assert err.value.parameter == "stop"


def test_the_bound_itself_is_accepted():
    params = SamplingParams(stop=[f"{i:04d}" + "x" * (MAX_STOP_STRING_CHARS - 4) for i in range(MAX_STOP_STRINGS)])
    assert len(params.stop) == MAX_STOP_STRINGS


@pytest.mark.parametrize(
    "stops,expected",
    [
        (["zz", "lo w"], ("hel", "lo w")),  # the first stop found, in list order
        (["o", "l"], ("hell", "o")),  # vLLM's order, not the earliest match
        (["nothing"], ("hello world", None)),
    ],
)
@pytest.mark.parametrize("byte_level", [True, False], ids=["table", "stream"])
def test_stop_strings_match_as_before_with_many_or_few(tiny_model_dir, stops, expected, byte_level):
    backend = FastTokenizer.from_dir(tiny_model_dir).backend_tokenizer
    table = ByteLevelTable.build(backend) if byte_level else None
    ids = backend.encode("hello world", add_special_tokens=False).ids
    for padding in (0, MAX_STOP_STRINGS - len(stops)):  # the same answer among 256 stops that never match
        params = SamplingParams(stop=stops + [f"never{i}" for i in range(padding)])
        detok = make_detokenizer(backend, table, [1], params)
        found = None
        for token in ids:
            found = detok.update([token], False)
            if found is not None:
                break
        assert (detok.output_text, found) == expected, padding


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with RemoteServer(tiny_model_dir, *TINY_SERVE_ARGS, "--served-model-name", "tiny") as server:
        yield server


def test_a_huge_stop_list_is_a_400_naming_stop(server):
    stops = [f"{i:07d}" for i in range(330_000)]  # the case: it stalled /health for 1.6 s
    status, body, _ = server.post_json(
        "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 8, "n": 8, "stop": stops}
    )
    assert status == 400 and body["error"]["param"] == "stop", body


@pytest.mark.slow
def test_the_most_stop_strings_with_n_8_leave_health_answering(server):
    stops = [f"never-{i:05d}-" + "x" * 64 for i in range(MAX_STOP_STRINGS)]
    (status, body, _), probes = post_while_probing_health(
        server,
        "/v1/completions",
        {
            "model": "tiny",
            "prompt": "hi",
            "max_tokens": 256,
            "n": 8,
            "ignore_eos": True,
            "temperature": 1.0,
            "seed": 0,
            "stop": stops,
        },
    )
    assert status == 200, body
    assert all(len(c["text"]) > 0 for c in body["choices"])
    assert probes and all(code == 200 for code, _ in probes)
    # ~1 ms when idle; a bound generous enough for CI under load (not a timing test).
    assert max(rtt for _, rtt in probes) < 5.0, probes
