"""The K-quant kernels (csrc/cpu/quant_kquants.c: Q4_K, Q5_K, Q6_K) on every CPU variant, against
float64 math on gguf.quants.dequantize's weights.

The gguf package cannot quantize to K-quants, so the weights are random valid super-blocks
(engine.kernels.quant_blocks). The kernel's result is compared (1) with a float64 reference
that quantizes x as the kernel does (per row and 256 values: d = max|x| / 127, q = rint(x / d),
in float32), equal up to float32 summation, and (2) with the unquantized x, within the bound that int8 rounding of
x puts on each output."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from engine.kernels import quant  # noqa: E402
from engine.kernels.quant import QuantizedLinear  # noqa: E402
from engine.kernels.quant_blocks import random_blocks  # noqa: E402

pytestmark = pytest.mark.skipif(quant.block_bytes(quant.Q4_K) == 0, reason="kernels not built")
TYPES = {
    quant.Q4_K: gguf.GGMLQuantizationType.Q4_K,
    quant.Q5_K: gguf.GGMLQuantizationType.Q5_K,
    quant.Q6_K: gguf.GGMLQuantizationType.Q6_K,
}
ISAS = [i for i in (quant.ISA_C, quant.ISA_AVX2, quant.ISA_AVX512_VNNI) if i <= quant.best_isa()]


def _quantize_x(x: np.ndarray) -> np.ndarray:
    xb = x.astype(np.float32).reshape(x.shape[0], -1, 256)
    d = (np.abs(xb).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.rint((xb * inv).astype(np.float32))
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)


def _linear(qtype, n, k, seed):
    blocks = random_blocks(qtype, n, k, np.random.default_rng(seed))
    assert blocks.shape == (n, k // 256 * gguf.GGML_QUANT_SIZES[TYPES[qtype]][1])
    return QuantizedLinear(torch.from_numpy(blocks), qtype, n, k), gguf.quants.dequantize(blocks, TYPES[qtype])


@pytest.mark.parametrize("qtype", list(TYPES))
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,k", [(1, 256), (7, 512), (33, 1536)])
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 9, 14, 19, 66])
def test_matches_float64_reference(qtype, isa, n, k, rows):
    """From QUANT_KGEMM_MIN_M (9) rows AVX-512 VNNI runs the tiled GEMM (csrc/cpu/quant_kgemm.c:
    micro-kernel tails of 1-3 rows, 32-row tiles of W cut short); AVX2 and plain C run the GEMV's
    passes up to GEMV_ROWS and dequantize past them."""
    lin, dense = _linear(qtype, n, k, seed=n * 1000 + k + rows)
    assert np.array_equal(lin.dequantize().numpy(), dense)
    dense = dense.astype(np.float64)
    x = np.random.default_rng(rows).standard_normal((rows, k)).astype(np.float32)
    got = lin.matmul(torch.from_numpy(x), max_isa=isa).double().numpy()
    assert got.shape == (rows, n) and np.isfinite(got).all()
    most = quant.kernel_rows(qtype, isa)
    ref_x = _quantize_x(x) if most is None or rows <= most else x.astype(np.float64)
    want = ref_x @ dense.T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k) * np.abs(want).max())
    exact = x.astype(np.float64) @ dense.T
    # int8 rounding moves each x by at most half its super-block's step d = max|x| / 127
    half_step = np.abs(x.reshape(rows, -1, 256)).max(-1) / 127 / 2
    bound = half_step @ np.abs(dense).reshape(n, -1, 256).sum(-1).T
    assert (np.abs(got - exact) <= 1.001 * bound + 1e-6).all()


@pytest.mark.parametrize("qtype", list(TYPES))
def test_every_variant_gives_the_same_result_on_strided_bf16_rows(qtype):
    """A row-strided view (a slice of a wider buffer) in bf16 runs without a copy and agrees
    across variants up to float32 summation order."""
    lin, _ = _linear(qtype, 19, 768, seed=qtype)
    wide = torch.randn(4, 1024, generator=torch.Generator().manual_seed(qtype)).to(torch.bfloat16)
    x = wide[:, 100:868]
    results = [lin.matmul(x, max_isa=isa) for isa in ISAS]
    want = lin.matmul(x.float().contiguous(), max_isa=quant.ISA_C)
    for got in results:  # float32 sums in another order: error relative to the largest output
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_k_types_refuse_rows_not_a_multiple_of_256():
    with pytest.raises(ValueError, match="multiple of 256 for Q6_K, got 576"):
        QuantizedLinear(torch.zeros(1, 210 * 2, dtype=torch.uint8), quant.Q6_K, 1, 576)
    with pytest.raises(ValueError, match="not a multiple of type 12's 256-weight block"):
        random_blocks(quant.Q4_K, 1, 576, np.random.default_rng(0))


def test_matmul_writes_into_out_on_both_paths():
    lin, _ = _linear(quant.Q5_K, 6, 256, seed=5)
    for rows in (2, quant.MAX_ROWS + 1, quant.GEMV_ROWS + 1):
        x = torch.randn(rows, 256)
        out = torch.empty(rows, 6)
        assert lin.matmul(x, out=out) is out
        torch.testing.assert_close(out, lin.matmul(x))
    with pytest.raises(ValueError, match="out must be"):
        lin.matmul(torch.randn(2, 256), out=torch.empty(6, 2).t())


@pytest.mark.parametrize("qtype", list(TYPES))
@pytest.mark.skipif(quant.best_isa() < quant.ISA_AVX512_VNNI, reason="the K-quant GEMM needs AVX-512 VNNI")
def test_many_tiles_on_both_sides_of_the_gemm_threshold(qtype):
    """A W of many tiles (as a vocabulary projection: each thread's share prefetches its next
    tile, the last share none) takes the tiled GEMM from QUANT_KGEMM_MIN_M rows, the GEMV's
    passes below: both sides match the reference."""
    lib = quant.lib
    n = 4096 + 40  # k = 256: one super-block a row; a short last tile
    lin, dense = _linear(qtype, n, 256, seed=qtype)
    dense = dense.astype(np.float64)
    rng = np.random.default_rng(qtype)
    for rows in (lib.QUANT_KGEMM_MIN_M - 1, lib.QUANT_KGEMM_MIN_M):
        x = rng.standard_normal((rows, 256)).astype(np.float32)
        got = lin.matmul(torch.from_numpy(x), max_isa=quant.ISA_AVX512_VNNI).double().numpy()
        want = _quantize_x(x) @ dense.T
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(256) * np.abs(want).max())
