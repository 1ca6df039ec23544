"""The decoder's forward on torch ops and the C kernels: the CPU backends (and any non-CUDA device).

Three backends, one chosen at load (``LlamaForCausalLM``):
- ``CKernelForward`` (CPU, float32 on AVX2, bf16 on AVX-512 BF16): RMSNorm fused with the
  residual add, SiLU-and-mul and RoPE are one C call each (engine/models/activation_ops.py over
  engine/kernels/activation.py). In bf16 each of torch's decomposed ops is a widening pass over
  memory (engine/kernels/activation.py says what that cost).
- ``TorchForward``: the same steps in torch ops, RoPE as a complex multiply.
- ``CompiledForward`` (compilation mode >= 1): the C-kernel forward with its two blocks
  around attention through torch.compile. Attention stays eager: its Python loop over prefill
  chunks and its per-step metadata would make a whole-forward graph recompile on every new
  batch. The blocks take the layer's tensors and ``Linear``s as arguments; dynamo reads their
  tensors (norms, weights, GGUF blocks) as graph inputs and guards only on their shapes and
  dtypes, so one graph serves all layers, and ``dynamic=True`` keeps one graph for every token
  count (plus one for a single token). Its projections are the methods an eager model would
  have (``Placement(compiled=True)``), and every C kernel (GGUF, int8 and bf16 GEMVs, RMSNorm,
  SiLU-and-mul, RoPE) runs in the graphs as its torch op (engine/kernels/ops.py), so a
  compiled step computes what an eager step does; where the kernels do not run the model's
  rows, the activations are torch ops that inductor fuses.

All three attend through engine/models/attention.py (the C decode kernel or SDPA), with
``TorchAttentionBuilder``'s metadata. The torch and C-kernel forwards also run what other
families add to Llama's layer (``Dims``: Gemma's norms of the attention and MLP outputs, its
gelu-tanh MLP, soft-capped scores, per-layer rope tables); the compiled one is run for Llama's
only (``LlamaForCausalLM``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F

from engine.kernels import activation
from engine.models.activation_ops import RMSNorm, Rotary, SiluAndMul
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
        """Hidden states before the final norm, one row per input token."""
        d = self.dims
        ropes = [self._rope(table, positions) for table in model.ropes]
        h = model.embed(input_ids)
        for i, layer in enumerate(model.layers):
            qkv = self._attn_in(
                h,
                layer.input_norm,
                layer.qkv,
                positions,
                ropes[layer.rope],
                layer.q_norm,
                layer.k_norm,
                model.ropes[layer.rope].cos_sin,
            )
            attn = paged_attention(
                qkv, kv_caches[i], md, d.num_heads, d.num_kv_heads, d.head_dim, d.scale, layer.sliding, d.attn_softcap
            )
            h = self._attn_out_mlp(h, attn, layer)
        return h

    def final_norm(self, model: "LlamaForCausalLM", rows: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(rows, (self.dims.hidden,), model.norm, self.dims.eps)

    def _rope(self, table: RopeTables, positions: torch.Tensor) -> Optional[torch.Tensor]:
        return table.cis.index_select(0, positions).unsqueeze(1)

    def _attn_in(
        self,
        h: torch.Tensor,
        norm: torch.Tensor,
        qkv_proj: Linear,
        positions: torch.Tensor,
        rope: Optional[torch.Tensor],
        q_norm: Optional[torch.Tensor],
        k_norm: Optional[torch.Tensor],
        cos_sin: torch.Tensor,
    ) -> torch.Tensor:
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
    """The C kernels' forward: RMSNorm (fused with the residual add), SiLU-and-mul and RoPE are
    ``activation_ops`` CustomOps, which run the raw kernel calls here (``IN_GRAPH`` False)."""

    name = "cpu-kernels"
    IN_GRAPH = False

    def __init__(self, dims: Dims, device: torch.device = torch.device("cpu"), kernel: bool = True) -> None:
        """``kernel``: the C kernels run this model's rows (``supports``); else torch ops."""
        super().__init__(dims)
        self.rms_norm = RMSNorm(device, kernel, self.IN_GRAPH)
        self.silu_and_mul = SiluAndMul(device, kernel, self.IN_GRAPH)
        self.rotary = Rotary(device, kernel, self.IN_GRAPH)

    @staticmethod
    def supports(device: torch.device, act_dtype: torch.dtype, dims: Dims) -> bool:
        widths = (dims.hidden, dims.intermediate, dims.head_dim) + ((dims.moe.intermediate,) if dims.moe else ())
        return activation.supports(device, act_dtype, *widths)

    def final_norm(self, model: "LlamaForCausalLM", rows: torch.Tensor) -> torch.Tensor:
        return self.rms_norm(rows, model.norm, self.dims.eps)

    def _rope(self, table: RopeTables, positions: torch.Tensor) -> None:
        return None  # the C kernel rotates from the positions and the table

    def _attn_in(self, h, norm, qkv_proj, positions, rope, q_norm, k_norm, cos_sin):
        d = self.dims
        qkv = qkv_proj(self.rms_norm(h, norm, d.eps))
        if q_norm is not None:
            qk_rms_norm_(qkv, q_norm, k_norm, d.num_heads, d.num_kv_heads, d.head_dim, d.eps, d.qk_norm_whole)
        return self.rotary(qkv, positions, cos_sin, (d.q_size + d.kv_size) // d.head_dim, d.head_dim)

    def _attn_out_mlp(self, h, attn, layer):
        eps = self.dims.eps
        out = layer.o_proj(attn)
        if layer.attn_out_norm is not None:
            out = self.rms_norm(out, layer.attn_out_norm, eps)
        x = self.rms_norm(out, layer.post_norm, eps, residual=h)  # h += out
        out = self._mlp(layer, x)
        if layer.mlp_out_norm is not None:
            out = self.rms_norm(out, layer.mlp_out_norm, eps)
        return h + out

    def _act(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.silu_and_mul(gate_up) if self.dims.act == "silu" else super()._act(gate_up)


class CompiledForward(CKernelForward):
    """The C-kernel forward with the blocks around attention (``_attn_in``, ``_attn_out_mlp``)
    through torch.compile; its CustomOps and C-kernel projections run as torch ops in the graphs."""

    name = "torch-compiled"
    IN_GRAPH = True

    def __init__(self, dims: Dims, device: torch.device = torch.device("cpu"), kernel: bool = True) -> None:
        super().__init__(dims, device, kernel)
        self._attn_in = torch.compile(self._attn_in, dynamic=True)
        self._attn_out_mlp = torch.compile(self._attn_out_mlp, dynamic=True)
