"""Messages larger than the ring, through the engine, on an idle engine (issue 22): a request
larger than the request ring and an output larger than the output ring both complete without
any other message pushing them out (shm_transport/pusher.py). Both transports for the output.
"""

from __future__ import annotations

import threading

import openai
import pytest

from engine import LLM, SamplingParams
from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer
from tests.helpers.engine_utils import TINY

DEADLINE_S = 120.0  # generous: a loaded machine is slow, a hang is forever


@pytest.mark.parametrize("transport", ["shm", "zmq"])
def test_prompt_logprobs_larger_than_the_output_ring_complete_on_an_idle_engine(tiny_model_dir, transport):
    """TINY's rings are 4 KiB; 200 prompt positions with 20 logprobs each encode to tens of KB,
    one EngineCoreOutputs that only fits as fragments, and nothing else is sent after it."""
    llm = LLM(model=tiny_model_dir, transport=transport, **TINY)
    try:
        prompt = [1 + (i * 37) % 1000 for i in range(200)]
        params = SamplingParams(max_tokens=1, prompt_logprobs=20, temperature=0.0)
        done: list = []
        worker = threading.Thread(
            target=lambda: done.extend(llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)),
            daemon=True,
        )
        worker.start()
        worker.join(DEADLINE_S)
        assert done, "generate never returned: the output message was never finished"
        logprobs = done[0].prompt_logprobs
        assert len(logprobs) == len(prompt) and logprobs[0] is None
        assert all(len(position) >= 20 for position in logprobs[1:])
    finally:
        llm.shutdown()


@pytest.mark.slow
def test_a_request_larger_than_the_request_ring_is_answered_on_an_idle_server(tiny_model_dir):
    """The issue's case: 480,000 seven-digit stop_token_ids, a 3.8 MB body, and nothing after it.
    A 400 from validation is as good an answer as a 200: the point is that it answers."""
    with RemoteServer(tiny_model_dir, *TINY_SERVE_ARGS, "--ring-capacity", str(1 << 20)) as remote:
        client = openai.OpenAI(base_url=remote.base_url, api_key="none", timeout=DEADLINE_S, max_retries=0)
        stop_token_ids = [1_000_000 + i for i in range(480_000)]
        try:
            completion = client.completions.create(
                model=tiny_model_dir, prompt="Hello", max_tokens=2, extra_body={"stop_token_ids": stop_token_ids}
            )
        except openai.BadRequestError as e:
            assert e.status_code == 400
        else:
            assert completion.choices[0].finish_reason in ("length", "stop")
