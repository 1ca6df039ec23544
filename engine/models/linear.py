"""Linear methods: each projection holds one weight, in the one form its forward reads.

vLLM's shape at nano-vllm's size. A ``Linear`` is a ``LinearMethod`` plus an optional bias;
``choose`` picks the method once, at load, from the device, the dtypes and the quantization,
and the method holds the only copy of the weight (the source tensor is dropped). Nothing
switches on the weight's type at call time. Each choice below was measured per call on the
default model's shapes, one thread (benchmarks/RESULTS.md, "Kernel choices"):

- ``InputMajorLinear`` (float32 on CPU, ``x @ W`` on ``[in, out]``): MKL's GEMV is faster that
  way for the tall q/k/v and gate/up matrices and no slower at batch 64; the LM head gains at
  1-2 rows and is on par beyond, so it is held input-major too (one copy: a tied embedding
  reads its columns).
- ``OneDNNLinear`` (bf16 with native bf16 GEMMs): the weight packed once in oneDNN's layout
  (engine/kernels/onednn_linear.py) spares a reorder of the weight at every call.
  The packed tensor is opaque, so no row of it can be read back, and the LM head's rows are
  needed (the tied embedding's lookup, the bf16 logit refinement of half_logits.py): the head
  stays dense (slower than packed, but the model held both copies before), and
  ``DenseGemvHead`` multiplies it at decode sizes with the C GEMV on those dense rows, faster
  than ``F.linear`` there. Tried and not taken: the head as a ``BF16GemvLinear`` (rows
  readable; the kernel at 1-4 rows): its batch loss outweighed its single-stream gain.
- ``BF16GemvLinear`` (bf16 on a CPU without native bf16 GEMMs, e.g. AVX2 only): the bf16
  weight in the C GEMV kernel's blocked layout (engine/kernels/bf16_gemv.py), half the bytes
  of a float32 copy (which the model held beside it before). Steps of up to
  ``bf16_gemv.MAX_ROWS`` rows run the kernel. Larger steps run it on groups of that many rows
  while the weight fits in cache (cheaper than unpacking it to float32 for MKL per call), and
  unpack a 1024-row slice at a time for MKL when it does not (the LM head, where the groups
  cost more). One copy costs some speed in the layers' GEMMs at batch 64 on such a CPU, against
  a float32 copy beside it, and halves the bytes every decode reads.
- ``GGUFLinear``: the GGUF file's own blocks (engine/kernels/quant.py, the types in
  ``quant.SUPPORTED_TYPES``: Q4_0, Q4_1, Q8_0 and the K-quants Q4_K, Q5_K, Q6_K), int8 dot
  products on activations quantized per block; ``QuantizedLinear`` itself takes batches (a
  tiled int8 GEMM on AVX-512 VNNI, and on AVX2 for the 32-weight blocks; elsewhere one pass
  over W per 8 rows up to 64 rows, dequantize + GEMM beyond).
- ``Int8Method`` (``quantization="int8"``): dynamic W8A8 (engine/kernels/int8_linear.py), the
  projections quantized once at load per output channel; the embedding and LM head stay in
  the model dtype.
- ``TorchLinear``: ``F.linear`` on a dense ``[out, in]`` weight: CUDA (cuBLAS's layout, the
  Triton backend) and every other case.

The methods whose weight only a C kernel multiplies (``GGUFLinear``, ``Int8Method``,
``BF16GemvLinear``) are ``CustomOp``s (engine/models/custom_op.py): eagerly they call the kernel
raw; a projection inside the compiled forward's graphs calls it as its registered torch op
(engine/kernels/ops.py), so a compiled model keeps the same methods, GGUF blocks included.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.nn.functional as F

from engine.kernels import bf16_gemv, onednn_linear, ops, quant, quant_recode
from engine.models.custom_op import CustomOp

logger = logging.getLogger(__name__)

_GGML_NAMES = getattr(quant, "TYPE_NAMES", {})


def ggml_type_name(qtype: int) -> str:
    try:
        import gguf

        return gguf.GGMLQuantizationType(qtype).name
    except (ImportError, ValueError):
        return _GGML_NAMES.get(qtype, f"GGML type {qtype}")


class GGUFBlocks:
    """A GGUF tensor as the file holds it: ``[out, row_bytes]`` uint8 blocks of ``qtype``."""

    __slots__ = ("data", "qtype", "out_features", "in_features")

    def __init__(self, data: torch.Tensor, qtype: int, out_features: int, in_features: int) -> None:
        self.data, self.qtype, self.out_features, self.in_features = data, qtype, out_features, in_features

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    def permute_rows(self, index: torch.Tensor) -> "GGUFBlocks":
        """Rows in another order: exact, since each row's blocks are independent of the others."""
        return GGUFBlocks(self.data[index], self.qtype, self.out_features, self.in_features)

    def dequantize(self) -> torch.Tensor:
        import gguf

        values = gguf.quants.dequantize(self.data.numpy(), gguf.GGMLQuantizationType(self.qtype))
        return torch.from_numpy(values.reshape(self.out_features, self.in_features).copy())

    def recoded(self) -> "GGUFBlocks":
        """A type without a kernel as the kernel type that holds its values exactly
        (engine/kernels/quant_recode.py); any other type as it is."""
        if self.qtype not in quant_recode.RECODED:
            return self
        target, recode = quant_recode.RECODED[self.qtype]
        return GGUFBlocks(recode(self.data), target, self.out_features, self.in_features)

    @staticmethod
    def cat(parts: list["GGUFBlocks"]) -> "GGUFBlocks":
        """Stacked along the output rows (fusing q/k/v or gate/up): all parts of one type."""
        return GGUFBlocks(
            torch.cat([p.data for p in parts]), parts[0].qtype, sum(p.out_features for p in parts), parts[0].in_features
        )


class GGUFParts:
    """One fused projection (q/k/v, gate/up) whose parts the file holds in different GGUF types:
    llama.cpp's mixes keep some tensors in more bits (Q4_K_M: ``attn_v`` and some ``ffn_down`` in
    Q6_K beside Q4_K), and one block type cannot hold both. Kept apart, each on its own blocks
    (``ConcatLinear``); dequantized into one float32 matrix they held 7x the bytes of Q4_K."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[GGUFBlocks]) -> None:
        self.parts = parts

    @property
    def shape(self) -> tuple[int, int]:
        return sum(p.out_features for p in self.parts), self.parts[0].in_features

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts])


class LinearMethod:
    """``apply(x)`` is ``x @ W.T``; ``rows(ids)`` the dense rows ``W[ids]`` (embedding lookup)."""

    out_features: int
    in_features: int
    format: str  # what the bytes hold, for the load-time report ("bf16", "Q4_1", ...)

    def apply(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x @ W.T + bias``; the bias is added before a half-precision output is rounded."""
        raise NotImplementedError

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} cannot read rows back")

    @property
    def nbytes(self) -> int:
        raise NotImplementedError


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


class TorchLinear(LinearMethod):
    def __init__(self, weight: torch.Tensor, dtype: torch.dtype, device: torch.device) -> None:
        self.weight = weight.to(device=device, dtype=dtype).contiguous()
        self.out_features, self.in_features = self.weight.shape
        self.format = _dtype_name(dtype)

    def apply(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return F.linear(x, self.weight, bias)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)

    @property
    def nbytes(self) -> int:
        return _tensor_bytes(self.weight)


class InputMajorLinear(LinearMethod):
    def __init__(self, weight: torch.Tensor, dtype: torch.dtype) -> None:
        self.weight_t = weight.to(dtype).t().contiguous()  # [in, out]
        self.in_features, self.out_features = self.weight_t.shape
        self.format = _dtype_name(dtype)

    def apply(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return torch.mm(x, self.weight_t) if bias is None else torch.addmm(bias, x, self.weight_t)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight_t.index_select(1, ids).t().contiguous()

    @property
    def nbytes(self) -> int:
        return _tensor_bytes(self.weight_t)


class OneDNNLinear(LinearMethod):
    def __init__(self, weight: torch.Tensor) -> None:
        self.packed = onednn_linear.PackedLinear(weight.to(torch.bfloat16))
        self.out_features, self.in_features = self.packed.out_features, self.packed.in_features
        self.format = "bf16 (oneDNN layout)"

    def apply(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.packed.matmul(x, bias)

    @property
    def nbytes(self) -> int:
        return self.out_features * self.in_features * 2  # opaque: its bytes are the bf16 weight's


def _in_row_groups(x: torch.Tensor, rows: int, fn) -> torch.Tensor:
    if x.shape[0] <= rows:
        return fn(x)
    return torch.cat([fn(x[s : s + rows]) for s in range(0, x.shape[0], rows)])


_UNPACK_ROWS = 1024
_IN_CACHE_BYTES = 8 << 20


class DenseGemvHead(TorchLinear):
    """The LM head on a CPU with native bf16 GEMMs: one dense bf16 ``[vocab, hidden]`` matrix,
    whose rows the tied embedding and the logit refinement read, multiplied by the C GEMV
    (``bf16_gemv.dense_matmul``, exact float32 logits, so no refinement) at decode sizes and by
    ``F.linear`` beyond: at one row it is less than half ``F.linear``'s time on the 49152 x 576
    head (benchmarks/RESULTS.md, "Kernel choices"), close to the packed GEMV layout,
    whose rows a GEMM cannot read. The kernel is one thread, so it runs only while torch does
    (the default on a 2-core host)."""

    def __init__(self, weight: torch.Tensor, device: torch.device) -> None:
        super().__init__(weight, torch.bfloat16, device)
        self.format = "bf16 (GEMV on the dense rows)"

    def apply(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] <= bf16_gemv.MAX_ROWS and torch.get_num_threads() == 1:
            y = bf16_gemv.dense_matmul(self.weight, x)
            return y if bias is None else y.add_(bias)
        return F.linear(x, self.weight, bias)


class KernelLinear(CustomOp, LinearMethod):
    """A method whose weight only a C kernel multiplies: ``forward_cpu(x, bias)`` calls it raw,
    ``forward_op(x, bias)`` through its torch op (inside a compiled graph, ``in_graph``)."""

    OP_IN_GRAPH = True

    def __init__(self, in_graph: bool) -> None:
        super().__init__(torch.device("cpu"), in_graph)

    def apply(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self._forward_method(x, bias)


def _add_bias(y: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return y if bias is None else y.add_(bias)  # float32 output: nothing is rounded before the add


class BF16GemvLinear(KernelLinear):
    def __init__(self, weight: torch.Tensor, in_graph: bool = False) -> None:
        super().__init__(in_graph)
        self.packed = bf16_gemv.PackedBF16(weight)
        self.out_features, self.in_features = self.packed.out_features, self.packed.in_features
        self.format = "bf16 (GEMV layout)"
        self._rb, self._cb = bf16_gemv._ROW_BLOCK, bf16_gemv._COL_BLOCK

    def forward_cpu(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return _add_bias(self._apply(x, self.packed.matmul), bias)

    def forward_op(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return _add_bias(self._apply(x, self._gemv_op), bias)

    def _gemv_op(self, x: torch.Tensor) -> torch.Tensor:
        return ops.bf16_gemv_packed(x, self.packed.data)

    def _apply(self, x: torch.Tensor, gemv) -> torch.Tensor:
        """``gemv``: the kernel on up to ``bf16_gemv.MAX_ROWS`` rows (raw or as the op)."""
        if x.shape[0] <= bf16_gemv.MAX_ROWS:
            return gemv(x)
        if self.nbytes <= _IN_CACHE_BYTES:  # re-read from cache by each group of rows
            return _in_row_groups(x, bf16_gemv.MAX_ROWS, gemv)
        x = x.float()
        out = x.new_empty(x.shape[0], self.out_features)
        for start in range(0, self.out_features, _UNPACK_ROWS):  # a cache-sized slice at a time
            end = min(start + _UNPACK_ROWS, self.out_features)
            w = (
                self._blocks()[start // self._rb : end // self._rb]
                .transpose(1, 2)
                .reshape(end - start, self.in_features)
            )
            out[:, start:end] = torch.mm(x, w.float().t())
        return out

    def _blocks(self) -> torch.Tensor:
        """The layout as a view: ``[out / rb, in / cb, rb, cb]``."""
        return self.packed.data.view(self.out_features // self._rb, self.in_features // self._cb, self._rb, self._cb)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self._blocks()[ids // self._rb, :, ids % self._rb, :].reshape(-1, self.in_features).float()

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes


class GGUFLinear(KernelLinear):
    """``row_invariant`` (``deterministic``): one kernel path at every row count, so a row's
    result never depends on the batch (``QuantizedLinear.matmul_row_invariant``)."""

    def __init__(self, blocks: GGUFBlocks, row_invariant: bool = False, in_graph: bool = False) -> None:
        super().__init__(in_graph)
        self.q = quant.QuantizedLinear(blocks.data, blocks.qtype, blocks.out_features, blocks.in_features)
        self.out_features, self.in_features = blocks.out_features, blocks.in_features
        self.format = ggml_type_name(blocks.qtype)
        self.row_invariant = row_invariant
        self._matmul = self.q.matmul_row_invariant if row_invariant else self.q.matmul

    def forward_cpu(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return _add_bias(self._matmul(x), bias)

    def forward_op(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        q = self.q
        return _add_bias(ops.quant_matmul(x, q.data, q.qtype, q.in_features, self.row_invariant), bias)

    def share_blocks(self, data: torch.Tensor) -> None:
        """Hold ``data``, the same blocks elsewhere (a view into a stack of experts,
        engine/models/moe_gguf.py), in place of its own copy: one copy resident."""
        self.q = quant.QuantizedLinear(data, self.q.qtype, self.out_features, self.in_features)
        self._matmul = self.q.matmul_row_invariant if self.row_invariant else self.q.matmul

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        picked = self.q.data.index_select(0, ids)
        return quant.QuantizedLinear(picked, self.q.qtype, ids.numel(), self.in_features).dequantize()

    @property
    def nbytes(self) -> int:
        return self.q.nbytes


class ConcatLinear(LinearMethod):
    """A fused projection as its parts' methods side by side (``GGUFParts``): each part's output
    columns in order, the bias added once."""

    def __init__(self, methods: list[LinearMethod]) -> None:
        self.methods = methods
        self.out_features = sum(m.out_features for m in methods)
        self.in_features = methods[0].in_features
        self.format = "+".join(dict.fromkeys(m.format for m in methods))

    def apply(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        y = torch.cat([m.apply(x) for m in self.methods], dim=1)
        return y if bias is None else y.add_(bias)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.cat([m.rows(ids) for m in self.methods], dim=1)

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.methods)


class FixedRowGroups(LinearMethod):
    """A dense method run on groups of exactly ``ROW_GROUP`` rows, the last padded with zeros
    (``deterministic``). MKL, oneDNN and the C GEMV pick their kernels and blockings by the row
    count, so a row's result changed with the batch it came in; at one fixed shape every row
    goes through the same arithmetic whatever the other rows hold (the suite checks it per
    method). Costs a padded group for a single-row decode."""

    ROW_GROUP = 8

    def __init__(self, method: LinearMethod) -> None:
        self.method = method
        self.out_features, self.in_features, self.format = method.out_features, method.in_features, method.format

    def apply(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        rows, g = x.shape[0], self.ROW_GROUP
        if rows % g:
            x = torch.cat([x, x.new_zeros(g - rows % g, x.shape[1])])
        return torch.cat([self.method.apply(x[s : s + g], bias) for s in range(0, x.shape[0], g)])[:rows]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.method.rows(ids)

    @property
    def nbytes(self) -> int:
        return self.method.nbytes


def _has_kernel(blocks: GGUFBlocks) -> bool:
    """Whether the quantized kernels run this tensor (its type, and whole blocks per row)."""
    if blocks.qtype not in quant.SUPPORTED_TYPES or quant.lib is None:
        return False
    per_block = quant.block_weights(blocks.qtype) if hasattr(quant, "block_weights") else quant.BLOCK
    return per_block > 0 and blocks.in_features % per_block == 0


class Linear:
    """One projection: its method and, for Qwen2's q/k/v, a bias added after it; with LoRA
    (``enable_lora``), the adapters' low-rank updates added to its output, whatever the method
    (engine/lora/layer.py ``LoRAWeights``, set by engine/lora/manager.py)."""

    __slots__ = ("method", "bias", "lora")

    def __init__(self, method: LinearMethod, bias: Optional[torch.Tensor] = None) -> None:
        self.method, self.bias = method, bias
        self.lora = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.method.apply(x, self.bias)
        return y if self.lora is None else self.lora.add_(x, y)

    @property
    def nbytes(self) -> int:
        return self.method.nbytes + (0 if self.bias is None else _tensor_bytes(self.bias))


class Placement:
    """What ``choose`` decides from, fixed for the model at load: the device, the model dtype,
    the dtype the activations run in, whether the forward is Triton's (``dense_only``: its
    kernels take dense weights) or compiled (``compiled``: the layers' projections run inside
    torch.compile graphs, their kernels as torch ops), the quantization (None, "gguf" or
    "int8"), and ``deterministic`` (each row's result independent of the batch:
    ``GGUFLinear``'s row-invariant path, ``FixedRowGroups``)."""

    _IN_GRAPH_ROLES = ("tall", "wide")  # the compiled blocks' projections; the head and embedding run eager

    def __init__(
        self,
        device: torch.device,
        dtype: torch.dtype,
        act_dtype: torch.dtype,
        dense_only: bool,
        quantization: Optional[str],
        deterministic: bool = False,
        compiled: bool = False,
    ) -> None:
        self.device, self.dtype, self.act_dtype = device, dtype, act_dtype
        self.dense_only, self.quantization, self.deterministic = dense_only, quantization, deterministic
        self.compiled = compiled
        self._warned: set[int] = set()

    def choose(self, weight: torch.Tensor | GGUFBlocks | GGUFParts, role: str) -> LinearMethod:
        """``role``: "tall" (q/k/v, gate/up), "wide" (o_proj, down), "head" (the LM head, whose
        rows a tied embedding reads) or "embed" (an untied embedding)."""
        in_graph = self.compiled and role in self._IN_GRAPH_ROLES
        if isinstance(weight, GGUFBlocks) and _has_kernel(weight) and not self.dense_only:
            return GGUFLinear(weight, row_invariant=self.deterministic, in_graph=in_graph)
        if isinstance(weight, GGUFParts) and all(map(_has_kernel, weight.parts)) and not self.dense_only:
            return ConcatLinear(
                [GGUFLinear(p, row_invariant=self.deterministic, in_graph=in_graph) for p in weight.parts]
            )
        method = self._choose_dense(weight, role, in_graph)
        return FixedRowGroups(method) if self.deterministic else method

    def _choose_dense(self, weight: torch.Tensor | GGUFBlocks | GGUFParts, role: str, in_graph: bool) -> LinearMethod:
        if isinstance(weight, (GGUFBlocks, GGUFParts)):
            for part in weight.parts if isinstance(weight, GGUFParts) else [weight]:
                if part.qtype not in self._warned:
                    self._warned.add(part.qtype)
                    logger.warning(
                        "GGUF %s weights have no quantized kernel here: dequantized once at load",
                        ggml_type_name(part.qtype),
                    )
            weight = weight.dequantize()
        cpu = self.device.type == "cpu"
        if role == "embed":  # an untied embedding: only rows are read, in the model dtype
            return TorchLinear(weight, self.dtype if cpu else self.act_dtype, self.device)
        if self.quantization == "int8" and cpu and role != "head":
            return Int8Method(weight, in_graph)
        if not cpu or self.dense_only:
            return TorchLinear(weight, self.act_dtype, self.device)
        if (
            self.act_dtype == torch.float32
            and self.dtype == torch.bfloat16
            and bf16_gemv.available()
            and bf16_gemv.fits(*weight.shape)
        ):
            return BF16GemvLinear(weight, in_graph)
        if self.act_dtype == torch.float32 and (role in ("tall", "head")):
            return InputMajorLinear(weight.to(self.dtype), self.act_dtype)
        if role != "head" and onednn_linear.supports(self.device, self.act_dtype):
            return OneDNNLinear(weight)
        if (
            role == "head"
            and self.act_dtype == torch.bfloat16
            and bf16_gemv.available()
            and bf16_gemv.fits(*weight.shape)
        ):
            return DenseGemvHead(weight, self.device)
        return TorchLinear(weight.to(self.dtype), self.act_dtype, self.device)


class Int8Method(KernelLinear):
    """Dynamic W8A8 (engine/kernels/int8_linear.py): per-channel weight scales, per-token
    activation scales, quantized once at load from the checkpoint's float weight."""

    def __init__(self, weight: torch.Tensor, in_graph: bool = False) -> None:
        from engine.kernels.int8_linear import Int8Linear

        super().__init__(in_graph)
        self.q = Int8Linear.from_float(weight)
        self.out_features, self.in_features = weight.shape
        self.format = "int8 (W8A8)"

    def forward_cpu(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return _add_bias(self.q.matmul(x), bias)

    def forward_op(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        q = self.q
        return _add_bias(ops.int8_matmul(x, q.qweight, q.scale, q.wsum), bias)

    @property
    def nbytes(self) -> int:
        return int(self.q.nbytes)
