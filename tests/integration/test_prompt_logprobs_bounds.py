"""Prompt logprobs of a long prompt are bounded in time and bytes: computed a paced chunk per
step with the prompt, so the core keeps stepping for everyone else (its liveness probe is
answered, other streams keep their pace), and refused with a 400 naming the server's limit
(``--max-prompt-logprobs-entries``) beyond prompt tokens x (k + 1) entries. A real
``ringllm serve`` on the tiny model, whose full-vocabulary rows cost ~50x its prompt tokens.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
import urllib.request

import pytest

from engine.models.default_model import write_tiny_model
from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer, post_while_probing_health

PROMPT_TOKENS = 7000
TOP_K = 8  # 7000 x (8 + 1) = 63000 entries: within the default max_prompt_logprobs_entries (65536)
BUSY_TIMEOUT_S = 2.0  # /health's bound with work in flight: a core step of 2 s shows as a 503
ANSWER_TIMEOUT_S = 300.0  # generous: a loaded machine is slow
PROBE_INTERVAL_S = 0.1  # a router's probe, often: back to back, the probes would take a core of two


@pytest.fixture(scope="module")
def long_model_dir(tmp_path_factory) -> str:
    return write_tiny_model(str(tmp_path_factory.mktemp("tiny-8k")), max_position_embeddings=8192)


def _stream_gaps(remote: RemoteServer, stop: threading.Event, arrivals: list, started: threading.Event) -> None:
    """A stream that runs until ``stop``: when each of its events arrived."""
    body = json.dumps(
        {"model": "tiny", "prompt": "Hello", "max_tokens": 8000, "ignore_eos": True, "stream": True}
    ).encode()
    request = urllib.request.Request(
        remote.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        for line in response:
            if line.startswith(b"data: "):
                arrivals.append(time.monotonic())
                started.set()
            if stop.is_set():
                break


@pytest.mark.slow  # ~30 s: a prompt long enough to show the stall
def test_long_prompt_logprobs_leave_health_and_other_streams_alone(long_model_dir):
    rng = random.Random(0)
    prompt = [rng.randrange(100, 40000) for _ in range(PROMPT_TOKENS)]
    # A step budget that fits the whole prompt, and a pacer that has learned what plain prompt
    # tokens cost (next to nothing on the tiny model): priced as those, the rows would all go in
    # one step of seconds.
    with RemoteServer(
        long_model_dir,
        *TINY_SERVE_ARGS,
        "--served-model-name",
        "tiny",
        "--health-busy-timeout",
        str(BUSY_TIMEOUT_S),
        "--max-num-batched-tokens",
        "8192",
    ) as remote:
        status, _, _ = remote.post_json(
            "/v1/completions", {"model": "tiny", "prompt": prompt[:2000][::-1], "max_tokens": 1}
        )
        assert status == 200
        stop, started, arrivals = threading.Event(), threading.Event(), []
        other = threading.Thread(target=_stream_gaps, args=(remote, stop, arrivals, started))
        other.start()
        try:
            assert started.wait(60), "the other stream never started"
            sent = time.monotonic()
            (status, body, _), probes = post_while_probing_health(
                remote,
                "/v1/completions",
                {"model": "tiny", "prompt": prompt, "max_tokens": 1, "prompt_logprobs": TOP_K},
                timeout=ANSWER_TIMEOUT_S,
                interval=PROBE_INTERVAL_S,
            )
            done = time.monotonic()
        finally:
            stop.set()
            other.join(60)
        assert status == 200, body
        rows = body["choices"][0]["prompt_logprobs"]
        assert len(rows) == PROMPT_TOKENS and rows[0] is None and all(len(r) >= TOP_K for r in rows[1:])
        assert probes and all(code == 200 for code, _ in probes), sorted({code for code, _ in probes})
        gaps = sorted(b - a for a, b in zip(arrivals, arrivals[1:]) if b > sent and a < done)
        assert len(gaps) > 10, "the other stream made (almost) no progress meanwhile"
        p99 = gaps[math.ceil(len(gaps) * 0.99) - 1]  # nearest rank
        assert p99 < 1.0, f"the other stream's ITL p99 {p99:.2f} s over {len(gaps)} gaps (largest: {gaps[-5:]})"


def test_prompt_logprobs_beyond_the_limit_are_a_400_naming_it(tiny_model_dir):
    prompt = list(range(100, 150))  # 50 x (20 + 1) = 1050 entries
    with RemoteServer(
        tiny_model_dir, *TINY_SERVE_ARGS, "--served-model-name", "tiny", "--max-prompt-logprobs-entries", "1000"
    ) as remote:
        for path, body in [
            ("/v1/completions", {"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 20}),
            ("/v1/completions", {"prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": 20}),
            (
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hi " * 60}], "max_tokens": 1, "prompt_logprobs": 20},
            ),
        ]:
            status, answer, _ = remote.post_json(path, {"model": "tiny", **body})
            assert status == 400, (path, body, answer)
            error = answer["error"]
            assert error["param"] == "prompt_logprobs" and "max_prompt_logprobs_entries=1000" in error["message"]
        status, answer, _ = remote.post_json(
            "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 1, "prompt_logprobs": 19}
        )  # 1000: at the limit
        assert status == 200 and len(answer["choices"][0]["prompt_logprobs"]) == len(prompt)
