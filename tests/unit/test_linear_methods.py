"""Each LinearMethod (engine/models/linear.py) against plain float math on the same weight values."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import bf16_gemv, quant
from engine.models import linear


@pytest.mark.skipif(not bf16_gemv.available(), reason="the bf16 GEMV kernel needs AVX2 and FMA")
@pytest.mark.parametrize("out_features", [96, 8192])  # in cache (row groups), and past it (unpacked slices)
def test_bf16_gemv_method_is_float32_math_on_the_bf16_values(out_features):
    w = (torch.randn(out_features, 576) * 0.05).bfloat16().float()
    m = linear.BF16GemvLinear(w)
    assert m.nbytes == w.numel() * 2  # the one copy, in bf16
    for rows in (1, bf16_gemv.MAX_ROWS, bf16_gemv.MAX_ROWS + 1, 64):
        x = torch.randn(rows, 576)
        torch.testing.assert_close(m.apply(x), F.linear(x, w), rtol=1e-4, atol=1e-4)
    bias = torch.randn(out_features)
    torch.testing.assert_close(
        m.apply(torch.ones(2, 576), bias), F.linear(torch.ones(2, 576), w, bias), rtol=1e-4, atol=1e-4
    )
    ids = torch.tensor([0, 5, out_features - 1, 3])
    assert torch.equal(m.rows(ids), w[ids])


@pytest.mark.skipif(not bf16_gemv.available(), reason="the bf16 GEMV kernel needs AVX2 and FMA")
def test_the_dense_gemv_head_gives_float32_logits_at_decode_sizes_and_keeps_its_rows():
    w = (torch.randn(4096, 576) * 0.05).bfloat16()
    m = linear.DenseGemvHead(w, torch.device("cpu"))
    assert m.nbytes == w.numel() * 2  # one copy
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the kernel runs while torch runs one thread
    try:
        for rows in (1, bf16_gemv.MAX_ROWS):  # the kernel: float32, unrounded
            x = torch.randn(rows, 576).bfloat16()
            got = m.apply(x)
            assert got.dtype == torch.float32
            torch.testing.assert_close(got, x.float() @ w.float().t(), rtol=1e-5, atol=1e-4)
    finally:
        torch.set_num_threads(threads)
    x = torch.randn(bf16_gemv.MAX_ROWS + 1, 576).bfloat16()  # beyond: torch's bf16 GEMM
    assert torch.equal(m.apply(x), F.linear(x, w))
    ids = torch.tensor([0, 7, 4095])
    assert torch.equal(m.rows(ids), w[ids])


def test_input_major_method_rows_are_fresh_contiguous_rows():
    """A tied embedding reads the head's rows; the residual stream is then updated in place."""
    w = torch.randn(40, 16)
    m = linear.InputMajorLinear(w, torch.float32)
    rows = m.rows(torch.tensor([3, 3, 39]))
    assert rows.is_contiguous() and torch.equal(rows, w[[3, 3, 39]])
    rows.add_(1)
    assert torch.equal(m.rows(torch.tensor([3])), w[[3]])
    x = torch.randn(5, 16)
    torch.testing.assert_close(m.apply(x), x @ w.t())


@pytest.mark.skipif(quant.lib is None, reason="the quantized kernels are not built")
def test_gguf_method_batches_in_groups_and_reads_rows_dequantized():
    import gguf

    w = torch.randn(64, 256) * 0.05
    data = torch.from_numpy(gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q8_0))
    blocks = linear.GGUFBlocks(data.view(torch.uint8).reshape(64, -1), quant.Q8_0, 64, 256)
    m = linear.GGUFLinear(blocks)
    dense = blocks.dequantize()
    x = torch.randn(2 * quant.MAX_ROWS + 3, 256)
    want = x @ dense.t()
    got = m.apply(x)
    assert (got - want).norm() / want.norm() < 0.02  # int8 activations per block of 32
    torch.testing.assert_close(got[: quant.MAX_ROWS], m.apply(x[: quant.MAX_ROWS]))  # groups: row-independent
    ids = torch.tensor([7, 0, 63])
    torch.testing.assert_close(m.rows(ids), dense[ids])
    assert m.nbytes == data.numel()


def test_placement_picks_one_method_per_role_for_float32_on_cpu():
    place = linear.Placement(torch.device("cpu"), torch.float32, torch.float32, False, None)
    w = torch.randn(64, 32)
    assert type(place.choose(w, "tall")) is linear.InputMajorLinear
    assert type(place.choose(w, "wide")) is linear.TorchLinear
    assert type(place.choose(w, "head")) is linear.InputMajorLinear  # faster at 1-2 rows and at 64
    dense = linear.Placement(torch.device("cpu"), torch.float32, torch.float32, True, None)
    assert {type(dense.choose(w, r)) for r in ("tall", "wide", "head")} == {linear.TorchLinear}
