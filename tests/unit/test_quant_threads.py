"""The quantized GEMV and tiled GEMMs split W's output rows over torch's OpenMP pool
(csrc/cpu/parallel.h): every thread count must give one thread's bits, on every variant and type,
with slices that do not fall on tile or 16-row boundaries."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.kernels import quant
from engine.kernels.quant import QuantizedLinear
from engine.kernels.quant_blocks import random_blocks

pytestmark = pytest.mark.skipif(quant.block_bytes(quant.Q4_0) == 0, reason="kernels not built")
ISAS = [i for i in (quant.ISA_C, quant.ISA_AVX2, quant.ISA_AVX512_VNNI) if i <= quant.best_isa()]
# 301 rows of 4096: over the split threshold (512 KiB of W) for every type, and no thread count
# divides it into whole tiles.
N, K = 301, 4096


@pytest.fixture
def threads():
    """Set torch's (and so the kernels') thread count; restored after the test."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("qtype", quant.SUPPORTED_TYPES, ids=lambda t: quant.TYPE_NAMES[t])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", [1, 5, 16, 37])
def test_every_thread_count_gives_the_one_thread_result(qtype, isa, rows, threads):
    rng = np.random.default_rng(qtype * 100 + rows)
    lin = QuantizedLinear(torch.from_numpy(random_blocks(qtype, N, K, rng)), qtype, N, K)
    assert lin.nbytes >= 512 * 1024
    x = torch.from_numpy(rng.standard_normal((rows, K)).astype(np.float32))
    if quant.kernel_rows(qtype, isa) is not None and rows > quant.kernel_rows(qtype, isa):
        pytest.skip("this row count dequantizes for torch's GEMM on this variant")
    threads(1)
    one = lin.matmul(x, max_isa=isa)
    for count in (2, 3):
        threads(count)
        assert torch.equal(lin.matmul(x, max_isa=isa), one), f"{count} threads"
