"""The decoder's forward on the Triton kernels (engine/kernels/triton/): the CUDA backend.

Chosen once at load for a CUDA device on which triton imports (or forced by a test on CPU
tensors under ``TRITON_INTERPRET=1``). Its projections are ``TorchLinear`` (``[out, in]``,
cuBLAS's native layout).

Each layer is seven launches around the four GEMMs: a norm fused with the previous
residual add, RoPE in place on the q and k columns of the fused qkv rows, the step's K/V
written into the paged cache straight from those rows, one attention kernel for every
decode and prefill chunk of the step (``TritonAttentionBuilder``'s block table, ``cu_seqlens``
and ``context_lens``), a norm fused with the attention residual, and SiLU-and-mul. The
MLP output of a layer is added to the residual by the next layer's norm, so the hidden
state is read and written once per norm. Nothing here reads a device value on the host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.kernels import triton as K
from engine.models.attention import AttentionMetadata, TritonAttentionBuilder
from engine.models.layers import Dims
from engine.models.qk_norm import qk_rms_norm_

if TYPE_CHECKING:
    from engine.models.llama import LlamaForCausalLM


class TritonForward:
    name = "triton"
    attention_builder = TritonAttentionBuilder
    cuda_graphs = True  # decode steps replay captured graphs on CUDA (engine/worker/cuda_graphs.py)
    compiled = False

    def __init__(self, dims: Dims) -> None:
        self.dims = dims

    def __call__(
        self,
        model: "LlamaForCausalLM",
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: torch.Tensor,
        md: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states before the final norm (the same contract as the CPU forwards)."""
        dims = self.dims
        eps, d, q_size, kv_size = dims.eps, dims.head_dim, dims.q_size, dims.kv_size
        h = model.embed(input_ids)
        delta = None
        for i, layer in enumerate(model.layers):
            x = (
                K.rms_norm(h, layer.input_norm, eps)
                if delta is None
                else K.rms_norm(delta, layer.input_norm, eps, residual=h)
            )  # h += delta
            qkv = layer.qkv(x)
            if layer.q_norm is not None:
                qk_rms_norm_(qkv, layer.q_norm, layer.k_norm, dims.num_heads, dims.num_kv_heads, d, eps)
            K.rotary_embedding(qkv[:, : q_size + kv_size], positions, model.ropes[layer.rope].cos_sin, d)
            K.reshape_and_cache(qkv[:, q_size:], kv_caches[i], md.slot_mapping)
            attn = K.paged_attention(
                qkv[:, :q_size].view(qkv.shape[0], dims.num_heads, d),
                kv_caches[i],
                md.block_tables,
                md.cu_seqlens,
                md.context_lens,
                dims.scale,
                dims.sliding_window if layer.sliding else None,
                max_query_len=md.max_query_len,
            )
            x = K.rms_norm(layer.o_proj(attn), layer.post_norm, eps, residual=h)  # h += o_proj(attn)
            delta = layer.down(K.silu_and_mul(layer.gate_up(x)))
        return h if delta is None else h + delta

    def final_norm(self, model: "LlamaForCausalLM", rows: torch.Tensor) -> torch.Tensor:
        """The final RMSNorm of some rows of ``forward``'s output (before the LM head)."""
        return K.rms_norm(rows.contiguous(), model.norm, self.dims.eps)
