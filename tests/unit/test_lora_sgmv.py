"""The SGMV kernel (csrc/cpu/lora_sgmv.c, engine/kernels/lora_sgmv.py) against torch in float64:
each variant this CPU runs, several slots with ragged rows, slots whose adapter skips the
projection or one of its parts, rows with no adapter, fused parts, ranks whose columns span
several of the kernel's chunks, widths and outputs off the vector width, strided x and y."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import lora_sgmv
from engine.lora.layer import LoRABatch, LoRAWeights

pytestmark = pytest.mark.skipif(not lora_sgmv.supports(torch.float32, torch.device("cpu")), reason="no CPU kernels")

ISAS = [isa for isa in (lora_sgmv.ISA_C, lora_sgmv.ISA_AVX2, lora_sgmv.ISA_AVX512) if isa <= lora_sgmv.best_isa()]


def _weights(parts, in_features, slots, max_rank, ranks, seed):
    """LoRAWeights with slot s holding a random adapter of rank ranks[s] (None: empty slot); the
    last part of slot 1 untouched by its adapter when there are several parts."""
    gen = torch.Generator().manual_seed(seed)
    lw = LoRAWeights(parts, in_features, slots, max_rank, torch.float32, torch.device("cpu"), LoRABatch())
    for slot, rank in enumerate(ranks):
        if rank is None:
            continue
        pairs = [
            (torch.randn(rank, in_features, generator=gen), torch.randn(size, rank, generator=gen)) for size in parts
        ]
        if slot == 1 and len(parts) > 1:
            pairs[-1] = None
        lw.set_slot(slot, rank, pairs)
    return lw


def _reference(x, y, lw, groups):
    out = y.double().clone()
    for slot, rows in groups:
        w = int(lw.width[slot])
        if w:
            out[rows] += x[rows].double() @ lw.a_t[slot, :, :w].double() @ lw.b_t[slot, :w].double()
    return out


def _assign(n, slots, seed):
    """Ragged rows per slot, in a shuffled order, some rows with no adapter."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=gen).tolist()
    groups, i = [], 0
    for slot in range(slots):
        take = int(torch.randint(0, max(2, n // slots + 3), (1,), generator=gen))
        if order[i : i + take]:
            groups.append((slot, order[i : i + take]))
        i += take
    return groups


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "parts, in_features, rank",
    [
        ([576, 192, 192], 576, 16),  # the default model's q/k/v
        ([1536, 1536], 576, 8),  # gate/up
        ([576], 1536, 64),  # down: one part, 64 columns
        ([40, 24, 24], 100, 32),  # 96 columns: the second part crosses the kernel's 64-column chunk
        ([37, 5], 77, 8),  # outputs and input off the vector width
        ([33], 19, 1),  # rank 1
    ],
)
def test_kernel_equals_torch(isa, parts, in_features, rank):
    slots = 5
    ranks = [rank, rank, None, max(1, rank // 2), rank]  # slot 2 empty (width 0), slot 3 a lower rank
    lw = _weights(parts, in_features, slots, rank, ranks, seed=rank)
    lw.clear_slot(4)  # an adapter that left its slot: its weights remain, its width is 0
    n = 45
    groups = _assign(n, slots, seed=len(parts) + rank)
    x = torch.randn(n, in_features)
    y = torch.randn(n, sum(parts))
    expected = _reference(x, y, lw, groups)
    sgmv = lora_sgmv.SGMV(lw.a_t, lw.b_t, lw.width, parts)
    got = sgmv.add_(x, y, lora_sgmv.Segments(groups), max_isa=isa)
    assert got is y
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("isa", ISAS)
def test_strided_x_and_y_views(isa):
    parts, in_features = [48, 16], 40
    lw = _weights(parts, in_features, 3, 16, [16, 8, 16], seed=3)
    x_wide, y_wide = torch.randn(11, in_features + 7), torch.randn(11, sum(parts) + 9)
    x, y = x_wide[:, 3 : 3 + in_features], y_wide[:, 5 : 5 + sum(parts)]
    before = y_wide.clone()
    groups = [(2, [0, 5, 6, 10]), (0, [1, 2, 3, 4, 7, 8, 9])]
    expected = _reference(x, y, lw, groups)
    lora_sgmv.SGMV(lw.a_t, lw.b_t, lw.width, parts).add_(x, y, lora_sgmv.Segments(groups), max_isa=isa)
    torch.testing.assert_close(y.double(), expected, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(y_wide[:, :5], before[:, :5], rtol=0, atol=0)  # nothing outside the view
    torch.testing.assert_close(y_wide[:, 5 + sum(parts) :], before[:, 5 + sum(parts) :], rtol=0, atol=0)


def test_many_rows_split_over_threads_equal_torch():
    """Enough rows for the call to cross parallel.h's threshold."""
    parts = [576, 192, 192]
    lw = _weights(parts, 576, 2, 16, [16, 16], seed=7)
    groups = [(0, list(range(0, 300, 2))), (1, list(range(1, 300, 2)))]
    x, y = torch.randn(300, 576), torch.randn(300, 960)
    expected = _reference(x, y, lw, groups)
    lora_sgmv.SGMV(lw.a_t, lw.b_t, lw.width, parts).add_(x, y, lora_sgmv.Segments(groups))
    torch.testing.assert_close(y.double(), expected, rtol=1e-4, atol=1e-3)


def test_a_row_gets_the_same_bits_alone_or_in_a_batch():
    """Batch invariance: a row's sums run in one order whatever the tile or the other rows."""
    parts = [64, 32]
    lw = _weights(parts, 96, 2, 16, [16, 8], seed=9)
    sgmv = lora_sgmv.SGMV(lw.a_t, lw.b_t, lw.width, parts)
    x, y = torch.randn(9, 96), torch.randn(9, 96)
    batch = y.clone()
    sgmv.add_(x, batch, lora_sgmv.Segments([(0, list(range(7))), (1, [7, 8])]))
    for row, slot in [(0, 0), (3, 0), (6, 0), (8, 1)]:
        alone = y[row : row + 1].clone()
        sgmv.add_(x[row : row + 1], alone, lora_sgmv.Segments([(slot, [0])]))
        assert torch.equal(alone[0], batch[row])


@pytest.mark.parametrize(
    "groups", [[(3, [0])], [(0, [9])], [(0, [-1])]], ids=["slot out of range", "row out of range", "negative row"]
)
def test_bad_segments_are_refused_before_anything_is_written(groups):
    lw = _weights([16], 8, 3, 8, [8, 8, 8], seed=1)
    x, y = torch.randn(9, 8), torch.randn(9, 16)
    before = y.clone()
    with pytest.raises(ValueError, match="lora_sgmv rejected"):
        lora_sgmv.SGMV(lw.a_t, lw.b_t, lw.width, [16]).add_(x, y, lora_sgmv.Segments([(0, [1, 2]), *groups]))
    assert torch.equal(y, before)
