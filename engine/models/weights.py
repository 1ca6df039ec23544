"""HF-named checkpoint tensors -> the decoder's fused parts.

``WeightRouter`` takes tensors (or GGUF blocks, engine/models/linear.py) one at a time under
their HF names, fuses q/k/v and gate/up once all parts of a layer have arrived, reorders the
q/k rows (and Qwen3's q/k norm weights) into adjacent rotary pairs (engine/models/rope.py),
and hands each finished part to ``put(kind, layer, name, value)``. Rows of GGUF blocks are
reordered as whole rows, which is exact: each row's blocks are independent of the others.
Checkpoints that ship q/k/v or gate/up already fused (Phi-3's ``qkv_proj``, ``gate_up_proj``)
are taken as they are, their q and k rows reordered in place. A family whose layer names mean
other parts (Gemma's ``post_attention_layernorm`` is the attention output's norm) passes its
own ``layer_names``. A sparse family's experts (``experts``: their prefix in a layer and
their part names) arrive one projection per expert; gate and up are fused per expert
("experts.<e>.gate_up"), and the router is a layer name mapped to "router".
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from engine.models.layers import Dims
from engine.models.linear import GGUFBlocks, GGUFParts
from engine.models.rope import pair_rotary_rows

Weight = torch.Tensor | GGUFBlocks | GGUFParts

# HF name (after "model.") -> (our name, per layer)
_SIMPLE = {
    "embed_tokens.weight": "embed",
    "norm.weight": "norm",
    "lm_head.weight": "lm_head",
    "score.weight": "score",
}  # score: a *ForSequenceClassification model's head
LAYER_NAMES = {
    "input_layernorm.weight": "input_norm",
    "post_attention_layernorm.weight": "post_norm",
    "self_attn.o_proj.weight": "o_proj",
    "mlp.down_proj.weight": "down",
    "self_attn.q_norm.weight": "q_norm",
    "self_attn.k_norm.weight": "k_norm",
}  # a family may pass its own
# HF projection -> our fused projection; parts are concatenated in this order.
_FUSED = {
    "self_attn.q_proj": "qkv",
    "self_attn.k_proj": "qkv",
    "self_attn.v_proj": "qkv",
    "mlp.gate_proj": "gate_up",
    "mlp.up_proj": "gate_up",
}
_PARTS = {f: [p for p, g in _FUSED.items() if g == f] for f in set(_FUSED.values())}


def expected_names(dims: Dims) -> set[str]:
    """Every part the model needs, as ``put`` names them ("layers.3.qkv", "norm", ...)."""
    per_layer = ["input_norm", "post_norm", "qkv", "o_proj"]
    per_layer += ["q_norm", "k_norm"] if dims.qk_norm else []
    per_layer += ["qkv_bias"] if dims.qkv_bias else []
    per_layer += ["attn_out_norm", "mlp_out_norm"] if dims.sandwich_norms else []
    moe = dims.moe
    experts = (
        ["router"] + [f"experts.{e}.{k}" for e in range(moe.num_experts) for k in ("gate_up", "down")]
        if moe is not None
        else []
    )
    names = {
        f"layers.{i}.{n}"
        for i in range(dims.num_layers)
        for n in per_layer + (experts if moe is not None and moe.sparse_layers[i] else ["gate_up", "down"])
    }
    names |= {"embed", "norm"}
    if dims.num_labels:
        return names | {"score"}
    return names if dims.tied else names | {"lm_head"}


def _rows(w: Weight, index: torch.Tensor) -> Weight:
    return w.permute_rows(index) if isinstance(w, GGUFBlocks) else w[index]


def pair_rows(w: Weight, num_heads: int, head_dim: int, rotary: int = 0) -> Weight:
    """q or k rows (or a bias, or Qwen3's norm weight) in adjacent rotary pairs."""
    return _rows(w, pair_rotary_rows(torch.arange(w.shape[0]), num_heads, head_dim, rotary))


def _pair_fused_qkv(w: Weight, dims: Dims) -> Weight:
    """A fused q/k/v matrix with its q and k rows in adjacent rotary pairs (v untouched)."""
    q = pair_rotary_rows(torch.arange(dims.q_size), dims.num_heads, dims.head_dim, dims.rotary_dim)
    k = pair_rotary_rows(torch.arange(dims.kv_size), dims.num_kv_heads, dims.head_dim, dims.rotary_dim)
    return _rows(w, torch.cat([q, k + dims.q_size, torch.arange(dims.q_size + dims.kv_size, w.shape[0])]))


def _cat(parts: list[Weight]) -> Weight:
    """The parts of a fused projection as one weight: GGUF blocks of one type stacked, of several
    types kept apart (``GGUFParts``), anything else as one float tensor."""
    if all(isinstance(p, GGUFBlocks) for p in parts):
        return GGUFBlocks.cat(parts) if len({p.qtype for p in parts}) == 1 else GGUFParts(parts)
    return torch.cat([p.dequantize() if isinstance(p, GGUFBlocks) else p.float() for p in parts])


class WeightRouter:
    def __init__(
        self,
        dims: Dims,
        put: Callable[[str, Optional[int], Weight], None],
        layer_names: Optional[dict[str, str]] = None,
        experts: Optional[tuple[str, dict[str, str]]] = None,
    ) -> None:
        self.dims, self.put, self.layer_names = dims, put, layer_names or LAYER_NAMES
        self.experts = experts
        self.pending: dict[str, Weight] = {}
        self.done: set[str] = set()
        self.expected = expected_names(dims)

    def add(self, name: str, tensor: Weight) -> None:
        name = name.removeprefix("model.")
        if "rotary_emb" in name or (name == "lm_head.weight" and self.dims.tied and not self.dims.num_labels):
            return
        if name in _SIMPLE:
            target = _SIMPLE[name]
            heads = ("score",) if self.dims.num_labels else ("lm_head",)  # the other head is unexpected
            if target in heads or target not in ("score", "lm_head"):
                return self._put(target, None, tensor)
        if name.startswith("layers."):
            idx, rest = name[len("layers.") :].split(".", 1)
            if rest in self.layer_names:
                target = self.layer_names[rest]
                if target in ("q_norm", "k_norm"):  # indexes head_dim (OLMoE: all q or k rows), as the q/k rows do
                    heads = (
                        (self.dims.num_heads if target == "q_norm" else self.dims.num_kv_heads)
                        if self.dims.qk_norm_whole
                        else 1
                    )
                    if tuple(tensor.shape) == self._shape(target):  # else _put names the shape
                        tensor = pair_rows(tensor, heads, self.dims.head_dim, self.dims.rotary_dim)
                elif target == "qkv" and tuple(tensor.shape) == self._shape("qkv"):  # else _put names the shape
                    tensor = _pair_fused_qkv(tensor, self.dims)
                return self._put(target, int(idx), tensor)
            if self.experts is not None and rest.startswith(self.experts[0]):
                return self._add_expert(idx, rest, tensor)
            base, kind = rest.rsplit(".", 1)
            if base in _FUSED:
                self.pending[name] = tensor
                return self._fuse(idx, _FUSED[base], kind)
        self.pending[name] = tensor  # unexpected: reported by finish()

    def _add_expert(self, idx: str, rest: str, tensor: Weight) -> None:
        """``<prefix><e>.<part>.weight``: down goes as it is, gate and up once both have come."""
        prefix, parts = self.experts
        expert, _, name = rest[len(prefix) :].partition(".")
        role = parts.get(name.removesuffix(".weight")) if name.endswith(".weight") else None
        self.pending[f"layers.{idx}.{rest}"] = tensor
        if role is None or not expert.isdigit():
            return  # unexpected: reported by finish()
        if role == "down":
            return self._put(f"experts.{int(expert)}.down", int(idx), self.pending.pop(f"layers.{idx}.{rest}"))
        keys = [f"layers.{idx}.{prefix}{expert}.{n}.weight" for r in ("gate", "up") for n, v in parts.items() if v == r]
        if all(k in self.pending for k in keys):
            self._put(f"experts.{int(expert)}.gate_up", int(idx), _cat([self.pending.pop(k) for k in keys]))

    def _shape(self, target: str) -> tuple[int, ...]:
        d = self.dims
        if target.startswith("experts."):
            width = d.moe.intermediate
            return (2 * width, d.hidden) if target.endswith("gate_up") else (d.hidden, width)
        qkv = d.q_size + 2 * d.kv_size
        return {
            "embed": (d.vocab_size, d.hidden),
            "lm_head": (d.vocab_size, d.hidden),
            "norm": (d.hidden,),
            "score": (d.num_labels, d.hidden),
            "input_norm": (d.hidden,),
            "post_norm": (d.hidden,),
            "attn_out_norm": (d.hidden,),
            "mlp_out_norm": (d.hidden,),
            "q_norm": (d.q_size if d.qk_norm_whole else d.head_dim,),
            "k_norm": (d.kv_size if d.qk_norm_whole else d.head_dim,),
            "qkv": (qkv, d.hidden),
            "router": (d.moe.num_experts if d.moe else 0, d.hidden),
            "qkv_bias": (qkv,),
            "o_proj": (d.hidden, d.q_size),
            "gate_up": (2 * d.intermediate, d.hidden),
            "down": (d.hidden, d.intermediate),
        }[target]

    def _put(self, target: str, layer: Optional[int], value: Weight) -> None:
        full = target if layer is None else f"layers.{layer}.{target}"
        if self.dims.moe is not None and full not in self.expected and not target.endswith("_bias"):
            raise ValueError(
                f"checkpoint has {full} but the config says the model has no such part "
                "(a dense MLP in a sparse layer, experts in a dense one, or an expert past num_experts)"
            )
        want = self._shape(target)
        if tuple(value.shape) != want:  # a RuntimeError, as a copy into a tensor of another shape is
            raise RuntimeError(f"{target}: expected shape {list(want)}, got {list(value.shape)}")
        self.done.add(full)
        self.put(target, layer, value)

    def _fuse(self, idx: str, fused: str, kind: str) -> None:
        keys = [f"layers.{idx}.{p}.{kind}" for p in _PARTS[fused]]
        if not all(k in self.pending for k in keys):
            return
        parts = [self.pending.pop(k) for k in keys]
        if fused == "qkv":
            parts[0] = pair_rows(parts[0], self.dims.num_heads, self.dims.head_dim, self.dims.rotary_dim)
            parts[1] = pair_rows(parts[1], self.dims.num_kv_heads, self.dims.head_dim, self.dims.rotary_dim)
        target = fused if kind == "weight" else f"{fused}_bias"
        if target == "qkv_bias" and not self.dims.qkv_bias or target == "gate_up_bias":
            raise ValueError(f"checkpoint has {keys[0]} but the config says the model has no such parameter")
        self._put(target, int(idx), _cat(parts))

    def finish(self) -> None:
        missing = expected_names(self.dims) - self.done
        if self.pending or missing:
            raise ValueError(
                f"checkpoint does not match the model: missing {sorted(missing)[:8]}, "
                f"unexpected {sorted(self.pending)[:8]}"
            )
