"""The float32 refinement of a half-precision LM head's top logits (engine/models/half_logits.py).

A bf16 GEMM rounds its float32 sums to bf16, so near-equal logits tie and argmax picks the
lower token id; after ``refine_near_max`` every row's argmax must be float32's, and the
recomputed values must be the float32 ones, on any vocabulary size and batch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.models.half_logits import _MAX_CANDIDATES, refine_near_max


def head(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rounded logits as compute_logits gets them, float32 reference)."""
    return F.linear(x, w).float(), F.linear(x.float(), w.float())


def test_a_tie_made_by_rounding_goes_to_the_larger_float32_logit():
    w = torch.zeros(64, 8, dtype=torch.bfloat16)
    w[3, :2] = torch.tensor([24.0, 1.0])
    w[40, :2] = torch.tensor([24.0, 1.015625])  # 2^-6 more: exact in bf16, lost in a bf16 sum near 25
    x = torch.zeros(1, 8, dtype=torch.bfloat16)
    x[0, :2] = 1.0
    logits, ref = head(x, w)
    assert logits[0, 3] == logits[0, 40] == 25.0 and int(logits.argmax()) == 3  # the tie, without the fix
    refine_near_max(logits, x, w)
    assert int(logits.argmax()) == 40
    assert logits[0, [3, 40]].tolist() == ref[0, [3, 40]].tolist() == [25.0, 25.015625]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [49152, 1000, 50])  # multiple of the 64 groups, a ragged tail, fewer columns
def test_every_argmax_is_float32s_and_only_the_top_changes(dtype, vocab):
    gen = torch.Generator().manual_seed(vocab)
    hidden = 64
    w = (torch.randn(vocab, hidden, generator=gen) * 0.5).to(dtype)
    x = (torch.randn(200, hidden, generator=gen) * 2).to(dtype)  # logits of +-20-40: coarse half steps
    logits, ref = head(x, w)
    rounded = logits.clone()
    refine_near_max(logits, x, w)
    assert torch.equal(logits.argmax(-1), ref.argmax(-1))
    changed = logits != rounded
    assert torch.allclose(logits[changed], ref[changed], rtol=1e-6, atol=1e-5)
    top = rounded.amax(-1, keepdim=True)
    assert not (changed & (rounded < top - 2 * torch.finfo(dtype).eps * top.abs())).any()
    if dtype == torch.bfloat16 and vocab >= 1000:
        assert (rounded.argmax(-1) != ref.argmax(-1)).any()  # the data has rounding-made ties to fix


def test_flat_and_nan_rows_are_left_alone_and_other_rows_still_refined():
    gen = torch.Generator().manual_seed(1)
    w = (torch.randn(3000, 16, generator=gen) * 0.1).bfloat16()
    w[100 : 100 + 2 * _MAX_CANDIDATES] = 1.0  # identical rows: row 0's top is this flat block
    x = torch.randn(3, 16, generator=gen) * 4
    x[0] = 1.0
    x[1] = float("nan")
    x[2] -= x[2].mean()  # orthogonal to the block: an ordinary top
    x = x.bfloat16()
    logits, ref = head(x, w)
    rounded = logits.clone()
    refine_near_max(logits, x, w)
    assert torch.equal(logits[0], rounded[0])
    assert logits[1].isnan().all()
    assert int(logits[2].argmax()) == int(ref[2].argmax())
    assert (logits[2] != rounded[2]).any()
