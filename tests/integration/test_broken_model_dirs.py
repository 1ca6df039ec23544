"""A broken model directory ends ``ringllm serve`` and ``LLM()`` with one line naming the file
and what is wrong with it: no traceback, whichever process (the frontend reading the config and
the tokenizer, or the EngineCore loading the weights) finds the fault.

Each case starts from a tiny Llama with real (random) safetensors weights and the default
model's tokenizer, and breaks one thing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from engine import LLM
from tests.helpers.openai_server_utils import RINGLLM, free_port
from tests.helpers.engine_utils import TINY


@pytest.fixture(scope="module")
def weighted_model_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny model with random float32 weights saved as safetensors (transformers' names)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dst = str(tmp_path_factory.mktemp("weighted") / "model")
    shutil.copytree(tiny_model_dir, dst)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig.from_pretrained(dst)).save_pretrained(dst)
    return dst


def _edit_json(name: str, change):
    def edit(path: str) -> None:
        with open(os.path.join(path, name)) as f:
            data = json.load(f)
        change(data)
        with open(os.path.join(path, name), "w") as f:
            json.dump(data, f)

    return edit


def _write(name: str, content: bytes):
    def edit(path: str) -> None:
        with open(os.path.join(path, name), "wb") as f:
            f.write(content)

    return edit


def _remove(*names: str):
    def edit(path: str) -> None:
        for name in names:
            os.remove(os.path.join(path, name))

    return edit


def _truncate(name: str):
    def edit(path: str) -> None:
        file = os.path.join(path, name)
        os.truncate(file, os.path.getsize(file) // 2)

    return edit


def _weights_of(other: dict):
    """The weights of another config (a mismatch with config.json's sizes)."""

    def edit(path: str) -> None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig.from_pretrained(path)
        for key, value in other.items():
            setattr(config, key, value)
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        from safetensors.torch import save_file

        save_file(
            {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
            os.path.join(path, "model.safetensors"),
        )

    return edit


def _drop_tensor(name: str):
    def edit(path: str) -> None:
        from safetensors.torch import load_file, save_file

        file = os.path.join(path, "model.safetensors")
        tensors = load_file(file)
        del tensors[name]
        save_file(tensors, file)

    return edit


# (id, how to break the directory, the file the message names, words the message has)
CASES = [
    ("config-not-json", _write("config.json", b"{not json"), "config.json", "not valid JSON"),
    ("config-not-object", _write("config.json", b"[1, 2]"), "config.json", "not a JSON object"),
    ("config-missing", _remove("config.json"), "config.json", "no config.json"),
    (
        "config-no-model-type",
        _edit_json("config.json", lambda c: (c.pop("model_type"), c.pop("architectures"))),
        "config.json",
        "model_type",
    ),
    ("negative-vocab", _edit_json("config.json", lambda c: c.update(vocab_size=-5)), "config.json", "vocab_size"),
    (
        "hidden-size-a-string",
        _edit_json("config.json", lambda c: c.update(hidden_size="big")),
        "config.json",
        "hidden_size",
    ),
    (
        "no-layers",
        _edit_json("config.json", lambda c: c.update(num_hidden_layers=0)),
        "config.json",
        "num_hidden_layers must be a positive integer, got 0",
    ),
    (
        "unknown-architecture",
        _edit_json("config.json", lambda c: c.update(architectures=["FooForCausalLM"])),
        "config.json",
        "FooForCausalLM",
    ),
    ("weights-truncated", _truncate("model.safetensors"), "model.safetensors", "safetensors"),
    ("weights-garbage", _write("model.safetensors", b"\x00" * 64), "model.safetensors", "safetensors"),
    ("weights-hidden-size-mismatch", _weights_of({"hidden_size": 32, "head_dim": 8}), "model.safetensors", "shape"),
    ("weights-missing-tensor", _drop_tensor("model.norm.weight"), "model.safetensors", "missing ['norm']"),
    ("tokenizer-json-garbage", _write("tokenizer.json", b"\x89garbage"), "tokenizer.json", "tokenizer"),
    ("tokenizer-config-not-json", _write("tokenizer_config.json", b"{{"), "tokenizer_config.json", "JSON"),
    ("tokenizer-missing", _remove("tokenizer.json", "tokenizer_config.json"), "tokenizer", "tokenizer"),
]


def _broken(weighted_model_dir: str, tmp_path, edit) -> str:
    path = str(tmp_path / "broken")
    shutil.copytree(weighted_model_dir, path)
    edit(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("edit,file,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_serve_names_the_file_and_the_problem_in_one_line(weighted_model_dir, tmp_path, edit, file, words):
    path = _broken(weighted_model_dir, tmp_path, edit)
    proc = subprocess.run(
        [
            *RINGLLM,
            "serve",
            path,
            "--dtype",
            "float32",
            "--num-threads",
            "1",
            "--kv-cache-memory",
            str(64 << 20),
            "--port",
            str(free_port()),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ringllm serve: error:")]
    assert len(errors) == 1, proc.stderr
    assert file in errors[0] and words in errors[0], errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["config-not-json", "negative-vocab", "weights-truncated", "tokenizer-json-garbage"])
def test_llm_raises_one_line_naming_the_file(weighted_model_dir, tmp_path, case):
    _, edit, file, words = next(c for c in CASES if c[0] == case)
    path = _broken(weighted_model_dir, tmp_path, edit)
    args = {k: v for k, v in TINY.items() if k != "load_format"}
    with pytest.raises(Exception) as err:
        LLM(model=path, **args)
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message, message
    assert file in message and words in message, message
