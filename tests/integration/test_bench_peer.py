"""``ringllm bench serving --peer-url``: a running OpenAI-compatible server measured beside ringllm's.

The peer here is a real ``ringllm serve`` of the tiny dummy-weight model under another served name,
so the plumbing (the model name read from the peer's /v1/models, its rounds interleaved with the
ring server's, its row and ratio in the table and JSON) is exercised without vLLM. A smoke run: no
timings are checked (they belong to benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.serving import Server
from tests.helpers import ROOT


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_serving_measures_a_peer_server_beside_ringllm(tiny_model_dir, tmp_path):
    peer = Server(
        [tiny_model_dir, "--load-format", "dummy", "--dtype", "float32", "--served-model-name", "peer-tiny"],
        str(tmp_path / "peer.log"),
    )
    try:  # not waiting for the peer: the bench waits for its /v1/models, so both start at once
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "engine.entrypoints.cli",
                "bench",
                "serving",
                "--tiny",
                "--transports",
                "shm",
                "--no-in-process",
                "--levels",
                "2",
                "--rounds",
                "1",
                "--requests-per-client",
                "1",
                "--output-tokens",
                "4",
                "--peer-url",
                peer.url + "/",
                "--peer-name",
                "tinypeer",
                "--out",
                str(tmp_path),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=280,
        )
    finally:
        peer.stop()
    assert res.returncode == 0, res.stderr[-3000:]
    assert "| tinypeer |" in res.stdout and "| shm |" in res.stdout and "tok/s vs tinypeer" in res.stdout
    data = json.load(open(next(tmp_path.glob("serving-tiny-*.json"))))
    assert f"tinypeer: {peer.url}, model 'peer-tiny'" in data["notes"]
    for method in ("shm", "tinypeer"):
        assert data["summary"]["c=2"][method]["output_tokens_per_s"]["median"] > 0


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.timeout(900)  # vLLM compiles (its default mode): minutes of start-up on 2 cores
@pytest.mark.skipif(
    not os.environ.get("RINGLLM_VLLM_PYTHON"),
    reason="set RINGLLM_VLLM_PYTHON to the python of a venv with vLLM (benchmarks/offline.py)",
)
def test_bench_offline_runs_vllm_as_a_peer(tmp_path):
    """The peer runner (benchmarks/peer_vllm.py) in vLLM's own venv, beside ringllm, one round."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine.entrypoints.cli",
            "bench",
            "offline",
            "--peer",
            "vllm",
            "--peer-python",
            os.environ["RINGLLM_VLLM_PYTHON"],
            "--engines",
            "ringllm",
            "--scenarios",
            "single,prefill",
            "--dtype",
            "float32",
            "--num-prompts",
            "2",
            "--output-tokens",
            "4",
            "--prefill-tokens",
            "40",
            "--rounds",
            "1",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "| vllm float32 compiled |" in res.stdout and "single vs vllm" in res.stdout
    data = json.load(open(next(tmp_path.glob("offline-*.json"))))
    peer = data["summary"]["single"]["vllm float32 compiled"]
    assert peer["tok_s"]["median"] > 0 and peer["ready_s"]["median"] >= peer["startup_s"]["median"] > 0
    assert peer["peak_rss_mib"]["median"] > 100
    prefill = data["summary"]["prefill"]
    assert prefill["vllm float32 compiled"]["tokens"]["median"] == prefill["ringllm 1t"]["tokens"]["median"] > 2 * 30


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.timeout(600)
@pytest.mark.skipif(
    not os.environ.get("RINGLLM_LLAMACPP_PYTHON"),
    reason="set RINGLLM_LLAMACPP_PYTHON to the python of a venv with llama-cpp-python (benchmarks/offline.py)",
)
def test_bench_offline_runs_llamacpp_as_a_peer_on_the_gguf(tmp_path):
    """The llama.cpp runner (benchmarks/peer_llamacpp.py) on the embedded model's own GGUF, beside
    ringllm, one round: its rows, its ratio columns, and the same prompt-token count."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine.entrypoints.cli",
            "bench",
            "offline",
            "--llamacpp-python",
            os.environ["RINGLLM_LLAMACPP_PYTHON"],
            "--engines",
            "ringllm",
            "--scenarios",
            "single,prefill",
            "--num-prompts",
            "2",
            "--output-tokens",
            "4",
            "--prefill-tokens",
            "40",
            "--rounds",
            "1",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "| llama.cpp 1t (GGUF) |" in res.stdout and "single vs llama.cpp" in res.stdout
    data = json.load(open(next(tmp_path.glob("offline-*.json"))))
    peer = data["summary"]["single"]["llama.cpp 1t (GGUF)"]
    assert peer["tok_s"]["median"] > 0 and peer["peak_rss_mib"]["median"] > 50
    prefill = data["summary"]["prefill"]
    assert prefill["llama.cpp 1t (GGUF)"]["tokens"]["median"] == prefill["ringllm 1t"]["tokens"]["median"]


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.timeout(300)
def test_bench_offline_prefill_counts_prompt_tokens(tmp_path):
    """The prefill scenario: ringllm and transformers each prefill the same long prompts; the rate
    counts the prompt tokens each engine reports (no padding), so both counts agree."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine.entrypoints.cli",
            "bench",
            "offline",
            "--scenarios",
            "prefill",
            "--num-prompts",
            "2",
            "--prefill-tokens",
            "40",
            "--rounds",
            "1",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "prefill prompt tok/s" in res.stdout and "prefill vs transformers" in res.stdout
    data = json.load(open(next(tmp_path.glob("offline-*.json"))))
    rows = {row["method"]: row for row in data["rows"]}
    assert set(rows) == {"ringllm 1t", "transformers 1t"}
    assert all(row["tok_s"] > 0 for row in rows.values())
    assert rows["ringllm 1t"]["tokens"] == rows["transformers 1t"]["tokens"] > 2 * 30
