"""``deterministic``: each row's arithmetic independent of the rows beside it (batch invariance),
kernel by kernel: the GGUF projections, the dense methods in fixed row groups, and attention
with every row in the decode kernel. The end-to-end check on the default model is
tests/integration/test_deterministic_outputs.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine.config import EngineArgs
from engine.kernels import bf16_gemv, onednn_linear, quant
from engine.kernels.quant_blocks import random_blocks
from engine.models.attention import TorchAttentionBuilder, paged_attention
from engine.models.linear import (
    BF16GemvLinear,
    DenseGemvHead,
    FixedRowGroups,
    InputMajorLinear,
    OneDNNLinear,
    TorchLinear,
)
from tests.unit.test_attention import _reference

CPU = torch.device("cpu")


def assert_rows_batch_invariant(apply, x: torch.Tensor) -> None:
    """Each row of ``apply(x)`` equals, bit for bit, that row alone and in every shorter or shifted batch."""
    whole = apply(x)
    for j in range(0, x.shape[0], 5):
        assert torch.equal(apply(x[j : j + 1])[0], whole[j]), f"row {j} alone"
    for start, end in [(0, 2), (0, 3), (1, 5), (3, 12), (2, 17), (5, 64), (0, x.shape[0] - 1)]:
        assert torch.equal(apply(x[start:end]), whole[start:end]), f"rows [{start}, {end})"


@pytest.mark.skipif(quant.lib is None, reason="the quantized kernels are not built")
@pytest.mark.parametrize(
    "qtype,n,k",
    [
        (quant.Q4_1, 1536, 576),
        (quant.Q4_1, 576, 1536),
        (quant.Q4_0, 100, 256),
        (quant.Q8_0, 49152, 576),  # the Q8_0 head is past the large-W threshold
        (quant.Q4_K, 200, 512),
        (quant.Q6_K, 96, 768),
    ],
)
def test_quantized_rows_are_the_same_alone_and_in_any_batch(qtype, n, k):
    """Alone and in small batches the rows run a GEMV with the GEMM's order of sums (AVX-512 VNNI),
    in larger ones the GEMM itself: bit for bit the same rows either way."""
    gen = torch.Generator().manual_seed(n)
    w = quant.QuantizedLinear(torch.from_numpy(random_blocks(qtype, n, k, np.random.default_rng(n))), qtype, n, k)
    x = torch.randn(70, k, generator=gen)
    assert_rows_batch_invariant(w.matmul_row_invariant, x)
    # the same products as the default path's GEMV (one row at a time: int8 activations there on
    # every CPU, where a 70-row default call may dequantize W for a float GEMM instead, as the
    # K-quants do on AVX2), differing from it only in the order of sums
    # (float32 sums of hundreds of products whose outputs reach thousands: an output that nearly
    # cancels keeps an absolute error at the scale of the largest ones, ~1e-7 of them per term)
    one_by_one = torch.cat([w.matmul(x[i : i + 1]) for i in range(x.shape[0])])
    scale = float(one_by_one.abs().max())
    torch.testing.assert_close(w.matmul_row_invariant(x), one_by_one, rtol=1e-4, atol=1e-6 * scale)


def dense_methods() -> list:
    methods = [
        ("input-major fp32", lambda w: InputMajorLinear(w, torch.float32), torch.float32),
        ("torch fp32", lambda w: TorchLinear(w, torch.float32, CPU), torch.float32),
    ]
    if onednn_linear.supports(CPU, torch.bfloat16):
        methods += [
            ("oneDNN bf16", OneDNNLinear, torch.bfloat16),
            ("bf16 GEMV head", lambda w: DenseGemvHead(w, CPU), torch.bfloat16),
        ]
    if bf16_gemv.available():
        methods.append(("bf16 GEMV layout", BF16GemvLinear, torch.float32))
    return methods


@pytest.mark.parametrize("name,make,dtype", dense_methods(), ids=[m[0] for m in dense_methods()])
def test_dense_methods_in_fixed_row_groups_are_batch_invariant(name, make, dtype):
    gen = torch.Generator().manual_seed(1)
    method = FixedRowGroups(make(torch.randn(1536, 576, generator=gen) * 0.05))
    x = torch.randn(70, 576, generator=gen).to(dtype)
    assert_rows_batch_invariant(method.apply, x)
    assert method.apply(x).shape == (70, 1536)


def step_attention(
    builder: TorchAttentionBuilder,
    qkv: torch.Tensor,
    cache: torch.Tensor,
    reqs: list,
    counts: list[int],
    dims: tuple[int, int, int],
) -> torch.Tensor:
    rows = builder.build(reqs, counts)
    heads, kv_heads, d = dims
    return paged_attention(qkv, cache, rows.md, heads, kv_heads, d, d**-0.5, sliding=False)


@pytest.mark.skipif(
    not TorchAttentionBuilder(CPU, torch.float32, torch.float32, 64, None, 16).decode_kernel,
    reason="no C decode-attention kernel here",
)
def test_attention_rows_are_the_same_with_a_cached_prefix_in_chunks_and_beside_other_requests():
    heads, kv_heads, d, bs, n = 6, 2, 64, 16, 40
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=gen)
    other = torch.randn(23, qkv.shape[1], generator=gen)
    builder = TorchAttentionBuilder(CPU, torch.float32, torch.float32, d, None, bs, deterministic=True)

    def run(chunks: list[int], beside: bool) -> torch.Tensor:
        """The prompt in ``chunks`` (a cached prefix is a first chunk computed earlier), each step
        optionally beside another request's 23-token prompt; the prompt's attention rows."""
        cache = torch.zeros(8, bs, 2 * kv_heads * d)
        req = SimpleNamespace(num_computed_tokens=0, all_token_ids=list(range(n)), block_ids=[1, 2, 3])
        out, p0 = [], 0
        for c in chunks:
            peer = SimpleNamespace(num_computed_tokens=0, all_token_ids=list(range(23)), block_ids=[5, 6])
            reqs, counts = ([peer, req], [23, c]) if beside else ([req], [c])
            rows = torch.cat([other, qkv[p0 : p0 + c]]) if beside else qkv[p0 : p0 + c]
            out.append(step_attention(builder, rows, cache, reqs, counts, (heads, kv_heads, d))[-c:])
            req.num_computed_tokens = p0 = p0 + c
        return torch.cat(out)

    whole = run([n], beside=False)
    torch.testing.assert_close(whole.double(), _reference(qkv, heads, kv_heads, d, d**-0.5), rtol=1e-5, atol=1e-5)
    for chunks, beside in [([16, 24], False), ([16, 24], True), ([5, 30, 5], True), ([n], True)]:
        assert torch.equal(run(chunks, beside), whole), (chunks, beside)


def test_deterministic_is_a_flag_and_is_refused_with_a_compiled_forward(tiny_model_dir):
    from tests.helpers.cli_utils import serve_parser

    assert serve_parser().parse_args(["--deterministic"]).deterministic is True
    assert serve_parser().parse_args([]).deterministic is False
    args = dict(model=tiny_model_dir, load_format="dummy", device="cpu")
    assert EngineArgs(**args, deterministic=True).create_engine_config().model_config.deterministic
    with pytest.raises(ValueError, match="^deterministic: runs the eager forward"):
        EngineArgs(**args, deterministic=True, compilation_config=1).create_engine_config()
