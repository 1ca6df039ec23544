"""One decoder for the Llama family (Llama/SmolLM, Qwen2, Qwen3, Mistral) over the paged KV cache.

Built for a lean CPU decode step rather than for module reuse:
- q/k/v and gate/up are fused into one matmul each, and only the rows that are
  sampled (or need prompt logprobs) ever reach the LM head.
- RoPE is one in-place pass (a C kernel on CPU, else a complex multiply). At load
  time the rows of each q and k head are permuted so that HF's rotate-half pairs
  (i, i + d/2) become adjacent (2i, 2i+1); q.k is unchanged by a permutation applied
  to both, and V is untouched, so the output is the same as HF's while the rotation
  is one op.
- On CPU, RMSNorm (fused with the residual add), SiLU-and-mul and RoPE are one C
  call each (engine/kernels/activation.py) in float32 and, on AVX-512 BF16 CPUs, in
  bf16: in bf16 each of torch's decomposed ops is a widening pass over memory, and
  they took ~30% of a 2048-token prefill step.
- Layers are plain attribute bundles called in a loop; no per-layer hooks.
- Matmul dtype: a bf16/fp16 model on a CPU without native support for it (no
  AVX-512, e.g. AVX2 only) would run every GEMM through torch's slow scalar
  fallback (a batch-64 decode step measured 4.5x slower than fp32). There the weights are
  rounded to the model dtype and stored as float32, so the GEMMs use MKL's fp32
  kernels on exactly the bf16 values. Activations are then float32 as well (a bf16
  elementwise op or SDPA on such a CPU is 3-4x slower than float32, and a mixed-dtype
  RMSNorm loses torch's fused kernel); only the KV cache stays in the model dtype.
- Weight layout (CPU, float32 GEMMs): q/k/v and gate/up, the two tall matrices, are
  stored input-major ([in, out]) and multiplied as ``x @ W``; at batch 1 MKL's GEMV is
  1.4-1.6x faster that way, and no slower at batch 64. A small-batch copy of the LM
  head is kept the same way (2x faster at 1-2 rows, slower from 4 rows up).
- Small batches on bf16 weights without native bf16 GEMMs: steps of at most
  ``bf16_gemv.MAX_ROWS`` tokens (decode at batch 1-4) are bound by reading the weights,
  and the float32 copies read twice the bytes. A second copy of every matrix is kept in
  bf16 in the C kernel's layout (engine/kernels/bf16_gemv.py) and those steps run on it:
  the same values (bf16-rounded, float32 accumulation), half the bytes per token.
- bf16 weights with native bf16 GEMMs (AVX-512 BF16 / AMX): a second copy of every matrix
  is packed once in oneDNN's layout (engine/kernels/onednn_linear.py) and every CPU step
  runs on it, sparing oneDNN a reorder of each weight at each call (~30% of the GEMMs' time).
- On CUDA (triton importable) the forward is the Triton one (engine/models/llama_triton.py)
  and the weights are plain ``[out, in]`` in the model dtype; the choice is made once, in
  ``__init__`` (``kernels``), and nothing else in the model checks the device.
"""
from __future__ import annotations

import math
import sys
from typing import Any, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import activation, bf16_gemv, onednn_linear
from engine.kernels import triton as triton_kernels
from engine.kernels.bf16_gemv import PackedBF16
from engine.kernels.onednn_linear import PackedLinear
from engine.models.attention import AttentionMetadata, paged_attention
from engine.models import llama_triton
from engine.models.half_logits import refine_near_max
from engine.models.qk_norm import qk_rms_norm_

_ROPE_TYPES = ("default", "linear", "llama3")


def rope_parameters(cfg: Any) -> dict:
    """Merge transformers 5's ``rope_parameters`` with the older ``rope_theta``/``rope_scaling``."""
    params = dict(getattr(cfg, "rope_scaling", None) or {})
    params.update(getattr(cfg, "rope_parameters", None) or {})
    params.setdefault("rope_theta", getattr(cfg, "rope_theta", None) or 10000.0)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    if params["rope_type"] not in _ROPE_TYPES:
        raise ValueError(f"rope type {params['rope_type']!r} is not supported; supported: {', '.join(_ROPE_TYPES)}")
    return params


def rope_inv_freq(head_dim: int, params: dict) -> torch.Tensor:
    inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if params["rope_type"] == "linear":
        return inv_freq / params["factor"]
    if params["rope_type"] == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old_len = params["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


def _pair_rotary_rows(w: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """Reorder each head's rows from rotate-half order to adjacent (re, im) pairs."""
    half = head_dim // 2
    perm = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()
    return w.reshape(num_heads, head_dim, *w.shape[1:])[:, perm].reshape(w.shape)


def matmul_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype the GEMMs run in (see the module docstring)."""
    if device.type != "cpu" or dtype == torch.float32:
        return dtype
    native = (torch.ops.mkldnn._is_mkldnn_bf16_supported() if dtype == torch.bfloat16
              else torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return dtype if native else torch.float32


def _param(*shape: int, dtype: torch.dtype, device: torch.device, fill: Optional[float] = None) -> nn.Parameter:
    t = torch.empty(shape, dtype=dtype, device=device) if fill is None else torch.full(
        shape, fill, dtype=dtype, device=device)
    return nn.Parameter(t, requires_grad=False)


def _proj(x: torch.Tensor, w: torch.Tensor | PackedBF16 | PackedLinear, bias: Optional[torch.Tensor],
          in_major: bool) -> torch.Tensor:
    if isinstance(w, PackedLinear):
        return w.matmul(x, bias)
    if isinstance(w, PackedBF16):
        y = w.matmul(x)
        return y if bias is None else y.add_(bias)
    if not in_major:
        return F.linear(x, w, bias)
    return torch.mm(x, w) if bias is None else torch.addmm(bias, x, w)


class DecoderLayer(nn.Module):
    def __init__(self, hidden: int, qkv_out: int, q_size: int, intermediate: int, qkv_bias: bool,
                 qk_norm_dim: int, sliding: bool, in_major: bool, act: dict, mm: dict) -> None:
        """``qk_norm_dim``: head_dim for Qwen3's per-head q/k RMSNorm, 0 for none."""
        super().__init__()
        tall = (lambda out, inp: (inp, out)) if in_major else (lambda out, inp: (out, inp))
        self.input_norm = _param(hidden, fill=1.0, **act)
        self.qkv = _param(*tall(qkv_out, hidden), **mm)
        self.qkv_bias = _param(qkv_out, fill=0.0, **mm) if qkv_bias else None
        self.q_norm = _param(qk_norm_dim, fill=1.0, **act) if qk_norm_dim else None
        self.k_norm = _param(qk_norm_dim, fill=1.0, **act) if qk_norm_dim else None
        self.o_proj = _param(hidden, q_size, **mm)
        self.post_norm = _param(hidden, fill=1.0, **act)
        self.gate_up = _param(*tall(2 * intermediate, hidden), **mm)
        self.down = _param(hidden, intermediate, **mm)
        self.sliding = sliding


class PackedLayer:
    """One layer's matrices packed by ``pack`` (``PackedBF16`` or ``PackedLinear``, [out, in])."""

    __slots__ = ("qkv", "o_proj", "gate_up", "down")

    def __init__(self, layer: DecoderLayer, in_major: bool, pack: type) -> None:
        out_major = (lambda w: w.t()) if in_major else (lambda w: w)
        self.qkv = pack(out_major(layer.qkv))
        self.o_proj = pack(layer.o_proj)
        self.gate_up = pack(out_major(layer.gate_up))
        self.down = pack(layer.down)


_KERNELS = ("auto", "torch", "triton")


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: Any, dtype: torch.dtype, device: torch.device | str, max_model_len: int,
                 kernels: str = "auto") -> None:
        """``kernels``: "auto" runs the Triton forward on a CUDA device where triton imports and
        the CPU/torch forward elsewhere; "triton" forces the Triton forward (internal: the
        tests run it on CPU tensors under ``TRITON_INTERPRET=1``); "torch" forces the other."""
        super().__init__()
        device = torch.device(device)
        if kernels not in _KERNELS:
            raise ValueError(f"kernels must be one of {', '.join(_KERNELS)}, got {kernels!r}")
        self.use_triton = kernels == "triton" or (
            kernels == "auto" and device.type == "cuda" and triton_kernels.available())
        self.dtype = dtype
        self.mm_dtype = dtype if self.use_triton else matmul_dtype(dtype, device)
        mm = dict(dtype=self.mm_dtype, device=device)
        act = mm  # activations and norms run in the GEMMs' dtype (see the module docstring)
        self.in_major = device.type == "cpu" and self.mm_dtype == torch.float32 and not self.use_triton
        self.compiled = False
        self.hidden = cfg.hidden_size
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(cfg, "head_dim", None) or self.hidden // self.num_heads
        # RMSNorm (fused with the residual add), SiLU-and-mul and RoPE in C (engine/kernels/activation.py)
        self.c_activations = not self.use_triton and activation.supports(
            device, self.mm_dtype, cfg.hidden_size, cfg.intermediate_size, self.head_dim)
        self.intermediate = cfg.intermediate_size
        self.vocab_size = cfg.vocab_size
        self.eps = float(cfg.rms_norm_eps)
        self.scale = self.head_dim ** -0.5
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.tied = bool(getattr(cfg, "tie_word_embeddings", False))
        self.sliding_window = self._sliding_window(cfg)
        layer_types = getattr(cfg, "layer_types", None) or []
        qkv_bias = bool(getattr(cfg, "attention_bias", False)) or cfg.model_type == "qwen2"
        qk_norm_dim = self.head_dim if cfg.model_type == "qwen3" else 0
        self.layers = nn.ModuleList(
            DecoderLayer(self.hidden, self.q_size + 2 * self.kv_size, self.q_size, self.intermediate, qkv_bias,
                         qk_norm_dim,
                         sliding=self.sliding_window is not None and (
                             not layer_types or layer_types[i] == "sliding_attention"),
                         in_major=self.in_major, act=act, mm=mm)
            for i in range(cfg.num_hidden_layers))
        self.embed = _param(self.vocab_size, self.hidden, **mm)
        self.norm = _param(self.hidden, fill=1.0, **act)
        self.lm_head = self.embed if self.tied else _param(self.vocab_size, self.hidden, **mm)
        self.lm_head_t: Optional[torch.Tensor] = None  # [hidden, vocab] for 1-2 rows; set after loading
        # Weights packed once at load for steps of <= packed_rows tokens (see the module docstring):
        # bf16 copies for the GEMV kernel, or oneDNN's layout on CPUs with native bf16 GEMMs
        self.packed_layers: Optional[list[PackedLayer]] = None
        self.packed_lm_head: Optional[PackedBF16 | PackedLinear] = None
        self.packed_rows = 0
        inv_freq = rope_inv_freq(self.head_dim, rope_parameters(cfg))
        angles = torch.arange(max_model_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.register_buffer("rope_cis", torch.complex(angles.cos(), angles.sin()).to(device), persistent=False)
        self.cos_sin = torch.view_as_real(self.rope_cis)  # [max_len, d/2, 2] float32, for the Triton and C RoPE

    @staticmethod
    def _sliding_window(cfg: Any) -> Optional[int]:
        window = getattr(cfg, "sliding_window", None)
        if not window:
            return None
        if cfg.model_type in ("qwen2", "qwen3") and not getattr(cfg, "use_sliding_window", False):
            return None
        return int(window)

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (len(self.layers), num_blocks, block_size, 2 * self.kv_size)

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: torch.Tensor,
                md: AttentionMetadata) -> torch.Tensor:
        """Hidden states before the final norm, one row per input token."""
        if self.use_triton:
            return llama_triton.forward(self, input_ids, positions, kv_caches, md)
        rope = None  # the C kernels rotate from positions and the table
        if not self.c_activations:
            rope = self.rope_cis.index_select(0, positions).unsqueeze(1)
            if self.compiled:
                rope = torch.view_as_real(rope)  # inductor generates no code for complex ops
        h = F.embedding(input_ids, self.embed)
        packed = self.packed_layers if input_ids.shape[0] <= self.packed_rows and not self.compiled else None
        for i, layer in enumerate(self.layers):
            w = layer if packed is None else packed[i]
            qkv = self._attn_in(h, layer.input_norm, w.qkv, layer.qkv_bias, positions, rope, layer.q_norm,
                                layer.k_norm)
            attn = paged_attention(qkv, kv_caches[i], md, self.num_heads, self.num_kv_heads, self.head_dim,
                                   self.scale, layer.sliding)
            h = self._attn_out_mlp(h, attn, w.o_proj, layer.post_norm, w.gate_up, w.down)
        return h

    def compile(self) -> None:
        """Run the dense parts of every layer through torch.compile (compilation mode >= 1).

        Attention stays eager: its Python loop over prefill chunks and its per-step metadata
        would make a whole-forward graph recompile on every new batch. The two blocks around
        it take the layer's weights as arguments, so one graph serves all layers, and
        ``dynamic=True`` keeps one graph for every token count (plus one for a single token).
        The Triton forward is already fused kernels and is left as it is.
        """
        if self.use_triton:
            return
        self.compiled = True
        self.c_activations = False  # an opaque C call would split the graphs
        self._attn_in = torch.compile(self._attn_in, dynamic=True)
        self._attn_out_mlp = torch.compile(self._attn_out_mlp, dynamic=True)

    def _attn_in(self, h: torch.Tensor, norm: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor],
                 positions: torch.Tensor, rope: Optional[torch.Tensor], q_norm: Optional[torch.Tensor] = None,
                 k_norm: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Norm, fused q/k/v projection, Qwen3's per-head q/k norm, and RoPE on q and k (in
        place where eager allows)."""
        num_tokens, cols = h.shape[0], self.q_size + self.kv_size
        if self.c_activations:
            qkv = _proj(activation.rms_norm(h, norm, self.eps), w, bias, self.in_major)
            if q_norm is not None:
                qk_rms_norm_(qkv, q_norm, k_norm, self.num_heads, self.num_kv_heads, self.head_dim, self.eps)
            return activation.rotary_(qkv, positions, self.cos_sin, cols // self.head_dim, self.head_dim)
        x = F.rms_norm(h, (self.hidden,), norm, self.eps)
        qkv = _proj(x, w, bias, self.in_major)
        if q_norm is not None:
            qkv = qk_rms_norm_(qkv, q_norm, k_norm, self.num_heads, self.num_kv_heads, self.head_dim, self.eps)
        pairs = qkv[:, :cols].float().view(num_tokens, -1, self.head_dim // 2, 2)
        if self.compiled:
            c, s = rope[..., 0], rope[..., 1]
            re, im = pairs[..., 0], pairs[..., 1]
            rotated = torch.stack([re * c - im * s, im * c + re * s], -1).view(num_tokens, cols)
            return torch.cat([rotated.to(qkv.dtype), qkv[:, cols:]], dim=1)
        if qkv.dtype == torch.float32:  # pairs is a view of qkv: rotate in place
            torch.view_as_complex(pairs).mul_(rope)
            return qkv
        qkv[:, :cols] = torch.view_as_real(torch.view_as_complex(pairs) * rope).view(num_tokens, cols)
        return qkv

    def _attn_out_mlp(self, h: torch.Tensor, attn: torch.Tensor, o_proj: torch.Tensor, norm: torch.Tensor,
                      gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        """Output projection and residual, then norm, SwiGLU MLP and residual."""
        out = _proj(attn, o_proj, None, False)
        if self.c_activations:
            x = activation.rms_norm(out, norm, self.eps, residual=h)  # h += out, in place
            act = activation.silu_and_mul(_proj(x, gate_up, None, self.in_major))
        else:
            h = h + out
            x = F.rms_norm(h, (self.hidden,), norm, self.eps)
            gu = _proj(x, gate_up, None, self.in_major)
            act = F.silu(gu[:, :self.intermediate]) * gu[:, self.intermediate:]
        return h + _proj(act, down, None, False)

    def norm_rows(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm of the given rows of ``forward``'s output, in float32: the decoder's
        last hidden states (transformers' ``hidden_states[-1]``), which a pooling model pools."""
        return F.rms_norm(hidden.float(), (self.hidden,), self.norm.float(), self.eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits of the given rows of ``forward``'s output (the final norm is applied
        here, so rows that are never sampled skip it along with the LM head). A bf16/fp16 head
        rounds its output; the logits that could be a row's maximum are recomputed unrounded."""
        if self.use_triton:
            x = llama_triton.final_norm(self, hidden)
        elif self.c_activations:
            x = activation.rms_norm(hidden, self.norm, self.eps)
        else:
            x = F.rms_norm(hidden, (self.hidden,), self.norm, self.eps)
        packed = self.packed_lm_head if x.shape[0] <= self.packed_rows else None
        if isinstance(packed, PackedBF16):
            return packed.matmul(x)
        if self.lm_head_t is not None and x.shape[0] <= 2:
            return torch.mm(x, self.lm_head_t)
        logits = (F.linear(x, self.lm_head) if packed is None else packed.matmul(x)).float()
        if x.dtype != torch.float32:
            refine_near_max(logits, x, self.lm_head)
        return logits

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors in, fusing q/k/v and gate/up; every parameter must be set."""
        pending: dict[str, torch.Tensor] = {}
        missing = {n for n, _ in self.named_parameters()}
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if "rotary_emb" in name or (name == "lm_head.weight" and self.tied):
                continue
            target = self._simple_target(name)
            if target is not None:
                if target[0] in ("q_norm", "k_norm"):  # indexes head_dim, as the permuted q/k rows do
                    tensor = _pair_rotary_rows(tensor, 1, self.head_dim)
                self._param(*target).copy_(tensor.to(self.dtype))
                missing.discard(self._param_name(*target))
                continue
            pending[name] = tensor
            self._fuse_ready(pending, missing)
        if pending or missing:
            raise ValueError(f"checkpoint does not match the model: missing {sorted(missing)[:8]}, "
                             f"unexpected {sorted(pending)[:8]}")
        self._post_load()

    @torch.no_grad()
    def init_dummy(self, seed: int = 0) -> None:
        """Random weights for load_format='dummy' (tests and overhead benchmarks); the same
        values whatever the storage layout."""
        gen = torch.Generator().manual_seed(seed)
        for name, param in self.named_parameters():
            if param.dim() == 1:
                continue  # norms stay 1, biases 0
            flipped = self.in_major and name.endswith((".qkv", ".gate_up"))
            shape = param.shape[::-1] if flipped else param.shape
            w = (torch.randn(shape, generator=gen) * 0.02).to(self.dtype)
            param.copy_(w.t() if flipped else w)
        self._post_load()

    def _post_load(self) -> None:
        if self._packs_bf16():
            self.packed_layers = [PackedLayer(layer, self.in_major, PackedBF16) for layer in self.layers]
            self.packed_lm_head = PackedBF16(self.lm_head)
            self.packed_rows = bf16_gemv.MAX_ROWS
        elif not self.use_triton and onednn_linear.supports(self.embed.device, self.mm_dtype):
            self.packed_layers = [PackedLayer(layer, self.in_major, PackedLinear) for layer in self.layers]
            self.packed_lm_head = PackedLinear(self.lm_head)
            self.packed_rows = sys.maxsize
        elif self.in_major:
            self.lm_head_t = self.lm_head.t().contiguous()

    def _packs_bf16(self) -> bool:
        """bf16 weights held as float32 for MKL (no native bf16 GEMMs) on a CPU the kernel runs on."""
        if not (self.dtype == torch.bfloat16 and self.mm_dtype == torch.float32 and self.embed.device.type == "cpu"
                and bf16_gemv.available()):
            return False
        dims = [(self.q_size + 2 * self.kv_size, self.hidden), (self.hidden, self.q_size),
                (2 * self.intermediate, self.hidden), (self.hidden, self.intermediate), (self.vocab_size, self.hidden)]
        return all(bf16_gemv.fits(*d) for d in dims)

    _SIMPLE = {"embed_tokens.weight": ("embed", None), "norm.weight": ("norm", None),
               "lm_head.weight": ("lm_head", None), "input_layernorm.weight": ("input_norm", 0),
               "post_attention_layernorm.weight": ("post_norm", 0), "self_attn.o_proj.weight": ("o_proj", 0),
               "mlp.down_proj.weight": ("down", 0), "self_attn.q_norm.weight": ("q_norm", 0),
               "self_attn.k_norm.weight": ("k_norm", 0)}
    # HF projection -> our fused parameter; parts are concatenated in this order.
    _FUSED = {"self_attn.q_proj": "qkv", "self_attn.k_proj": "qkv", "self_attn.v_proj": "qkv",
              "mlp.gate_proj": "gate_up", "mlp.up_proj": "gate_up"}

    def _simple_target(self, name: str) -> Optional[tuple[str, Optional[int]]]:
        if name in self._SIMPLE:
            return self._SIMPLE[name]
        if name.startswith("layers."):
            idx, rest = name[len("layers."):].split(".", 1)
            if rest in self._SIMPLE:
                return self._SIMPLE[rest][0], int(idx)
        return None

    def _param(self, attr: str, layer: Optional[int]) -> torch.Tensor:
        return getattr(self if layer is None else self.layers[layer], attr)

    @staticmethod
    def _param_name(attr: str, layer: Optional[int]) -> str:
        return attr if layer is None else f"layers.{layer}.{attr}"

    def _fuse_ready(self, pending: dict[str, torch.Tensor], missing: set[str]) -> None:
        """Copy a fused parameter once all of its parts for one layer have arrived."""
        for name in list(pending):
            if not name.startswith("layers.") or name not in pending:
                continue
            idx, rest = name[len("layers."):].split(".", 1)
            base, kind = rest.rsplit(".", 1)
            if base not in self._FUSED:
                continue
            fused = self._FUSED[base]
            parts = [p for p, f in self._FUSED.items() if f == fused]
            keys = [f"layers.{idx}.{p}.{kind}" for p in parts]
            if not all(k in pending for k in keys):
                continue
            tensors = [pending.pop(k) for k in keys]
            if fused == "qkv":
                tensors[0] = _pair_rotary_rows(tensors[0], self.num_heads, self.head_dim)
                tensors[1] = _pair_rotary_rows(tensors[1], self.num_kv_heads, self.head_dim)
            attr = fused if kind == "weight" else f"{fused}_bias"
            layer = self.layers[int(idx)]
            if getattr(layer, attr, None) is None:
                raise ValueError(f"checkpoint has {keys[0]} but the config says the model has no such parameter")
            fused_tensor = torch.cat(tensors, dim=0).to(self.dtype)
            if kind == "weight" and self.in_major:
                fused_tensor = fused_tensor.t()
            getattr(layer, attr).copy_(fused_tensor)
            missing.discard(f"layers.{idx}.{attr}")
