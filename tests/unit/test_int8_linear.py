"""Dynamic W8A8 (engine/kernels/int8_linear.py, csrc/cpu/int8_gemv.c) on every CPU variant and on the
batched torch._int_mm path, against float64 math.

(1) Against float64 on the int8 values themselves (x and W quantized per row as the kernels do,
in float32): int32 sums are exact, so only the final float32 scaling differs (rtol 1e-5).
(2) Against the unquantized float64 product, within the bound that rounding x and W to half a
step each puts on every output."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.kernels import quant
from engine.kernels.int8_linear import MAX_ROWS, Int8Linear

pytestmark = pytest.mark.skipif(quant.block_bytes(quant.Q8_0) == 0, reason="kernels not built")
ISAS = [i for i in (quant.ISA_C, quant.ISA_AVX2, quant.ISA_AVX512_VNNI) if i <= quant.best_isa()]


def _quantize_rows(v: np.ndarray):
    v = v.astype(np.float32)
    s = (np.abs(v).max(1) / np.float32(127)).astype(np.float32)
    inv = np.where(s != 0, np.float32(1) / np.where(s != 0, s, 1), 0).astype(np.float32)
    return np.rint((v * inv[:, None]).astype(np.float32)), s.astype(np.float64)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,k", [(1, 32), (7, 96), (33, 160), (5, 100), (3, 576)])
@pytest.mark.parametrize("rows", [1, 3, 8, 17])
def test_matches_float64_reference(isa, n, k, rows):
    rng = np.random.default_rng(n * 1000 + k + rows)
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    lin = Int8Linear.from_float(torch.from_numpy(w))
    qw, sw = _quantize_rows(w)
    assert np.array_equal(lin.qweight.numpy(), qw) and np.array_equal(lin.scale.numpy(), sw.astype(np.float32))
    got = lin.matmul(torch.from_numpy(x), max_isa=isa).double().numpy()
    assert got.shape == (rows, n) and np.isfinite(got).all()
    qx, sx = _quantize_rows(x)
    want = (qx.astype(np.float64) @ qw.T.astype(np.float64)) * sx[:, None] * sw[None, :]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    w_hat = qw * sw[:, None]
    bound = np.abs(x.astype(np.float64)) @ np.full((k, n), 1.0) * (sw[None, :] / 2) + (sx[:, None] / 2) * np.abs(
        w_hat
    ).sum(1)
    assert (np.abs(got - x.astype(np.float64) @ w.T.astype(np.float64)) <= 1.001 * bound + 1e-6).all()


def test_every_path_agrees_on_strided_bf16_rows_and_zero_rows():
    """A row-strided bf16 view, an all-zero weight channel and an all-zero row of x: every
    variant gives the same finite numbers as the batched path (zero where a row is zero)."""
    w = torch.randn(11, 192)
    w[4] = 0
    lin = Int8Linear.from_float(w.to(torch.bfloat16))
    wide = torch.randn(MAX_ROWS, 256).to(torch.bfloat16)
    wide[2] = 0
    x = wide[:, 30:222]
    batched = lin.matmul(torch.cat([x, x]))[:MAX_ROWS]
    for isa in ISAS:
        got = lin.matmul(x, max_isa=isa)
        assert torch.isfinite(got).all() and (got[:, 4] == 0).all() and (got[2] == 0).all()
        torch.testing.assert_close(got, batched, rtol=1e-5, atol=1e-5)


def test_dequantize_and_nbytes():
    w = torch.randn(6, 64)
    lin = Int8Linear.from_float(w)
    assert lin.nbytes == 6 * 64 + 6 * 4 + 6 * 4
    deq = lin.dequantize()
    assert (deq - w).abs().max() <= lin.scale.max() / 2 * 1.001


def test_refuses_bad_weights_and_activations():
    with pytest.raises(ValueError, match="float"):
        Int8Linear.from_float(torch.zeros(2, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="per-channel scales"):
        Int8Linear(torch.zeros(2, 8, dtype=torch.int8), torch.ones(3))
    with pytest.raises(ValueError, match="int8 weight"):
        Int8Linear(torch.zeros(2, 8), torch.ones(2))
    lin = Int8Linear.from_float(torch.randn(2, 8))
    with pytest.raises(ValueError, match="activations"):
        lin.matmul(torch.zeros(1, 9))


def test_matmul_writes_into_out_and_refuses_a_wrong_one():
    lin = Int8Linear.from_float(torch.randn(5, 64))
    x = torch.randn(3, 64)
    out = torch.empty(3, 5)
    assert lin.matmul(x, out=out) is out
    torch.testing.assert_close(out, lin.matmul(x))
    big = torch.randn(MAX_ROWS + 1, 64)
    out_big = torch.empty(MAX_ROWS + 1, 5)
    assert lin.matmul(big, out=out_big) is out_big
    with pytest.raises(ValueError, match="out must be a contiguous float32 \\[3, 5\\]"):
        lin.matmul(x, out=torch.empty(3, 5, dtype=torch.bfloat16))
