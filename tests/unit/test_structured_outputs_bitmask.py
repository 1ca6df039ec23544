"""The token-bitmask kernel (csrc/cpu/token_bitmask.c) against the bits unpacked in torch: -inf exactly
where a row's bit is clear, on a subset of rows, for vocabularies that are not a multiple of 32
(xgrammar's own CPU kernel, the fallback, writes the last partial word of a row into the next row
at such sizes, so it is checked only at multiples of 32)."""

from __future__ import annotations

import pytest
import torch

from engine.structured_output import bitmask as bitmask_module
from engine.structured_output.bitmask import GrammarBitmask, apply_grammar_bitmask, bitmask_words


def reference(logits: torch.Tensor, rows: list[int], masks: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    bits = ((masks.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).view(len(rows), -1)
    out[rows] = out[rows].masked_fill(bits[:, : logits.shape[1]] == 0, float("-inf"))
    return out


@pytest.mark.parametrize("path,vocab", [("c", 49152), ("c", 1000), ("c", 33), ("xgrammar", 49152), ("xgrammar", 1024)])
def test_masked_logits_are_exactly_the_clear_bits_of_the_constrained_rows(vocab, path, monkeypatch):
    if path == "xgrammar":
        monkeypatch.setattr(bitmask_module, "_KERNEL", [None])
    else:
        assert bitmask_module._c_kernel() is not None, "engine/structured_output/_bitmask is not built"
    gen = torch.Generator().manual_seed(vocab)
    rows, words = [3, 0, 5], bitmask_words(vocab)
    masks = torch.randint(-(2**31), 2**31 - 1, (len(rows), words), dtype=torch.int32, generator=gen)
    masks[0, : words // 2] = -1  # all allowed
    masks[1, words // 2 :] = 0  # all forbidden
    logits = torch.randn(6, vocab, generator=gen)
    expected = reference(logits, rows, masks)
    apply_grammar_bitmask(logits, GrammarBitmask(["a", "b", "c"], masks), {"a": 3, "b": 0, "c": 5})
    assert torch.equal(logits, expected)
    assert not torch.isinf(logits[[1, 2, 4]]).any()
