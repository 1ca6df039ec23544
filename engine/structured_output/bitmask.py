"""The per-step token bitmask: one row of ``ceil(vocab / 32)`` int32 words per constrained row
that is sampled this step (bit ``t % 32`` of word ``t // 32`` set: token t allowed), the format
both backends fill. The scheduler fills it (``manager.py``); the model runner applies it to the
logits before sampling, so every sampling stage sees the masked logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GrammarBitmask:
    req_ids: list[str]  # the constrained requests sampled this step, in batch order
    bitmask: torch.Tensor  # [len(req_ids), words] int32, row i for req_ids[i]


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def apply_grammar_bitmask(logits: torch.Tensor, grammar: GrammarBitmask, row_of: dict[str, int]) -> None:
    """-inf, in place, on every logit the grammar forbids, in the rows of ``grammar``'s requests
    (``row_of``: request id -> logits row). Columns past the bitmask (none when it was sized
    from the logits' width) are left alone. On CPU, csrc/cpu/token_bitmask.c: it skips the words
    that allow all their 32 tokens, so a row costs what its grammar forbids, where xgrammar's
    kernel tests every bit (benchmarks/RESULTS.md, "Kernel choices"); elsewhere, or unbuilt,
    xgrammar's kernel."""
    rows = [row_of[r] for r in grammar.req_ids]
    kernel = _c_kernel()
    if (
        kernel is not None
        and logits.device.type == "cpu"
        and logits.dtype == torch.float32
        and logits.stride(1) == 1
        and grammar.bitmask.is_contiguous()
    ):
        ffi, lib = kernel
        index = torch.tensor(rows, dtype=torch.int64)
        lib.ringllm_apply_token_bitmask_f32(
            ffi.cast("float *", logits.data_ptr()),
            logits.stride(0),
            ffi.cast("int32_t *", grammar.bitmask.data_ptr()),
            grammar.bitmask.shape[1],
            ffi.cast("int64_t *", index.data_ptr()),
            len(rows),
            logits.shape[1],
        )
        return
    import xgrammar

    full = torch.full((logits.shape[0], grammar.bitmask.shape[1]), -1, dtype=torch.int32)
    full[rows] = grammar.bitmask
    backend = "cpu" if logits.device.type == "cpu" else "auto"
    xgrammar.apply_token_bitmask_inplace(logits, full.to(logits.device), indices=rows, backend=backend)


_KERNEL: list = []


def _c_kernel():
    """(ffi, lib) of engine.structured_output._bitmask, or None where it is not built."""
    if not _KERNEL:
        try:
            from engine.structured_output._bitmask import ffi, lib

            _KERNEL.append((ffi, lib))
        except ImportError:
            _KERNEL.append(None)
    return _KERNEL[0]
