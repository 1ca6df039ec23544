"""One call per projection for all of a step's (row, expert) pairs (csrc/cpu/quant_moe.c,
engine/kernels/quant_moe.py, engine/models/moe_gguf.py): every output row is, bit for bit, what
the expert's own ``QuantizedLinear.matmul`` gives for the rows routed to it, on every type, variant
and thread count, with routing as uneven as a real step's; a sparse layer on it matches the
per-expert path to float32 rounding, and holds one copy of its experts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.kernels import quant
from engine.kernels.quant import QuantizedLinear
from engine.kernels.quant_blocks import random_blocks
from engine.kernels.quant_moe import QuantizedExperts
from engine.models.linear import GGUFBlocks, GGUFLinear, Linear, TorchLinear
from engine.models.moe import MoeDims, SparseMoE
from engine.models.moe_gguf import GGUFExperts

pytestmark = pytest.mark.skipif(quant.block_bytes(quant.Q4_0) == 0, reason="kernels not built")
ISAS = [i for i in (quant.ISA_C, quant.ISA_AVX2, quant.ISA_AVX512_VNNI) if i <= quant.best_isa()]
TYPES = pytest.mark.parametrize("qtype", quant.SUPPORTED_TYPES, ids=lambda t: quant.TYPE_NAMES[t])
# 7 experts of 200 rows (no whole number of 32-row tiles or 64-row GEMV units) of 2048 (eight K-quant
# super-blocks); over the pool's split threshold (512 KiB of W read) in every type.
E, N, K = 7, 200, 2048
# Routing of a step: expert 0 takes 21 rows (GEMV passes of 8 + 8 + 5, or the tiled GEMM), 2 takes 4
# (the 32-weight tiled GEMM's threshold), 5 takes 9 (the K-quants'), 3 one; 1, 4 and 6 none.
UNEVEN = [0] * 21 + [2] * 4 + [5] * 9 + [3]


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _experts(qtype: int, rng, experts: int = E, n: int = N, k: int = K) -> torch.Tensor:
    return torch.from_numpy(random_blocks(qtype, experts * n, k, rng)).view(experts, n, -1)


def _per_expert(blocks: torch.Tensor, qtype: int, x, rows, experts, isa: int) -> torch.Tensor:
    """The reference: each expert's rows through its own QuantizedLinear, put back in pair order."""
    y = torch.full((rows.shape[0], blocks.shape[1]), float("nan"))
    for e in experts.unique().tolist():
        sel = (experts == e).nonzero().flatten()
        y[sel] = QuantizedLinear(blocks[e], qtype, blocks.shape[1], K).matmul(x[rows[sel]], max_isa=isa)
    return y


@TYPES
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("count", [1, 2])
def test_each_pair_is_its_experts_own_matmul_bit_for_bit(qtype, isa, count, threads):
    """Pairs in shuffled order, rows of x reused by several pairs (a token's top-k), one thread
    and two: every row equals the per-expert kernel's."""
    rng = np.random.default_rng(qtype)
    blocks = _experts(qtype, rng)
    x = torch.from_numpy(rng.standard_normal((12, K)).astype(np.float32))
    experts = torch.tensor(UNEVEN)[torch.from_numpy(rng.permutation(len(UNEVEN)))]
    rows = torch.from_numpy(rng.integers(0, x.shape[0], len(UNEVEN)))
    threads(count)
    got = QuantizedExperts(blocks, qtype, N, K).matmul(x, rows, experts, max_isa=isa)
    assert torch.equal(got, _per_expert(blocks, qtype, x, rows, experts, isa))


@TYPES
def test_one_token_top_k_is_each_experts_gemv(qtype):
    """A single-sequence decode: one row of x, each of its top-k experts one row."""
    rng = np.random.default_rng(qtype + 1)
    blocks = _experts(qtype, rng)
    x = torch.from_numpy(rng.standard_normal((1, K)).astype(np.float32))
    rows, experts = torch.zeros(3, dtype=torch.int64), torch.tensor([6, 1, 4])
    got = QuantizedExperts(blocks, qtype, N, K).matmul(x, rows, experts)
    assert torch.equal(got, _per_expert(blocks, qtype, x, rows, experts, quant.best_isa()))


def test_a_row_or_expert_out_of_range_is_refused():
    blocks = _experts(quant.Q8_0, np.random.default_rng(0), experts=3, n=32, k=64)
    q, x = QuantizedExperts(blocks, quant.Q8_0, 32, 64), torch.randn(2, 64)
    with pytest.raises(ValueError, match="an expert past 3"):
        q.matmul(x, torch.tensor([0, 1]), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="a row past 2"):
        q.matmul(x, torch.tensor([0, 2]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="experts must be"):
        q.matmul(x, torch.tensor([0, 1]), torch.tensor([0]))
    with pytest.raises(ValueError, match="rows must be"):
        q.matmul(x, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 1]))


# ---------------------------------------------------------------- a sparse layer on it
HIDDEN, WIDTH, TOP_K = 256, 256, 3


def _layer(qtypes: tuple[int, int], rng, row_invariant: bool = False) -> SparseMoE:
    """6 experts, top-3; the router never picks expert 5 and always picks expert 0 for x >= 0."""
    moe = SparseMoE(MoeDims(6, TOP_K, WIDTH, True, (True,)))
    router = torch.from_numpy(rng.standard_normal((6, HIDDEN)).astype(np.float32)) * 0.05
    router[0] += 0.5
    router[5] -= 0.5
    moe.router = Linear(TorchLinear(router, torch.float32, torch.device("cpu")))
    for e in range(6):
        for kind, qtype, (n, k) in (("gate_up", qtypes[0], (2 * WIDTH, HIDDEN)), ("down", qtypes[1], (HIDDEN, WIDTH))):
            blocks = GGUFBlocks(torch.from_numpy(random_blocks(qtype, n, k, rng)), qtype, n, k)
            getattr(moe, kind)[e] = Linear(GGUFLinear(blocks, row_invariant=row_invariant))
    return moe


def _act(gate_up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate_up[:, :WIDTH]) * gate_up[:, WIDTH:]


@pytest.mark.parametrize("qtypes", [(quant.Q8_0, quant.Q8_0), (quant.Q4_0, quant.Q4_1), (quant.Q4_K, quant.Q6_K)])
@pytest.mark.parametrize("tokens", [1, 2, 19])
def test_a_layer_on_stacked_experts_matches_the_per_expert_path(qtypes, tokens):
    rng = np.random.default_rng(tokens)
    moe = _layer(qtypes, rng)
    before = sum(linear.nbytes for linear in moe.linears())
    x = torch.from_numpy(rng.random((tokens, HIDDEN)).astype(np.float32))
    want = moe(x, _act)  # per expert: nothing stacked yet
    moe.stack_experts()
    assert moe.gguf is not None and moe.gguf.runs(tokens)
    torch.testing.assert_close(moe(x, _act), want, rtol=1e-5, atol=1e-5)
    stack = moe.gguf.gate_up.data  # each expert holds a view of the stack: one copy resident
    assert [linear.method.q.data.data_ptr() for linear in moe.gate_up] == [stack[e].data_ptr() for e in range(6)]
    assert sum(linear.nbytes for linear in moe.linears()) == before


def test_experts_that_cannot_stack_keep_the_per_expert_path():
    rng = np.random.default_rng(0)
    mixed = _layer((quant.Q8_0, quant.Q8_0), rng)
    mixed.down[3] = _layer((quant.Q8_0, quant.Q4_0), rng).down[3]  # one expert's down in another type
    mixed.stack_experts()
    invariant = _layer((quant.Q8_0, quant.Q8_0), rng, row_invariant=True)  # deterministic: batch-invariant rows
    invariant.stack_experts()
    assert mixed.gguf is None and invariant.gguf is None


def test_a_step_beyond_decode_sizes_goes_per_expert(monkeypatch):
    """More tokens than GEMV_ROWS (a prefill, whose per-expert calls are spread over its rows)
    run per expert: the call's scratch stays decode-sized."""
    moe = _layer((quant.Q8_0, quant.Q8_0), np.random.default_rng(0))
    moe.stack_experts()
    sizes, call = [], GGUFExperts.__call__
    monkeypatch.setattr(GGUFExperts, "__call__", lambda self, x, *rest: sizes.append(len(x)) or call(self, x, *rest))
    x = torch.rand(quant.GEMV_ROWS + 1, HIDDEN)
    moe(x[:-1], _act)
    moe(x, _act)
    assert sizes == [quant.GEMV_ROWS]
