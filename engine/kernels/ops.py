"""The C kernels as torch ops (namespace ``ringllm``), each with a fake implementation.

Why: a cffi call is opaque to ``torch.compile``: dynamo cannot trace it, so a compiled
forward either breaks its graph at every kernel or avoids the kernels altogether (which is
what kept GGUF weights and compilation apart). Registered through ``torch.library``, a kernel
is one node of the graph: the fake implementation gives its output's shape and dtype from its
inputs' (no data is read), and at run time the node calls the same Python wrapper the eager
path calls (activation.py, quant.py, ...), so both paths run one kernel and one argument check.

Registered with ``torch.library.Library.define``/``impl`` rather than the ``custom_op``
decorator, whose Python wrapper costs several times more per call (benchmarks/kernel_ops.py;
RESULTS.md, "Kernels as torch ops"). Even a ``Library`` op adds torch's dispatcher to each of
a decode step's few hundred kernel calls, which measured beyond noise per step, so the eager
forwards keep the raw calls and only a compiled forward goes through these ops
(``engine.models.custom_op.CustomOp`` picks one per instance, once).
"""

from __future__ import annotations

from typing import Callable

import torch

from engine.kernels import activation, bf16_gemv, int8_linear, paged_attention, quant, quant_moe

NAMESPACE = "ringllm"
_LIB = torch.library.Library(NAMESPACE, "DEF")


def _op(schema: str, impl: Callable, fake: Callable) -> torch._ops.OpOverloadPacket:
    """Define ``ringllm::<schema>``, run by ``impl`` on CPU tensors and by ``fake`` while
    tracing; returns the op (``torch.ops.ringllm.<name>``)."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    _LIB.impl(name, impl, "CPU")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIB)
    return getattr(torch.ops.ringllm, name)


# ---------------------------------------------------------------- activations (csrc/cpu/activation.c)
def _rows_like(x, *rest):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``residual += x`` in place, then the norm of the sum."""
    return activation.rms_norm(x, weight, eps, residual=residual)


def _rotary(qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, heads: int, head_dim: int) -> None:
    """``activation.rotary_``: an op that mutates its input returns nothing (no alias of it)."""
    activation.rotary_(qkv, positions, cos_sin, heads, head_dim)


rms_norm = _op("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", activation.rms_norm, _rows_like)
fused_add_rms_norm = _op(
    "fused_add_rms_norm(Tensor x, Tensor(a!) residual, Tensor weight, float eps) -> Tensor",
    _fused_add_rms_norm,
    _rows_like,
)
silu_and_mul = _op(
    "silu_and_mul(Tensor x) -> Tensor", activation.silu_and_mul, lambda x: x.new_empty(x.shape[0], x.shape[1] // 2)
)
rotary_ = _op(
    "rotary_(Tensor(a!) qkv, Tensor positions, Tensor cos_sin, int heads, int head_dim) -> ()",
    _rotary,
    lambda qkv, positions, cos_sin, heads, head_dim: None,
)


# ---------------------------------------------------------------- matmuls (quant_gemv.c and the K-quants,
# quant_moe.c: [pairs, out] of stacked experts [experts, out, row_bytes], int8_gemv.c, gemv_bf16.c):
# float32 [rows, out] from [rows, in] activations
def _matmul_fake(x, weight, *rest):
    return x.new_empty(x.shape[0], weight.shape[0], dtype=torch.float32)


def _quant_matmul(
    x: torch.Tensor, blocks: torch.Tensor, qtype: int, in_features: int, row_invariant: bool
) -> torch.Tensor:
    """``QuantizedLinear.matmul`` (or ``matmul_row_invariant``) on GGUF blocks ``[out, row_bytes]``
    of any type in ``quant.SUPPORTED_TYPES``, the K-quants included."""
    q = quant.QuantizedLinear(blocks, qtype, blocks.shape[0], in_features)
    return q.matmul_row_invariant(x) if row_invariant else q.matmul(x)


def _quant_dequantize(blocks: torch.Tensor, qtype: int, in_features: int) -> torch.Tensor:
    return quant.QuantizedLinear(blocks, qtype, blocks.shape[0], in_features).dequantize()


quant_matmul = _op(
    "quant_matmul(Tensor x, Tensor blocks, int qtype, int in_features, bool row_invariant) -> Tensor",
    _quant_matmul,
    _matmul_fake,
)
quant_dequantize = _op(
    "quant_dequantize(Tensor blocks, int qtype, int in_features) -> Tensor",
    _quant_dequantize,
    lambda blocks, qtype, in_features: blocks.new_empty(blocks.shape[0], in_features, dtype=torch.float32),
)
# a sparse layer's GGUF experts, all pairs in one call (quant_moe.py); MoE models run eager today
# (their layers are beyond the compiled blocks), so this is what a compiled graph of them would call
quant_moe_matmul = _op(
    "quant_moe_matmul(Tensor x, Tensor rows, Tensor experts, Tensor blocks, int qtype, int in_features) -> Tensor",
    lambda x, rows, experts, blocks, qtype, in_features: quant_moe.QuantizedExperts(
        blocks, qtype, blocks.shape[1], in_features
    ).matmul(x, rows, experts),
    lambda x, rows, experts, blocks, qtype, in_features: x.new_empty(
        rows.shape[0], blocks.shape[1], dtype=torch.float32
    ),
)
int8_matmul = _op(
    "int8_matmul(Tensor x, Tensor qweight, Tensor scale, Tensor wsum) -> Tensor",
    lambda x, qweight, scale, wsum: int8_linear.Int8Linear(qweight, scale, wsum).matmul(x),
    _matmul_fake,
)
bf16_gemv_packed = _op(
    "bf16_gemv_packed(Tensor x, Tensor packed) -> Tensor",
    lambda x, packed: bf16_gemv.PackedBF16.from_packed(packed).matmul(x),
    _matmul_fake,
)
bf16_gemv_dense = _op(
    "bf16_gemv_dense(Tensor x, Tensor weight) -> Tensor",
    lambda x, weight: bf16_gemv.dense_matmul(weight, x),
    _matmul_fake,
)


# ---------------------------------------------------------------- attention (csrc/cpu/paged_attention.c)
def _decode_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    window: int,
    softcap: float,
    allow_avx512: bool,
) -> torch.Tensor:
    """``paged_attention.decode_attention``; the schema has no optional numbers here, so 0 is none."""
    return paged_attention.decode_attention(
        q,
        kv_cache,
        block_table,
        seq_lens,
        num_heads,
        num_kv_heads,
        head_dim,
        scale,
        window or None,
        allow_avx512,
        softcap or None,
    )


def _decode_attention_fake(q, kv_cache, block_table, seq_lens, num_heads, num_kv_heads, head_dim, *rest):
    return q.new_empty(q.shape[0], num_heads * head_dim)


paged_decode_attention = _op(
    "paged_decode_attention(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seq_lens, int num_heads, "
    "int num_kv_heads, int head_dim, float scale, int window, float softcap, bool allow_avx512) -> Tensor",
    _decode_attention,
    _decode_attention_fake,
)
