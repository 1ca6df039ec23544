"""The decoder's forward on the Triton kernels (engine/kernels/triton/): the CUDA path.

``LlamaForCausalLM`` picks this forward once, when it is built for a CUDA device on which
triton imports (or when a test forces it on CPU tensors under ``TRITON_INTERPRET=1``); the
CPU forward in llama.py, with its C kernels and float32-GEMM layouts, is untouched.

Weights are ``[out, in]`` and multiplied with ``F.linear`` (cuBLAS's native layout).
Each layer is seven launches around the four GEMMs: a norm fused with the previous
residual add, RoPE in place on the q and k columns of the fused qkv rows, the step's K/V
written into the paged cache straight from those rows, one attention kernel for every
decode and prefill chunk of the step (``AttentionMetadata``'s block table, ``cu_seqlens``
and ``context_lens``), a norm fused with the attention residual, and SiLU-and-mul. The
MLP output of a layer is added to the residual by the next layer's norm, so the hidden
state is read and written once per norm. Nothing here reads a device value on the host.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from engine.kernels import triton as K
from engine.models.qk_norm import qk_rms_norm_

if TYPE_CHECKING:
    from engine.models.attention import AttentionMetadata
    from engine.models.llama import LlamaForCausalLM


def forward(model: "LlamaForCausalLM", input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: torch.Tensor,
            md: "AttentionMetadata") -> torch.Tensor:
    """Hidden states before the final norm (the same contract as the CPU forward)."""
    eps, d, q_size, kv_size = model.eps, model.head_dim, model.q_size, model.kv_size
    h = F.embedding(input_ids, model.embed)
    delta = None
    for i, layer in enumerate(model.layers):
        x = (K.rms_norm(h, layer.input_norm, eps) if delta is None
             else K.rms_norm(delta, layer.input_norm, eps, residual=h))  # h += delta
        qkv = F.linear(x, layer.qkv, layer.qkv_bias)
        if layer.q_norm is not None:
            qk_rms_norm_(qkv, layer.q_norm, layer.k_norm, model.num_heads, model.num_kv_heads, d, eps)
        K.rotary_embedding(qkv[:, :q_size + kv_size], positions, model.cos_sin, d)
        K.reshape_and_cache(qkv[:, q_size:], kv_caches[i], md.slot_mapping)
        attn = K.paged_attention(qkv[:, :q_size].view(qkv.shape[0], model.num_heads, d), kv_caches[i],
                                 md.block_tables, md.cu_seqlens, md.context_lens, model.scale,
                                 model.sliding_window if layer.sliding else None, max_query_len=md.max_query_len)
        x = K.rms_norm(F.linear(attn, layer.o_proj), layer.post_norm, eps, residual=h)  # h += o_proj(attn)
        delta = F.linear(K.silu_and_mul(F.linear(x, layer.gate_up)), layer.down)
    return h if delta is None else h + delta


def final_norm(model: "LlamaForCausalLM", rows: torch.Tensor) -> torch.Tensor:
    """The final RMSNorm of some rows of ``forward``'s output (before the LM head)."""
    return K.rms_norm(rows.contiguous(), model.norm, model.eps)
