"""Quantized execution: ``quantization="gguf"`` (a .gguf model on the file's own blocks,
engine/models/linear.py, engine/worker/gguf_weights.py) against transformers on the dequantized
model, and ``quantization="int8"`` (W8A8 from a float checkpoint) against transformers on it."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from engine.config import EngineArgs
from engine.kernels import quant
from engine.models import linear
from engine.models.default_model import default_gguf_path, default_model_path
from engine.worker.gguf_weights import hf_name, reverse_permute_index
from tests.helpers.runner_utils import make_request, make_runner, step


def test_q_k_row_order_is_transformers_reverse_permutation():
    """The row index applied to q/k blocks is the permutation transformers applies to the
    dequantized matrix (``_reverse_permute_weights``), for q and for grouped k heads."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    for rows, heads in ((576, 9), (192, 3), (64, 4)):
        ident = torch.arange(rows * 2, dtype=torch.float64).view(rows, 2).numpy()
        want = LlamaTensorProcessor()._reverse_permute_weights(ident, heads, heads)
        assert torch.equal(torch.from_numpy(ident)[reverse_permute_index(rows, heads)], torch.from_numpy(want))
    assert hf_name("blk.7.attn_q.weight") == "model.layers.7.self_attn.q_proj.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight" and hf_name("rope_freqs.weight") is None


def _gguf_blocks(qtype_name: str, rows: int, cols: int) -> "linear.GGUFBlocks":
    import gguf

    qtype = gguf.GGMLQuantizationType[qtype_name]
    w = torch.randn(rows, cols) * 0.1
    data = torch.from_numpy(gguf.quants.quantize(w.numpy(), qtype))
    return linear.GGUFBlocks(data.view(torch.uint8).reshape(rows, -1), int(qtype), rows, cols)


def test_a_type_without_a_kernel_is_dequantized_once_with_a_warning(caplog):
    """Q5_1 has no kernel here: the projection gets a dense method holding the GGUF's own
    dequantized values, and the log names the type once."""
    blocks = _gguf_blocks("Q5_1", 64, 64)
    assert blocks.qtype not in quant.SUPPORTED_TYPES
    place = linear.Placement(torch.device("cpu"), torch.float32, torch.float32, False, "gguf")
    with caplog.at_level(logging.WARNING, logger="engine.models.linear"):
        methods = [place.choose(blocks, "wide") for _ in range(2)]
    assert all(not isinstance(m, linear.GGUFLinear) for m in methods)
    assert [r.getMessage() for r in caplog.records].count(
        "GGUF Q5_1 weights have no quantized kernel here: dequantized once at load"
    ) == 1
    x = torch.randn(3, 64)
    torch.testing.assert_close(methods[0].apply(x), x @ blocks.dequantize().t())


def test_q5_0_is_read_as_q8_0_blocks_of_the_same_values_and_runs_on_their_kernel(tmp_path, caplog):
    """Q5_0 (llama.cpp's fallback where a K-quant does not fit a row) comes out of a GGUF file as
    Q8_0 blocks of exactly its values: the dequantized matrices are equal bit for bit, the
    projection runs the quantized kernel (not a dense copy), and the load log says so once."""
    import gguf

    from engine.worker.gguf_weights import gguf_weights

    path, q5 = str(tmp_path / "q5_0.gguf"), {}
    writer = gguf.GGUFWriter(path, "qwen2")  # not llama: no q/k row permutation to undo
    for layer in (0, 1):
        w = np.random.default_rng(layer).standard_normal((96, 128)).astype(np.float32) * 0.1
        q5[layer] = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q5_0)
        writer.add_tensor(
            f"blk.{layer}.ffn_down.weight",
            q5[layer],
            raw_shape=q5[layer].shape,
            raw_dtype=gguf.GGMLQuantizationType.Q5_0,
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with caplog.at_level(logging.INFO, logger="engine.worker.gguf_weights"):
        read = dict(gguf_weights(path, 4, 4))
    assert [r.getMessage() for r in caplog.records].count(
        "GGUF Q5_0 tensors run as Q8_0 blocks: the same values, in more bytes"
    ) == 1
    blocks = read["model.layers.0.mlp.down_proj.weight"]
    assert blocks.qtype == quant.Q8_0 and blocks.data.shape == (96, 128 // 32 * 34)
    want = gguf.quants.dequantize(q5[0], gguf.GGMLQuantizationType.Q5_0)
    assert np.array_equal(blocks.dequantize().numpy(), want)
    assert max(np.unique(block).size for block in want.reshape(-1, 32)) > 16  # a block uses its 5th bit
    method = linear.Placement(torch.device("cpu"), torch.float32, torch.float32, False, "gguf").choose(blocks, "wide")
    assert isinstance(method, linear.GGUFLinear) and method.format == "Q8_0"
    x = torch.randn(5, 128)
    torch.testing.assert_close(method.apply(x), x @ torch.from_numpy(want).t(), rtol=0.02, atol=0.02)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(quantization="awq"), "quantization='awq' is not supported"),
        (
            dict(quantization="gguf"),
            r"quantization='gguf' runs the quantized blocks of a \.gguf file, but model "
            r"'.*' is a directory of float weights: pass a \.gguf file as model",
        ),
    ],
)
def test_quantization_values_that_cannot_run_are_refused(tiny_model_dir, kwargs, message):
    with pytest.raises(ValueError, match=message) as refused:
        EngineArgs(model=tiny_model_dir, load_format="dummy", **kwargs).create_engine_config()
    assert "must be 'gguf' only" not in str(refused.value)  # the old, self-contradictory message


def test_int8_needs_the_cpu(tiny_model_dir, monkeypatch):
    import engine.config.device_config as device_config

    monkeypatch.setattr(device_config, "resolve_device", lambda device: "cuda")  # as on a GPU host
    with pytest.raises(ValueError, match="quantization='int8' runs only on the CPU .* but device is 'cuda'"):
        EngineArgs(model=tiny_model_dir, load_format="dummy", quantization="int8").create_engine_config()


# ---------------------------------------------------------------- the default model's Q4_1 file

_TEXTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Hi!",
    "Explain photosynthesis in two sentences.",
    "List three prime numbers and say why.",
    "Translate 'good morning' to French, German and Spanish, one per line please.",
]


@pytest.fixture(scope="module")
def gguf_runner():
    return make_runner(default_gguf_path(), max_model_len=512, kv_cache_memory=64 << 20)


@pytest.mark.model
def test_the_q4_1_file_runs_on_its_blocks_within_1_1x_their_bytes(gguf_runner):
    model = gguf_runner.model
    assert model.quantization == "gguf" and gguf_runner.config.model_config.quantization == "gguf"
    formats = {p.method.format for layer in model.layers for p in layer.linears()}
    assert formats == {"Q4_1"} and model.lm_head.method.format == "Q8_0"  # the tied token_embd
    assert model.embed.method is model.lm_head.method  # one copy: the lookup dequantizes its rows
    assert model.resident_bytes() <= 1.1 * model.format_bytes
    assert model.format_bytes < 100 << 20  # the file's blocks, not a dequantized copy (513 MiB in float32)
    assert "MiB resident" in model.weights_report() and "Q4_1" in model.weights_report()


def _tracks_transformers(runner, min_each: float, min_all: float, max_shift: float) -> None:
    """Teacher-forced on transformers' own greedy answers (float32) to _TEXTS: the argmax agrees
    at >= ``min_each`` of each answer's positions and >= ``min_all`` over all, and the mean
    logprob of transformers' tokens moves by at most ``max_shift`` nat per answer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    agree = total = 0
    for i, text in enumerate(_TEXTS):
        chat = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        prompt = tok(chat, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            full = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0].tolist()
            logits = hf(torch.tensor([full])).logits[0].float()
        answer = torch.tensor(full[len(prompt) :])
        want = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(1, answer[:, None])[:, 0]
        rows = step(runner, [make_request(f"q{i}", full, prompt_logprobs=0, max_tokens=1)]).prompt_logprobs[f"q{i}"]
        got = torch.tensor([r[0] for r in rows.logprobs])[len(prompt) - 1 :]
        ranks = list(rows.ranks)[len(prompt) - 1 :]
        hits = sum(1 for r in ranks if r == 1)
        assert hits >= min_each * len(ranks), f"{text!r}: argmax agrees at {hits} of {len(ranks)}"
        assert float((got - want).mean().abs()) <= max_shift, text
        agree, total = agree + hits, total + len(ranks)
    assert agree >= min_all * total


@pytest.mark.model
def test_the_q4_1_file_tracks_transformers_on_the_dequantized_model(gguf_runner):
    """Against transformers on the dequantized model (the converted default directory): the
    argmax agrees at >= 80% of each answer's positions and >= 90% over all, and the mean
    logprob of transformers' tokens moves by at most 0.15 nat per answer.

    Why not token-for-token greedy equality: the kernels quantize each activation row to int8
    per block of 32 (as llama.cpp does), ~1% relative error per matmul when a channel is an
    outlier (engine/kernels/quant.py's tests hold the kernel to an int8-activation reference
    exactly). With the weights' dequantized values in float32 math instead, every prompt here
    matched transformers exactly (checked while building this), so the gap is the activations'
    rounding, and near-ties flip: the France answer starts "The" in float32, where "L" trails
    by 0.08. Measured when written: agreement 0.81-1.00 (0.92 overall), mean delta 0.00-0.06 nat."""
    _tracks_transformers(gguf_runner, 0.8, 0.9, 0.15)


@pytest.mark.model
def test_int8_tracks_transformers_on_the_float_model():
    """``quantization="int8"`` on the float32 default model: per-channel int8 weights and
    per-token int8 activations. Looser bounds than the Q4_1 file's, as measured when written:
    agreement 0.69-1.00 (0.83 overall), mean shift up to 0.31 nat on a Zen4; 0.395 nat on an
    AVX2-only EPYC, whose float kernels sum in another order (its int8 products are exact: the
    kernel's and torch._int_mm's). One scale per token is
    coarse here: this model's activations have outlier channels, which a per-32-block scale
    (the GGUF kernels') confines to their block while a per-row scale spreads them over all
    576 values; finer activation scales belong to the int8 kernel (engine/kernels/int8_linear.py)."""
    runner = make_runner(default_model_path(), max_model_len=512, kv_cache_memory=64 << 20, quantization="int8")
    model = runner.model
    assert {type(p.method).__name__ for layer in model.layers for p in layer.linears()} == {"Int8Method"}
    assert model.resident_bytes() <= 1.1 * model.format_bytes
    _tracks_transformers(runner, 0.65, 0.8, 0.45)


@pytest.mark.model
def test_the_tensor_index_reads_what_the_gguf_package_reads():
    """read_tensor_index (a header and tensor-info parser) against gguf.GGUFReader on the
    default model's file: the same tensors, types, shapes and bytes, and its scalar metadata."""
    import gguf
    import numpy as np

    from engine.gguf_file import read_tensor_index

    path = default_gguf_path()
    meta, ours = read_tensor_index(path)
    theirs = gguf.GGUFReader(path).tensors
    assert [t.name for t in ours] == [t.name for t in theirs]
    for a, b in zip(ours, theirs):
        assert a.qtype == int(b.tensor_type) and a.shape == [int(n) for n in b.shape]
        assert np.array_equal(a.data, b.data.reshape(-1).view(np.uint8))
    assert meta["general.architecture"] == "llama" and meta["llama.block_count"] == 30


@pytest.mark.model
def test_the_config_from_gguf_metadata_builds_the_model_transformers_config_builds():
    """engine/gguf_file.py maps the metadata to config.json's fields (no transformers, no torch
    in the frontend): the decoder built from it is the one AutoConfig's GGUF reading builds."""
    import os

    from transformers import AutoConfig

    from engine.models.layers import Dims
    from engine.models.llama import LlamaForCausalLM

    path = default_gguf_path()
    ours = EngineArgs(model=path).create_engine_config().model_config.hf_config
    theirs = AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    assert Dims.from_config(ours) == Dims.from_config(theirs)
    models = [LlamaForCausalLM(c, torch.float32, "cpu", max_model_len=64, backend="torch") for c in (ours, theirs)]
    assert torch.equal(models[0].ropes[0].cis, models[1].ropes[0].cis)
    assert (ours.bos_token_id, ours.eos_token_id) == (theirs.bos_token_id, theirs.eos_token_id)
