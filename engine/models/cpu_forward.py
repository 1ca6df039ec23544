"""The decoder's forward on torch ops and the C kernels: the CPU backends (and any non-CUDA device).

Three backends, one chosen at load (``LlamaForCausalLM``):
- ``CKernelForward`` (CPU, float32 on AVX2, bf16 on AVX-512 BF16): RMSNorm fused with the
  residual add, SiLU-and-mul and RoPE are one C call each (engine/kernels/activation.py). In
  bf16 each of torch's decomposed ops is a widening pass over memory; they took ~30% of a
  2048-token prefill step.
- ``TorchForward``: the same steps in torch ops, RoPE as a complex multiply.
- ``CompiledForward`` (compilation mode >= 1): the blocks around attention through
  torch.compile. Attention stays eager: its Python loop over prefill chunks and its per-step
  metadata would make a whole-forward graph recompile on every new batch. The two blocks take
  the layer as an argument; dynamo reads its tensors (norms, weights, GGUF blocks) as graph
  inputs and guards only on their shapes and dtypes, so one graph serves all layers, and
  ``dynamic=True`` keeps one graph for every token count (plus one for a single token). Its
  projections are the methods an eager model would have (``Placement(compiled=True)``): a
  C-kernel method (GGUF blocks, int8, the bf16 GEMV) runs in the graph as its torch op
  (engine/kernels/ops.py), the norms and SiLU as torch ops inductor fuses.

All three attend through engine/models/attention.py (the C decode kernel or SDPA), with
``TorchAttentionBuilder``'s metadata. The torch and C-kernel forwards also run what other
families add to Llama's layer (``Dims``: Gemma's norms of the attention and MLP outputs, its
gelu-tanh MLP, soft-capped scores, per-layer rope tables); the compiled one runs Llama's only.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F

from engine.kernels import activation
from engine.models.attention import AttentionMetadata, TorchAttentionBuilder, paged_attention
from engine.models.layers import DecoderLayer, Dims
from engine.models.linear import Linear
from engine.models.qk_norm import qk_rms_norm_
from engine.models.rope import RopeTables

if TYPE_CHECKING:
    from engine.models.llama import LlamaForCausalLM


class TorchForward:
    name = "torch"
    attention_builder = TorchAttentionBuilder
    cuda_graphs = False

    compiled = False

    def __init__(self, dims: Dims) -> None:
        self.dims = dims

    def __call__(self, model: "LlamaForCausalLM", input_ids: torch.Tensor, positions: torch.Tensor,
                 kv_caches: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        """Hidden states before the final norm, one row per input token."""
        d = self.dims
        ropes = [self._rope(table, positions) for table in model.ropes]
        h = model.embed(input_ids)
        for i, layer in enumerate(model.layers):
            qkv = self._attn_in(h, layer.input_norm, layer.qkv, positions, ropes[layer.rope], layer.q_norm,
                                layer.k_norm, model.ropes[layer.rope].cos_sin)
            attn = paged_attention(qkv, kv_caches[i], md, d.num_heads, d.num_kv_heads, d.head_dim, d.scale,
                                   layer.sliding, d.attn_softcap)
            h = self._attn_out_mlp(h, attn, layer)
        return h

    def final_norm(self, model: "LlamaForCausalLM", rows: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(rows, (self.dims.hidden,), model.norm, self.dims.eps)

    def _rope(self, table: RopeTables, positions: torch.Tensor) -> Optional[torch.Tensor]:
        rope = table.cis.index_select(0, positions).unsqueeze(1)
        return torch.view_as_real(rope) if self.compiled else rope  # inductor makes no code for complex ops

    def _attn_in(self, h: torch.Tensor, norm: torch.Tensor, qkv_proj: Linear, positions: torch.Tensor,
                 rope: Optional[torch.Tensor], q_norm: Optional[torch.Tensor], k_norm: Optional[torch.Tensor],
                 cos_sin: torch.Tensor) -> torch.Tensor:
        """Norm, fused q/k/v projection, Qwen3's per-head q/k norm, and RoPE on q and k in place."""
        d = self.dims
        num_tokens, cols = h.shape[0], d.q_size + d.kv_size
        qkv = qkv_proj(F.rms_norm(h, (d.hidden,), norm, d.eps))
        if q_norm is not None:
            qkv = qk_rms_norm_(qkv, q_norm, k_norm, d.num_heads, d.num_kv_heads, d.head_dim, d.eps, d.qk_norm_whole)
        pairs = qkv[:, :cols].float().view(num_tokens, -1, d.head_dim // 2, 2)
        if qkv.dtype == torch.float32:  # pairs is a view of qkv: rotate in place
            torch.view_as_complex(pairs).mul_(rope)
            return qkv
        qkv[:, :cols] = torch.view_as_real(torch.view_as_complex(pairs) * rope).view(num_tokens, cols)
        return qkv

    def _attn_out_mlp(self, h: torch.Tensor, attn: torch.Tensor, layer: DecoderLayer) -> torch.Tensor:
        """Output projection (normed, for Gemma) and residual, then norm, gated MLP (normed, for
        Gemma) and residual."""
        d = self.dims
        out = layer.o_proj(attn)
        if layer.attn_out_norm is not None:
            out = F.rms_norm(out, (d.hidden,), layer.attn_out_norm, d.eps)
        h = h + out
        out = self._mlp(layer, F.rms_norm(h, (d.hidden,), layer.post_norm, d.eps))
        if layer.mlp_out_norm is not None:
            out = F.rms_norm(out, (d.hidden,), layer.mlp_out_norm, d.eps)
        return h + out

    def _mlp(self, layer: DecoderLayer, x: torch.Tensor) -> torch.Tensor:
        """The layer's gated MLP, or its experts (a sparse layer, engine/models/moe.py)."""
        if layer.moe is not None:
            return layer.moe(x, self._act)
        return layer.down(self._act(layer.gate_up(x)))

    def _act(self, gate_up: torch.Tensor) -> torch.Tensor:
        """act(gate) * up of the fused gate/up rows (a layer's MLP or an expert's)."""
        width = gate_up.shape[1] // 2
        gate, up = gate_up[:, :width], gate_up[:, width:]
        if self.dims.act == "gelu_tanh":
            return F.gelu(gate, approximate="tanh") * up
        return F.silu(gate) * up


class CKernelForward(TorchForward):
    name = "cpu-kernels"

    def __init__(self, dims: Dims) -> None:
        super().__init__(dims)

    @staticmethod
    def supports(device: torch.device, act_dtype: torch.dtype, dims: Dims) -> bool:
        widths = (dims.hidden, dims.intermediate, dims.head_dim) + ((dims.moe.intermediate,) if dims.moe else ())
        return activation.supports(device, act_dtype, *widths)

    def final_norm(self, model: "LlamaForCausalLM", rows: torch.Tensor) -> torch.Tensor:
        return activation.rms_norm(rows, model.norm, self.dims.eps)

    def _rope(self, table: RopeTables, positions: torch.Tensor) -> None:
        return None  # the C kernel rotates from the positions and the table

    def _attn_in(self, h, norm, qkv_proj, positions, rope, q_norm, k_norm, cos_sin):
        d = self.dims
        qkv = qkv_proj(activation.rms_norm(h, norm, d.eps))
        if q_norm is not None:
            qk_rms_norm_(qkv, q_norm, k_norm, d.num_heads, d.num_kv_heads, d.head_dim, d.eps, d.qk_norm_whole)
        return activation.rotary_(qkv, positions, cos_sin, (d.q_size + d.kv_size) // d.head_dim, d.head_dim)

    def _attn_out_mlp(self, h, attn, layer):
        eps = self.dims.eps
        out = layer.o_proj(attn)
        if layer.attn_out_norm is not None:
            out = activation.rms_norm(out, layer.attn_out_norm, eps)
        x = activation.rms_norm(out, layer.post_norm, eps, residual=h)  # h += out
        out = self._mlp(layer, x)
        if layer.mlp_out_norm is not None:
            out = activation.rms_norm(out, layer.mlp_out_norm, eps)
        return h + out

    def _act(self, gate_up: torch.Tensor) -> torch.Tensor:
        return activation.silu_and_mul(gate_up) if self.dims.act == "silu" else super()._act(gate_up)


class CompiledForward(TorchForward):
    name = "torch-compiled"
    compiled = True

    def __init__(self, dims: Dims) -> None:
        super().__init__(dims)
        self._block_in = torch.compile(self._block_in, dynamic=True)
        self._block_out = torch.compile(self._block_out, dynamic=True)

    def __call__(self, model, input_ids, positions, kv_caches, md):
        d = self.dims
        ropes = [self._rope(table, positions) for table in model.ropes]
        h = model.embed(input_ids)
        for i, layer in enumerate(model.layers):
            qkv = self._block_in(h, layer, ropes[layer.rope])
            attn = paged_attention(qkv, kv_caches[i], md, d.num_heads, d.num_kv_heads, d.head_dim, d.scale,
                                   layer.sliding)
            h = self._block_out(h, attn, layer)
        return h

    def _block_in(self, h: torch.Tensor, layer: DecoderLayer, rope: torch.Tensor) -> torch.Tensor:
        d = self.dims
        num_tokens, cols = h.shape[0], d.q_size + d.kv_size
        qkv = layer.qkv(F.rms_norm(h, (d.hidden,), layer.input_norm, d.eps))
        if layer.q_norm is not None:
            qkv = qk_rms_norm_(qkv, layer.q_norm, layer.k_norm, d.num_heads, d.num_kv_heads, d.head_dim, d.eps)
        pairs = qkv[:, :cols].float().view(num_tokens, -1, d.head_dim // 2, 2)
        c, s = rope[..., 0], rope[..., 1]
        re, im = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack([re * c - im * s, im * c + re * s], -1).view(num_tokens, cols)
        return torch.cat([rotated.to(qkv.dtype), qkv[:, cols:]], dim=1)

    def _block_out(self, h: torch.Tensor, attn: torch.Tensor, layer: DecoderLayer) -> torch.Tensor:
        d = self.dims
        h = h + layer.o_proj(attn)
        gu = layer.gate_up(F.rms_norm(h, (d.hidden,), layer.post_norm, d.eps))
        return h + layer.down(F.silu(gu[:, :d.intermediate]) * gu[:, d.intermediate:])
