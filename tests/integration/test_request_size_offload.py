"""A request is worked off the event loop by its whole size, not its prompt's: a short prompt with
a huge ``choice``, ``bad_words`` or ``allowed_token_ids`` list leaves /health answering within
200 ms while it is parsed, validated and tokenized, or refused naming the field (``bad_words`` and
``choice`` are bounded). A real ``ringllm serve`` process on the tiny dummy-weight model, probed by
a process of its own (test_openai_server_hardening.py's).
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from engine.exceptions import ParameterError
from engine.sampling_params import MAX_BAD_WORDS, SamplingParams, StructuredOutputsParams
from engine.structured_output.params import MAX_CHOICES
from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer
from tests.integration.test_openai_server_hardening import HEALTH_BUDGET_S, HealthProber


def test_bad_words_and_choices_are_bounded_naming_the_field():
    assert len(SamplingParams(bad_words=[f"w{i}" for i in range(MAX_BAD_WORDS)]).bad_words) == MAX_BAD_WORDS
    with pytest.raises(ParameterError, match=f"at most {MAX_BAD_WORDS} words") as err:
        SamplingParams(bad_words=[f"w{i}" for i in range(MAX_BAD_WORDS + 1)])
    assert err.value.parameter == "bad_words"
    assert len(StructuredOutputsParams(choice=[f"c{i}" for i in range(MAX_CHOICES)]).choice) == MAX_CHOICES
    with pytest.raises(ParameterError, match=f"at most {MAX_CHOICES} choices") as err:
        StructuredOutputsParams(choice=[f"c{i}" for i in range(MAX_CHOICES + 1)])
    assert err.value.parameter == "structured_outputs"


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with RemoteServer(
        tiny_model_dir, *TINY_SERVE_ARGS, "--served-model-name", "tiny", "--max-request-body-bytes", str(8 << 20)
    ) as remote:
        yield remote


def _probed(server: RemoteServer, path: str, body: dict) -> tuple[int, dict, list[tuple[float, object]]]:
    """POST ``body`` while /health is probed back to back: the answer and every probe."""
    data = json.dumps(body).encode()

    async def send() -> tuple[int, dict]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            async with session.post(server.url + path, data=data, headers={"Content-Type": "application/json"}) as resp:
                return resp.status, await resp.json()

    prober = HealthProber(server.port)
    try:
        prober.wait_started()
        status, answer = asyncio.run(send())
    finally:
        probes = prober.finish()
    return status, answer, probes


def _assert_health_kept_answering(probes: list[tuple[float, object]], what: str) -> None:
    assert {status for _, status in probes} == {200}
    slow = [round(t, 3) for t, _ in probes if t > HEALTH_BUDGET_S]
    assert not slow, f"/health took {slow} s of {len(probes)} probes while {what} was in flight"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_health_answers_while_an_80k_item_choice_is_refused(server, path):
    choices = [f"option number {i}" for i in range(80_000)]
    prompt = (
        {"prompt": "Pick one:"}
        if path == "/v1/completions"
        else {"messages": [{"role": "user", "content": "Pick one:"}]}
    )
    status, answer, probes = _probed(
        server, path, {**prompt, "max_tokens": 4, "structured_outputs": {"choice": choices}}
    )
    _assert_health_kept_answering(probes, "an 80k-item choice")
    assert status == 400 and answer["error"]["param"] == "structured_outputs", answer
    assert f"{MAX_CHOICES} choices" in answer["error"]["message"]


def test_health_answers_while_200k_bad_words_are_refused(server):
    words = [f"word{i}" for i in range(200_000)]
    status, answer, probes = _probed(
        server, "/v1/completions", {"prompt": "Hello", "max_tokens": 2, "bad_words": words}
    )
    _assert_health_kept_answering(probes, "a request with 200k bad_words")
    assert status == 400 and answer["error"]["param"] == "bad_words", answer


def test_health_answers_while_500k_allowed_token_ids_are_checked(server):
    ids = [i % 1000 for i in range(500_000)]
    status, answer, probes = _probed(
        server,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2, "allowed_token_ids": ids},
    )
    _assert_health_kept_answering(probes, "a request with 500k allowed_token_ids")
    assert status == 200 and answer["choices"][0]["finish_reason"] == "length", answer
