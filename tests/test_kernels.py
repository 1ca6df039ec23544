"""The bf16 GEMV kernel (csrc/gemv_bf16.c) against float32 math on the same bf16 values."""
from __future__ import annotations

import pytest
import torch

from engine.kernels import bf16_gemv
from engine.kernels.bf16_gemv import PackedBF16

pytestmark = pytest.mark.skipif(not bf16_gemv.available(), reason="needs an x86-64 CPU with AVX2 and FMA")


@pytest.mark.parametrize("out_features,in_features", [(4, 8), (12, 40), (1728, 576), (576, 1536), (4096, 64)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_matches_float32_on_bf16_weights(out_features, in_features, rows):
    gen = torch.Generator().manual_seed(out_features * 31 + in_features + rows)
    w = torch.randn(out_features, in_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    want = x.double() @ w.to(torch.bfloat16).double().t()
    got = PackedBF16(w).matmul(x)
    assert got.shape == (rows, out_features) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * in_features ** 0.5)


def test_every_output_row_and_column_is_placed_right():
    """One-hot weights: a packing or indexing slip moves a value, it cannot hide in rounding."""
    out_features, in_features = 8, 16
    w = torch.zeros(out_features, in_features)
    for j in range(out_features):
        w[j, (3 * j + 1) % in_features] = j + 1
    x = torch.arange(4 * in_features, dtype=torch.float32).view(4, in_features)
    got = PackedBF16(w).matmul(x)
    want = torch.stack([x[:, (3 * j + 1) % in_features] * (j + 1) for j in range(out_features)], 1)
    assert torch.equal(got, want)


def test_input_dtypes_and_non_contiguous_activations():
    w = torch.randn(16, 24)
    packed = PackedBF16(w.to(torch.bfloat16))
    x = torch.randn(24, 3).t()  # non-contiguous [3, 24]
    torch.testing.assert_close(packed.matmul(x), x @ w.to(torch.bfloat16).float().t(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed.matmul(x.to(torch.bfloat16)),
                               x.to(torch.bfloat16).float() @ w.to(torch.bfloat16).float().t(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(6, 16), (8, 12), (8,), (2, 8, 8)])
def test_unpackable_shapes_are_refused(shape):
    with pytest.raises(ValueError, match="cannot pack"):
        PackedBF16(torch.zeros(shape))


@pytest.mark.parametrize("x_shape", [(0, 16), (bf16_gemv.MAX_ROWS + 1, 16), (2, 8), (16,)])
def test_wrong_activation_shapes_are_refused(x_shape):
    packed = PackedBF16(torch.zeros(8, 16))
    with pytest.raises(ValueError, match="activations"):
        packed.matmul(torch.zeros(x_shape))
