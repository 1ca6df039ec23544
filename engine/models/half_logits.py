"""Float32 values for the top logits of an LM head that ran in bf16/fp16.

Why: a half-precision GEMM accumulates in float32 but rounds its output to the half dtype.
At |logit| 16-32 a bf16 logit moves in steps of 0.125, so two candidates closer than that
often become an exact tie, which argmax breaks towards the lower token id. On a CPU with
native bf16 GEMMs (AVX-512 BF16 / AMX) the default model then answered "What is the capital
of France?" with "L'Étoile ..." instead of "The capital of France is Paris.": its float32
margin between "The" and "L" is 0.08, and both rounded to 25.25. Teacher-forced over 477
positions of 7 chat prompts, 10 argmaxes differed from float32's with rounded logits and 2
without (transformers in bf16: 8).

Rounding moves each value by at most eps/2 of it, so only a token within about eps * |max|
of its row's rounded maximum can be the true maximum (twice that margin is searched). Those
few are recomputed from the same bf16 operands in float32; the rest keep their rounded
values (they cannot win the argmax, and a 0.4% error in a logit far from the top barely
moves a probability). A float32 head instead would keep a float32 copy of the weights and
read twice the bytes at every step; it took over twice the bf16 head's time
(benchmarks/RESULTS.md, "Kernel choices").

Finding the candidates cheaply: the columns are split into ``_GROUPS`` strided groups and
each group's maximum is taken over a ``[rows, _GROUPS, vocab / _GROUPS]`` view, the one
vectorised pass over the logits (a mask over all of them measured several times slower);
only the columns of the groups that reach the threshold are compared.
"""

from __future__ import annotations

import torch

_GROUPS = 64
# A row with more candidates than this is nearly flat at its top; it keeps its rounded
# values, which bounds the float32 work by rows * _MAX_CANDIDATES dot products.
_MAX_CANDIDATES = 64


def refine_near_max(logits: torch.Tensor, x: torch.Tensor, weight) -> None:
    """Recompute in place, as ``x.float() @ weight.float().T``, every logit that may be its
    row's true maximum. ``logits`` is the float32 copy of the half-precision ``x @ weight.T``;
    ``weight`` is the tensor, or a function giving its rows for an index tensor (a linear
    method's ``rows``, when the weight is held in another layout)."""
    rows, cols = _candidates(logits, 2 * torch.finfo(x.dtype).eps)
    if rows.numel():
        picked = weight[cols] if isinstance(weight, torch.Tensor) else weight(cols)
        exact = (picked.float() * x[rows].float()).sum(dim=-1)
        logits.index_put_((rows, cols), exact)


def _candidates(logits: torch.Tensor, margin: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) of every logit within ``margin * |row max|`` of its row's maximum."""
    num_rows, vocab = logits.shape
    groups = min(_GROUPS, vocab)
    width = vocab // groups
    whole = width * groups
    group_max = logits[:, :whole].view(num_rows, groups, width).amax(dim=1)  # [rows, width]
    top = group_max.amax(dim=-1, keepdim=True)
    if whole < vocab:  # the last vocab % groups columns belong to no group: always compared
        top = torch.maximum(top, logits[:, whole:].amax(dim=-1, keepdim=True))
    threshold = top - margin * top.abs()
    rows, first = (group_max >= threshold).nonzero(as_tuple=True)
    rows, first = _bounded(rows, first, num_rows)
    cols = (first[:, None] + torch.arange(groups, device=logits.device) * width).flatten()
    rows = rows.repeat_interleave(groups)
    if whole < vocab:
        tail = torch.arange(whole, vocab, device=logits.device)
        cols = torch.cat([cols, tail.repeat(num_rows)])
        rows = torch.cat([rows, torch.arange(num_rows, device=logits.device).repeat_interleave(vocab - whole)])
    keep = logits[rows, cols] >= threshold[rows, 0]
    return _bounded(rows[keep], cols[keep], num_rows)


def _bounded(rows: torch.Tensor, cols: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the entries of rows that have more than ``_MAX_CANDIDATES`` of them."""
    ok = torch.bincount(rows, minlength=num_rows)[rows] <= _MAX_CANDIDATES
    return rows[ok], cols[ok]
