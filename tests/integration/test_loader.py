"""Weights loading and the embedded default model's one-time conversion."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from tests.helpers.runner_utils import make_runner
from tests.helpers import ROOT


def test_dummy_weights_are_deterministic_per_seed(tiny_model_dir):
    a, b, c = (make_runner(tiny_model_dir, load_format="dummy", seed=s) for s in (0, 0, 1))
    ids = torch.arange(8)
    wa, wb, wc = (r.model.layers[0].qkv.method.rows(ids) for r in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_tiny_model_dir_has_config_and_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    cfg = json.load(open(os.path.join(tiny_model_dir, "config.json")))
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["architectures"]) == (2, 64, ["LlamaForCausalLM"])
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tok.eos_token_id == 2 and tok.decode(tok.encode("Hello world")) == "Hello world"


_RACER = """
import os, sys, time
from engine.models.default_model import cached_dir

def build(dst):
    with open(os.path.join(sys.argv[1], "builds"), "a") as f:
        f.write("x")
    time.sleep(1.0)  # a slow conversion, so the other process arrives mid-way
    open(os.path.join(dst, "weights"), "w").write("complete")

print(cached_dir("model", build))
"""


def test_racing_processes_convert_once_and_agree(tmp_path):
    """Two processes ask for the same conversion at once: one converts, both get the same
    complete directory, and no temp directory is left behind."""
    cache = tmp_path / "cache"
    env = dict(os.environ, RINGLLM_CACHE=str(cache))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(tmp_path)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    paths = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert paths == {str(cache / "model")}
    assert (tmp_path / "builds").read_text() == "x"
    assert (cache / "model" / "weights").read_text() == "complete"
    assert sorted(os.listdir(cache)) == [".model.lock", "model"]
