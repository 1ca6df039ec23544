"""The transport benchmark runs end to end (a smoke run: tiny counts, one round; no timings
are checked here, they belong to benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tests.helpers import ROOT


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ringllm_bench_transport_writes_table_json_and_png(tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine.entrypoints.cli",
            "bench",
            "transport",
            "--quick",
            "--rounds",
            "1",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "| ring-spin10 |" in res.stdout and "| zmq-asyncio |" in res.stdout and "Targets:" in res.stdout
    files = sorted(os.listdir(tmp_path))
    assert any(f.endswith(".png") for f in files)
    data = json.load(open(tmp_path / next(f for f in files if f.endswith(".json"))))
    methods = set(data["summary"]["rt-small"])
    assert {
        "ring-spin0",
        "ring-spin10",
        "ring-spin-inf",
        "ring-asyncio",
        "ring-uvloop",
        "zmq",
        "zmq-asyncio",
        "mp-pipe",
    } <= methods
    assert {"p50_us", "p99_us", "cpu_ms_per_1k"} <= set(data["summary"]["rt-small"]["zmq"])
    assert len(data["targets"]) >= 5
