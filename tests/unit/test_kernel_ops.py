"""The C kernels as torch ops (engine/kernels/ops.py) and the CustomOps that choose between them
(engine/models/custom_op.py, activation_ops.py, linear.py): every op passes
``torch.library.opcheck`` (its schema, its fake implementation against the real one, and
tracing), returns what its raw cffi call returns, and each CustomOp picks the raw call eagerly,
the op inside a graph and torch where no kernel runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.kernels import activation, bf16_gemv, int8_linear, ops, paged_attention, quant, quant_moe
from engine.kernels.quant_blocks import random_blocks
from engine.models import linear
from engine.models.activation_ops import RMSNorm, Rotary, SiluAndMul

pytestmark = pytest.mark.skipif(not activation.available(), reason="the CPU kernels need AVX2 and FMA")

# opcheck's tests short of autograd: no kernel registers a backward (inference only)
_CHECKS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


def _check(op, args, want: torch.Tensor | None = None) -> None:
    """opcheck on ``args``; then the op's output equals ``want`` (the raw call's) when given."""
    torch.library.opcheck(op, args, test_utils=_CHECKS)
    if want is not None:
        torch.testing.assert_close(op(*args), want, rtol=0, atol=0)


def _blocks(qtype: int, out_features: int, in_features: int) -> torch.Tensor:
    return torch.from_numpy(random_blocks(qtype, out_features, in_features, np.random.default_rng(qtype)))


def test_activation_ops_are_the_kernels():
    x, w, h = torch.randn(5, 64), torch.randn(64), torch.randn(5, 64)
    _check(ops.rms_norm, (x, w, 1e-6), activation.rms_norm(x, w, 1e-6))
    _check(ops.fused_add_rms_norm, (x, h.clone(), w, 1e-6))  # opcheck runs it several times: h changes
    want_h = h.clone()
    want = activation.rms_norm(x, w, 1e-6, want_h)
    got_h = h.clone()
    torch.testing.assert_close(ops.fused_add_rms_norm(x, got_h, w, 1e-6), want, rtol=0, atol=0)
    torch.testing.assert_close(got_h, want_h, rtol=0, atol=0)  # the residual is updated in place
    assert not torch.equal(got_h, h)
    gu = torch.randn(5, 128)
    _check(ops.silu_and_mul, (gu,), activation.silu_and_mul(gu))


def test_rotary_op_rotates_in_place_as_the_kernel_does():
    heads, head_dim, n = 3, 16, 4
    cos_sin = torch.randn(32, head_dim // 2, 2)
    positions = torch.tensor([0, 5, 31, 7])
    qkv = torch.randn(n, (heads + 1) * head_dim)
    torch.library.opcheck(ops.rotary_, (qkv.clone(), positions, cos_sin, heads, head_dim), test_utils=_CHECKS)
    got, want = qkv.clone(), activation.rotary_(qkv.clone(), positions, cos_sin, heads, head_dim)
    assert ops.rotary_(got, positions, cos_sin, heads, head_dim) is None
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize(
    "qtype,in_features", [(quant.Q4_0, 64), (quant.Q4_1, 64), (quant.Q8_0, 64), (quant.Q4_K, 256), (quant.Q6_K, 256)]
)
@pytest.mark.parametrize("rows", [1, 5, 70])  # a GEMV pass, the tiled GEMM or passes, beyond GEMV_ROWS
def test_quant_ops_are_the_kernels(qtype, in_features, rows):
    data = _blocks(qtype, 32, in_features)
    q = quant.QuantizedLinear(data, qtype, 32, in_features)
    x = torch.randn(rows, in_features)
    _check(ops.quant_matmul, (x, data, qtype, in_features, False), q.matmul(x))
    _check(ops.quant_matmul, (x, data, qtype, in_features, True), q.matmul_row_invariant(x))
    _check(ops.quant_dequantize, (data, qtype, in_features), q.dequantize())


@pytest.mark.parametrize("qtype,in_features", [(quant.Q8_0, 64), (quant.Q4_K, 256)])
def test_quant_moe_op_is_the_kernel(qtype, in_features):
    data = _blocks(qtype, 3 * 32, in_features).view(3, 32, -1)  # three different experts
    x = torch.randn(4, in_features)
    rows, experts = torch.tensor([0, 0, 1, 3, 2]), torch.tensor([2, 0, 2, 2, 1])
    want = quant_moe.QuantizedExperts(data, qtype, 32, in_features).matmul(x, rows, experts)
    _check(ops.quant_moe_matmul, (x, rows, experts, data, qtype, in_features), want)


def test_int8_op_is_the_kernel():
    q = int8_linear.Int8Linear.from_float(torch.randn(24, 64))
    for rows in (3, int8_linear.MAX_ROWS + 1):  # the C kernel, then torch's int8 GEMM
        x = torch.randn(rows, 64)
        _check(ops.int8_matmul, (x, q.qweight, q.scale, q.wsum), q.matmul(x))


def test_bf16_gemv_ops_are_the_kernels():
    w = torch.randn(16, 64).to(torch.bfloat16)
    packed = bf16_gemv.PackedBF16(w)
    x = torch.randn(3, 64)
    _check(ops.bf16_gemv_packed, (x, packed.data), packed.matmul(x))
    _check(ops.bf16_gemv_dense, (x, w), bf16_gemv.dense_matmul(w, x))


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (5, 30.0)])
def test_paged_decode_attention_op_is_the_kernel(window, softcap):
    heads, kv_heads, head_dim, blocks, block_size = 4, 2, 16, 6, 4
    q = torch.randn(2, heads * head_dim)
    cache = torch.randn(blocks, block_size, 2 * kv_heads * head_dim)
    table, lens = torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([11, 6])
    args = (q, cache, table, lens, heads, kv_heads, head_dim, 0.25, window, softcap, True)
    want = paged_attention.decode_attention(
        q, cache, table, lens, heads, kv_heads, head_dim, 0.25, window or None, True, softcap or None
    )
    _check(ops.paged_decode_attention, args, want)


def test_a_graph_with_the_ops_compiles_without_a_break():
    from torch._dynamo.testing import CompileCounterWithBackend

    data = _blocks(quant.Q4_1, 32, 64)
    w = torch.randn(64)

    def block(x):
        return ops.silu_and_mul(ops.quant_matmul(ops.rms_norm(x, w, 1e-6), data, quant.Q4_1, 64, False))

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(block, backend=counter, fullgraph=True, dynamic=True)
    for rows in (2, 3, 9):  # (one row would be a graph of its own: size 1 is specialised)
        x = torch.randn(rows, 64)
        torch.testing.assert_close(compiled(x), block(x), rtol=0, atol=0)
    assert counter.frame_count == 1


def test_custom_ops_choose_once_raw_eagerly_the_op_in_a_graph_torch_without_a_kernel():
    cpu = torch.device("cpu")
    eager, in_graph, no_kernel = RMSNorm(cpu, True), RMSNorm(cpu, True, in_graph=True), RMSNorm(cpu, False)
    assert eager._forward_method == eager.forward_cpu
    assert in_graph._forward_method == in_graph.forward_op
    assert no_kernel._forward_method == no_kernel.forward_native
    assert RMSNorm(torch.device("meta"), True)._forward_method.__func__ is RMSNorm.forward_native
    x, w = torch.randn(3, 64), torch.randn(64)
    for op in (eager, in_graph, no_kernel):
        torch.testing.assert_close(op(x, w, 1e-6), F.rms_norm(x, (64,), w, 1e-6))
        h = torch.randn(3, 64)
        want = F.rms_norm(h + x, (64,), w, 1e-6)
        torch.testing.assert_close(op(x, w, 1e-6, residual=h), want)


@pytest.mark.parametrize("kernel", [True, False])
def test_silu_and_rotary_agree_on_every_path(kernel):
    cpu, heads, head_dim = torch.device("cpu"), 2, 16
    gu, cos_sin = torch.randn(4, 64), torch.randn(16, head_dim // 2, 2)
    positions, qkv = torch.tensor([0, 3, 15, 2]), torch.randn(4, 3 * head_dim)
    want_silu = F.silu(gu[:, :32]) * gu[:, 32:]
    want_rot = Rotary(cpu, False)(qkv.clone(), positions, cos_sin, heads, head_dim)
    for in_graph in (False, True):
        torch.testing.assert_close(SiluAndMul(cpu, kernel, in_graph)(gu), want_silu)
        got = Rotary(cpu, kernel, in_graph)(qkv.clone(), positions, cos_sin, heads, head_dim)
        torch.testing.assert_close(got, want_rot)
    assert not torch.equal(want_rot[:, : heads * head_dim], qkv[:, : heads * head_dim])  # it rotated
    torch.testing.assert_close(want_rot[:, heads * head_dim :], qkv[:, heads * head_dim :], rtol=0, atol=0)


def test_placement_puts_only_the_compiled_blocks_projections_on_the_ops():
    data = _blocks(quant.Q4_1, 32, 64)
    blocks = linear.GGUFBlocks(data, quant.Q4_1, 32, 64)
    place = linear.Placement(torch.device("cpu"), torch.float32, torch.float32, False, "gguf", compiled=True)
    tall, head = place.choose(blocks, "tall"), place.choose(blocks, "head")
    assert tall._forward_method == tall.forward_op and head._forward_method == head.forward_cpu
    x, bias = torch.randn(2, 64), torch.randn(32)
    torch.testing.assert_close(tall.apply(x, bias), head.apply(x, bias), rtol=0, atol=0)
