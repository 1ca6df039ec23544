"""One decoder for the Llama family (Llama/SmolLM, Qwen2, Qwen3, Mistral) over the paged KV cache.

Built for a lean decode step rather than for module reuse:
- q/k/v and gate/up are fused into one projection each (engine/models/weights.py), and only
  the rows that are sampled (or need prompt logprobs) ever reach the LM head.
- Everything that depends on the machine is chosen once, here, at construction:
  - the forward (a backend of the layers): Triton on CUDA (triton_forward.py), the C kernels
    on CPUs they run on, plain torch ops elsewhere, or the compiled torch forward
    (compilation mode >= 1) (cpu_forward.py); each names its attention-metadata builder;
  - each projection's ``LinearMethod`` (engine/models/linear.py, where the measured choices
    are written down), which holds the only copy of its weight.
- The activation dtype. A bf16/fp16 model on a CPU without native support for it (no
  AVX-512, e.g. AVX2 only) would run every GEMM through torch's slow scalar fallback, and its
  bf16 elementwise ops and SDPA are slower than float32 too (benchmarks/RESULTS.md, "Kernel
  choices"). There the activations are float32 and the weights stay bf16 in the C GEMV kernel's
  layout (float32 math on the bf16 values); a mixed-dtype RMSNorm would lose torch's fused
  kernel. Quantized weights (``quantization="gguf"``/"int8") take float32 activations, which
  their kernels quantize per block or per token. Only the KV cache stays in the model dtype.
- Resident weight bytes are measured after loading and logged next to the bytes of the
  checkpoint in the chosen format (``weights_report``).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Iterable, Optional

import torch

from engine.kernels import triton as triton_kernels
from engine.models.attention import AttentionMetadata
from engine.models.cpu_forward import CKernelForward, CompiledForward, TorchForward
from engine.models.half_logits import refine_near_max
from engine.models.layers import DecoderLayer, Dims, Embedding
from engine.models.linear import GGUFBlocks, Linear, Placement
from engine.models.rope import RopeTables, rope_inv_freq, rope_parameters  # noqa: F401 (re-exported)
from engine.models.weights import LAYER_NAMES, Weight, WeightRouter

logger = logging.getLogger(__name__)

_BACKENDS = ("auto", "torch", "triton")
QUANTIZATIONS = ("gguf", "int8")


def matmul_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype dense GEMMs and activations run in (see the module docstring)."""
    if device.type != "cpu" or dtype == torch.float32:
        return dtype
    native = (
        torch.ops.mkldnn._is_mkldnn_bf16_supported()
        if dtype == torch.bfloat16
        else torch.ops.mkldnn._is_mkldnn_fp16_supported()
    )
    return dtype if native else torch.float32


class LlamaForCausalLM:
    """The Llama family, and the base other families (gemma.py, phi3.py) change in what differs:
    ``dims_from_config`` (norms, soft-caps, scales), ``rope_tables``, ``LAYER_NAMES`` (the
    checkpoint's per-layer names) and ``_put`` (a weight's values as the forwards take them)."""

    LAYER_NAMES = LAYER_NAMES
    # a sparse family's experts: (checkpoint prefix in a layer, its part names -> "gate"/"up"/"down")
    EXPERTS: Optional[tuple[str, dict[str, str]]] = None

    def __init__(
        self,
        cfg: Any,
        dtype: torch.dtype,
        device: torch.device | str,
        max_model_len: int,
        backend: str = "auto",
        quantization: Optional[str] = None,
        compiled: bool = False,
        deterministic: bool = False,
    ) -> None:
        """``backend``: "auto" runs the Triton forward on a CUDA device where triton imports and
        a CPU/torch forward elsewhere; "triton" forces the Triton forward (internal: the tests run
        it on CPU tensors under ``TRITON_INTERPRET=1``); "torch" forces the others. ``compiled``:
        the torch forward through torch.compile (ignored by Triton, already fused kernels).
        ``deterministic``: each row's arithmetic independent of the batch and of prefix-cache
        hits (row-invariant projections, every token's attention in the decode kernel)."""
        device = torch.device(device)
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(_BACKENDS)}, got {backend!r}")
        if quantization is not None and quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization={quantization!r} is not supported; supported: None, {', '.join(QUANTIZATIONS)}"
            )
        self.dims = dims = self.dims_from_config(cfg)
        triton = backend == "triton" or (
            backend == "auto" and device.type == "cuda" and triton_kernels.available() and dims.llama_only
        )
        if triton and not dims.llama_only:
            raise ValueError("the Triton forward runs Llama's layer only; this model needs the torch forward")
        if compiled and not dims.llama_only:  # the compiled blocks are Llama's layer too
            logger.info(
                "compilation: %s runs eager (its layers go beyond Llama's compiled blocks)", type(self).__name__
            )
            compiled = False
        self.dtype, self.device, self.quantization, self.deterministic = dtype, device, quantization, deterministic
        if triton:
            self.act_dtype = dtype
        elif quantization is not None and device.type == "cpu":
            self.act_dtype = torch.float32
        else:
            self.act_dtype = matmul_dtype(dtype, device)
        if triton:
            from engine.models.triton_forward import TritonForward

            self.forward_impl = TritonForward(dims)
        elif compiled:
            self.forward_impl = CompiledForward(dims, device, CKernelForward.supports(device, self.act_dtype, dims))
        elif CKernelForward.supports(device, self.act_dtype, dims):
            self.forward_impl = CKernelForward(dims, device)
        else:
            self.forward_impl = TorchForward(dims)
        self.placement = Placement(
            device, dtype, self.act_dtype, triton, quantization, deterministic, compiled=compiled and not triton
        )
        self.ropes, rope_of_layer = self.rope_tables(cfg, dims, max_model_len, device)
        moe = dims.moe
        self.layers = [
            DecoderLayer(s, r, moe if moe is not None and moe.sparse_layers[i] else None)
            for i, (s, r) in enumerate(zip(dims.sliding_layers, rope_of_layer))
        ]
        self.embed: Optional[Embedding] = None
        self.lm_head: Optional[Linear] = None  # None on a classification model, which has ``score``
        self.score: Optional[torch.Tensor] = None  # [num_labels, hidden], float32
        self.norm: Optional[torch.Tensor] = None
        self._embed_source: Optional[Weight] = None
        self._biases: dict[int, torch.Tensor] = {}  # q/k/v biases read before their weights
        self.format_bytes = 0  # the checkpoint's weights in the chosen format (see weights_report)

    @classmethod
    def dims_from_config(cls, cfg: Any) -> Dims:
        return Dims.from_config(cfg)

    @classmethod
    def rope_tables(
        cls, cfg: Any, dims: Dims, max_model_len: int, device: torch.device
    ) -> tuple[list[RopeTables], list[int]]:
        """The model's rope tables and which one each layer uses (one for all, here)."""
        return [RopeTables(cfg, dims.head_dim, max_model_len, device)], [0] * dims.num_layers

    # the dimensions the runner and the KV connector read
    @property
    def num_kv_heads(self) -> int:
        return self.dims.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.dims.head_dim

    @property
    def sliding_window(self) -> Optional[int]:
        return self.dims.sliding_window

    @property
    def backend(self) -> str:
        return self.forward_impl.name

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (self.dims.num_layers, num_blocks, block_size, 2 * self.dims.kv_size)

    def attention_builder(self, block_size: int):
        """This forward's attention-metadata builder (engine/models/attention.py)."""
        return self.forward_impl.attention_builder(
            self.device,
            self.act_dtype,
            self.dtype,
            self.dims.head_dim,
            self.dims.sliding_window,
            block_size,
            self.deterministic,
        )

    @property
    def uses_cuda_graphs(self) -> bool:
        return self.forward_impl.cuda_graphs

    # ------------------------------------------------------------------ forward
    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: torch.Tensor, md: AttentionMetadata
    ) -> torch.Tensor:
        """Hidden states before the final norm, one row per input token."""
        return self.forward_impl(self, input_ids, positions, kv_caches, md)

    forward = __call__

    def norm_rows(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm of the given rows of ``forward``'s output, in float32: the decoder's
        last hidden states (transformers' ``hidden_states[-1]``), which a pooling model pools."""
        return torch.nn.functional.rms_norm(hidden.float(), (self.dims.hidden,), self.norm.float(), self.dims.eps)

    def classify_rows(self, hidden: torch.Tensor) -> torch.Tensor:
        """A *ForSequenceClassification model's float32 logits of the given rows of ``forward``'s
        output: its ``score`` head on the normed rows (transformers reads the last token's)."""
        return self.norm_rows(hidden) @ self.score.T

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits of the given rows of ``forward``'s output (the final norm is applied
        here, so rows that are never sampled skip it along with the LM head). A bf16/fp16 head
        rounds its output; the logits that could be a row's maximum are recomputed unrounded."""
        x = self.forward_impl.final_norm(self, hidden)
        logits = self.lm_head(x)
        if logits.dtype != torch.float32:
            logits = logits.float()
            refine_near_max(logits, x, self.lm_head.method.rows)
        cap = self.dims.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap  # Gemma 2's soft-cap

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> None:
        """HF-named tensors (or GGUF blocks) in; every part must be set (weights.py)."""
        router = WeightRouter(self.dims, self._put, self.LAYER_NAMES, self.EXPERTS)
        for name, tensor in weights:
            self.format_bytes += self._format_bytes(name, tensor)
            router.add(name, tensor)
        router.finish()
        for layer in self.layers:
            if layer.moe is not None:
                layer.moe.stack_experts()
        self._finish_embedding()

    @torch.no_grad()
    def init_dummy(self, seed: int = 0) -> None:
        """Random weights for load_format='dummy' (tests and overhead benchmarks): HF-shaped
        tensors through the same path as a checkpoint, the same values on every device."""
        gen = torch.Generator().manual_seed(seed)
        d = self.dims

        def rand(*shape: int) -> torch.Tensor:
            return (torch.randn(shape, generator=gen) * 0.02).to(self.dtype)

        shapes = {
            "self_attn.q_proj.weight": (d.q_size, d.hidden),
            "self_attn.k_proj.weight": (d.kv_size, d.hidden),
            "self_attn.v_proj.weight": (d.kv_size, d.hidden),
            "self_attn.o_proj.weight": (d.hidden, d.q_size),
            "mlp.gate_proj.weight": (d.intermediate, d.hidden),
            "mlp.up_proj.weight": (d.intermediate, d.hidden),
            "mlp.down_proj.weight": (d.hidden, d.intermediate),
        }
        norms = {"input_norm", "post_norm"} | ({"attn_out_norm", "mlp_out_norm"} if d.sandwich_norms else set())
        norm_names = [n for n, target in self.LAYER_NAMES.items() if target in norms]
        tensors = [("embed_tokens.weight", rand(d.vocab_size, d.hidden)), ("norm.weight", torch.ones(d.hidden))]
        if d.num_labels:
            tensors.append(("score.weight", rand(d.num_labels, d.hidden)))
        elif not d.tied:
            tensors.append(("lm_head.weight", rand(d.vocab_size, d.hidden)))
        qk_norms = (
            {"q_norm": d.q_size, "k_norm": d.kv_size}
            if d.qk_norm_whole
            else dict.fromkeys(("q_norm", "k_norm"), d.head_dim)
        )
        for i in range(d.num_layers):
            sparse = self.layers[i].moe is not None
            tensors += [
                (f"layers.{i}.{n}", rand(*s)) for n, s in shapes.items() if not (sparse and n.startswith("mlp."))
            ]
            if sparse:
                tensors += self._dummy_experts(i, rand)
            tensors += [(f"layers.{i}.{n}", torch.ones(d.hidden)) for n in norm_names]
            tensors += [
                (f"layers.{i}.self_attn.{n}.weight", torch.ones(size))
                for n, size in (qk_norms.items() if d.qk_norm else ())
            ]
            tensors += [
                (f"layers.{i}.self_attn.{n}_proj.bias", torch.zeros(s))
                for n, s in (("q", d.q_size), ("k", d.kv_size), ("v", d.kv_size))
                if d.qkv_bias
            ]
        self.load_weights(tensors)

    def _dummy_experts(self, layer: int, rand) -> list[tuple[str, torch.Tensor]]:
        """A sparse layer's router and experts under the family's checkpoint names."""
        d, (prefix, parts) = self.dims, self.EXPERTS
        router = next(name for name, target in self.LAYER_NAMES.items() if target == "router")
        shapes = {
            "gate": (d.moe.intermediate, d.hidden),
            "up": (d.moe.intermediate, d.hidden),
            "down": (d.hidden, d.moe.intermediate),
        }
        return [(f"layers.{layer}.{router}", rand(d.moe.num_experts, d.hidden))] + [
            (f"layers.{layer}.{prefix}{e}.{name}.weight", rand(*shapes[role]))
            for e in range(d.moe.num_experts)
            for name, role in parts.items()
        ]

    def _format_bytes(self, name: str, tensor: Weight) -> int:
        if name.endswith("lm_head.weight") and self.dims.tied:
            return 0
        if name == "score.weight":
            return tensor.numel() * 4  # held in float32
        if isinstance(tensor, GGUFBlocks):
            return tensor.data.numel()
        if self.quantization == "gguf":  # the file's float tensors, as stored
            return tensor.numel() * tensor.element_size()
        if self.quantization == "int8" and name.endswith(("_proj.weight", ".w1.weight", ".w2.weight", ".w3.weight")):
            return tensor.numel() + 8 * tensor.shape[0]  # int8 values, a scale and a sum per channel
        return tensor.numel() * (self.dtype.itemsize if tensor.dim() > 1 else self.act_dtype.itemsize)

    _ROLES = {"qkv": "tall", "gate_up": "tall", "o_proj": "wide", "down": "wide"}

    def _put(self, target: str, layer: Optional[int], value: Weight) -> None:
        act = dict(dtype=self.act_dtype, device=self.device)
        if layer is None:
            if target == "norm":
                self.norm = value.to(**act)
            elif target == "embed":
                self._embed_source = value
            elif target == "score":
                self.score = value.to(device=self.device, dtype=torch.float32)
            else:
                self.lm_head = Linear(self.placement.choose(value, "head"))
            return
        part = self.layers[layer]
        if target == "router":
            part.moe.router = Linear(self.placement.choose(value, "head"))  # as the head: never int8
        elif target.startswith("experts."):  # "experts.<e>.gate_up" / "experts.<e>.down"
            _, expert, kind = target.split(".")
            getattr(part.moe, kind)[int(expert)] = Linear(self.placement.choose(value, self._ROLES[kind]))
        elif target in self._ROLES:
            bias = self._biases.pop(layer, None) if target == "qkv" else None
            setattr(part, target, Linear(self.placement.choose(value, self._ROLES[target]), bias))
        elif target == "qkv_bias":  # it may come before or after its weight
            if part.qkv is None:
                self._biases[layer] = value.to(**act)
            else:
                part.qkv.bias = value.to(**act)
        else:
            setattr(part, target, value.to(**act))

    def _finish_embedding(self) -> None:
        src, self._embed_source = self._embed_source, None
        scale = self.dims.embed_scale
        if scale is not None:  # HF scales by a tensor of the model's dtype (Gemma's sqrt(hidden), rounded)
            scale = torch.tensor(scale, dtype=self.dtype).to(self.act_dtype)
        if self.dims.tied and not self.dims.num_labels:
            self.lm_head = Linear(self.placement.choose(src, "head"))
            self.embed = Embedding(self.lm_head.method, self.act_dtype, scale)
        else:
            self.embed = Embedding(self.placement.choose(src, "embed"), self.act_dtype, scale)

    def resident_bytes(self) -> int:
        """Bytes of every weight the model holds (a tied head counted once)."""
        total = sum(p.nbytes for layer in self.layers for p in layer.linears())
        total += sum(t.numel() * t.element_size() for layer in self.layers for t in layer.tensors())
        total += self.norm.numel() * self.norm.element_size()
        if self.score is not None:
            return total + self.score.numel() * 4 + self.embed.method.nbytes
        total += self.lm_head.nbytes
        return total + (0 if self.dims.tied else self.embed.method.nbytes)

    def weights_report(self) -> str:
        """One line for the load log: resident bytes against the checkpoint's, and the methods."""
        methods = Counter(p.method.format for layer in self.layers for p in layer.linears())
        methods["score head float32" if self.lm_head is None else f"head {self.lm_head.method.format}"] += 1
        resident = self.resident_bytes()
        ratio = resident / self.format_bytes if self.format_bytes else float("nan")
        kinds = ", ".join(f"{n} x {k}" for k, n in methods.items())
        return (
            f"weights: {resident / 2**20:.1f} MiB resident, {ratio:.2f}x the checkpoint's "
            f"{self.format_bytes / 2**20:.1f} MiB in the chosen format ({kinds}; forward {self.backend})"
        )
