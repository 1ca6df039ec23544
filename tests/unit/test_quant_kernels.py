"""The GGUF block kernels (csrc/cpu/quant_gemv.c) against float64 math from the block definitions.

Weights are made with gguf.quants.quantize and checked against gguf.quants.dequantize; the
kernel's result is compared (1) with a float64 reference that quantizes x to int8 blocks the
same way the kernel does (equal up to float32 summation: rtol 1e-5) and (2) with the
unquantized x (int8 activation rounding: relative error of the whole output under 2%).
Row counts cover the GEMV's passes of 8, the tiled GEMM of AVX-512 VNNI and AVX2 (from
quant.GEMM_MIN_ROWS rows; micro-kernel tails of 4 and 3 rows, 32-row tiles of W cut short) and
prefill-sized batches, which the plain C variant dequantizes for a float32 GEMM."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from engine.kernels import quant  # noqa: E402
from engine.kernels.quant import QuantizedLinear  # noqa: E402

pytestmark = pytest.mark.skipif(quant.block_bytes(quant.Q4_1) == 0, reason="kernels not built")
TYPES = {
    quant.Q4_0: gguf.GGMLQuantizationType.Q4_0,
    quant.Q4_1: gguf.GGMLQuantizationType.Q4_1,
    quant.Q8_0: gguf.GGMLQuantizationType.Q8_0,
}
ISAS = [i for i in (quant.ISA_C, quant.ISA_AVX2, quant.ISA_AVX512_VNNI) if i <= quant.best_isa()]


def _quantize_x(x: np.ndarray):
    """x as the kernel sees it: per block of 32, d = max|x| / 127 and q = rint(x / d), in float32."""
    xb = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    d = (np.abs(xb).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.rint((xb * inv).astype(np.float32))
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)


@pytest.mark.parametrize("qtype", list(TYPES))
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,k", [(1, 32), (7, 96), (13, 576), (33, 160), (50, 64)])
@pytest.mark.parametrize("rows", [1, 3, 5, 8, 17, 65, 130])
def test_matches_float64_reference(qtype, isa, n, k, rows):
    rng = np.random.default_rng(n * 1000 + k + rows)
    w = rng.standard_normal((n, k)).astype(np.float32)
    blocks = gguf.quants.quantize(w, TYPES[qtype])
    lin = QuantizedLinear(torch.from_numpy(np.ascontiguousarray(blocks)), qtype, n, k)
    dense = gguf.quants.dequantize(blocks, TYPES[qtype]).astype(np.float64)
    assert np.array_equal(lin.dequantize().numpy(), dense.astype(np.float32))
    x = rng.standard_normal((rows, k)).astype(np.float32)
    got = lin.matmul(torch.from_numpy(x), max_isa=isa).double().numpy()
    assert got.shape == (rows, n) and np.isfinite(got).all()
    _check(got, x, dense, in_kernel=_in_kernel(qtype, isa, rows))


def _in_kernel(qtype: int, isa: int, rows: int) -> bool:
    """Whether matmul runs the int8 kernel (x quantized) rather than dequantize + float32 GEMM."""
    most = quant.kernel_rows(qtype, isa)
    return most is None or rows <= most


def _check(got: np.ndarray, x: np.ndarray, dense: np.ndarray, in_kernel: bool) -> None:
    ref_x = _quantize_x(x) if in_kernel else x.astype(np.float64)
    want = ref_x @ dense.T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(x.shape[1]) * np.abs(want).max())
    exact = x.astype(np.float64) @ dense.T
    assert np.linalg.norm(got - exact) <= 0.02 * np.linalg.norm(exact)


@pytest.mark.parametrize("qtype", list(TYPES))
@pytest.mark.parametrize("isa", [i for i in ISAS if i >= quant.ISA_AVX2])
def test_many_tiles_on_both_sides_of_the_gemm_threshold(qtype, isa):
    """A W of many tiles (as the vocabulary projection: each thread's share prefetches its next
    tile, the last share none) takes the GEMM from QUANT_GEMM_MIN_M rows: both sides of that
    switch match the reference."""
    from engine.kernels.quant_blocks import random_blocks

    lib = quant.lib
    k = 128
    n = 4096 + 40  # a short last tile
    rng = np.random.default_rng(qtype)
    blocks = random_blocks(qtype, n, k, rng, scale=0.1)
    lin = QuantizedLinear(torch.from_numpy(blocks), qtype, n, k)
    dense = gguf.quants.dequantize(blocks, TYPES[qtype]).astype(np.float64)
    for rows in (lib.QUANT_GEMM_MIN_M - 1, lib.QUANT_GEMM_MIN_M):
        x = rng.standard_normal((rows, k)).astype(np.float32)
        got = lin.matmul(torch.from_numpy(x), max_isa=isa).double().numpy()
        _check(got, x, dense, in_kernel=True)


def test_refuses_unsupported_type_and_shapes():
    with pytest.raises(ValueError, match="GGML type 10 .*Q4_K, Q5_K, Q6_K"):  # Q2_K
        QuantizedLinear(torch.zeros(10, dtype=torch.uint8), 10, 1, 32)
    with pytest.raises(ValueError, match="multiple of 32"):
        QuantizedLinear(torch.zeros(20, dtype=torch.uint8), quant.Q4_1, 1, 48)
    lin = QuantizedLinear(torch.zeros(20, dtype=torch.uint8), quant.Q4_1, 1, 32)
    with pytest.raises(ValueError, match="activations"):
        lin.matmul(torch.zeros(1, 64))


def test_default_model_q4_1_tensors_dequantize_like_gguf():
    from engine.models.default_model import default_gguf_path

    reader = gguf.GGUFReader(default_gguf_path())
    checked = 0
    for t in reader.tensors:
        if t.tensor_type.value not in TYPES or not t.name.startswith("blk.0."):
            continue
        n, k = int(t.shape[1]), int(t.shape[0])
        lin = QuantizedLinear(torch.from_numpy(np.array(t.data)), t.tensor_type.value, n, k)
        assert np.array_equal(lin.dequantize().numpy(), gguf.quants.dequantize(t.data, t.tensor_type))
        checked += 1
    assert checked == 7
