"""Over HTTP, a request whose engine step fails gets a 500 of its own; the server and its
other requests go on. The fault is injected in the real EngineCore of a real ``ringllm
serve`` through ``--worker-cls`` (tests/helpers/faulty_runner.py)."""

from __future__ import annotations

import json
import os

from tests.helpers import ROOT
from tests.helpers.faulty_runner import FAULT_TEXT, POISON
from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer


def test_a_failed_step_is_a_500_for_its_request_alone(tiny_model_dir):
    # The server imports the runner by name, and its core gets the server's sys.path.
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    with RemoteServer(
        tiny_model_dir,
        *TINY_SERVE_ARGS,
        "--served-model-name",
        "tiny",
        "--max-num-seqs",
        "1",
        "--worker-cls",
        "tests.helpers.faulty_runner.FaultyWorker",
        env={"PYTHONPATH": path},
    ) as remote:
        status, body, _ = remote.post_json(
            "/v1/completions", {"model": "tiny", "prompt": [1, 2, POISON], "max_tokens": 4}
        )
        assert status == 500 and body["error"]["code"] == "engine_step_failed", body
        assert FAULT_TEXT not in json.dumps(body) and "Traceback" not in json.dumps(body)
        status, body, _ = remote.post_json(
            "/v1/completions", {"model": "tiny", "prompt": "Hello", "max_tokens": 4, "ignore_eos": True}
        )
        assert status == 200 and body["choices"][0]["finish_reason"] == "length", body
        assert remote.get("/health")[0] == 200
        assert remote.unfinished_in_core() == 0
