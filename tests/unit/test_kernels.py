"""The CPU kernels against plain math: the bf16 GEMV (csrc/cpu/gemv_bf16.c) against float32 on the
same bf16 values, paged decode attention (csrc/cpu/paged_attention.c) against dense attention,
RMSNorm, SiLU-and-mul and RoPE (csrc/cpu/activation.c) against torch and float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import activation, bf16_gemv
from engine.kernels.bf16_gemv import PackedBF16
from engine.kernels.paged_attention import decode_attention

pytestmark = pytest.mark.skipif(not bf16_gemv.available(), reason="needs an x86-64 CPU with AVX2 and FMA")


def _multiply(layout: str, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The GEMV on the packed layout, or on the dense row-major bf16 matrix itself."""
    if layout == "packed":
        return PackedBF16(w).matmul(x)
    return bf16_gemv.dense_matmul(w.to(torch.bfloat16).contiguous(), x)


@pytest.mark.parametrize("layout", ["packed", "dense"])
@pytest.mark.parametrize("out_features,in_features", [(4, 8), (12, 40), (1728, 576), (576, 1536), (4096, 64)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_matches_float32_on_bf16_weights(layout, out_features, in_features, rows):
    gen = torch.Generator().manual_seed(out_features * 31 + in_features + rows)
    w = torch.randn(out_features, in_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    want = x.double() @ w.to(torch.bfloat16).double().t()
    got = _multiply(layout, w, x)
    assert got.shape == (rows, out_features) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * in_features**0.5)


@pytest.mark.parametrize("layout", ["packed", "dense"])
@pytest.mark.parametrize("in_features", [16, 40])  # 40: the dense kernel's 8-column tail after 32
def test_every_output_row_and_column_is_placed_right(layout, in_features):
    """One-hot weights: a packing or indexing slip moves a value, it cannot hide in rounding."""
    out_features = 8
    w = torch.zeros(out_features, in_features)
    for j in range(out_features):
        w[j, (3 * j + 1) % in_features] = j + 1
    x = torch.arange(4 * in_features, dtype=torch.float32).view(4, in_features)
    got = _multiply(layout, w, x)
    want = torch.stack([x[:, (3 * j + 1) % in_features] * (j + 1) for j in range(out_features)], 1)
    assert torch.equal(got, want)


def test_input_dtypes_and_non_contiguous_activations():
    w = torch.randn(16, 24)
    packed = PackedBF16(w.to(torch.bfloat16))
    x = torch.randn(24, 3).t()  # non-contiguous [3, 24]
    torch.testing.assert_close(packed.matmul(x), x @ w.to(torch.bfloat16).float().t(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        packed.matmul(x.to(torch.bfloat16)),
        x.to(torch.bfloat16).float() @ w.to(torch.bfloat16).float().t(),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("shape", [(6, 16), (8, 12), (8,), (2, 8, 8)])
def test_unpackable_shapes_are_refused(shape):
    with pytest.raises(ValueError, match="cannot pack"):
        PackedBF16(torch.zeros(shape))


@pytest.mark.parametrize("x_shape", [(0, 16), (bf16_gemv.MAX_ROWS + 1, 16), (2, 8), (16,)])
def test_wrong_activation_shapes_are_refused(x_shape):
    packed = PackedBF16(torch.zeros(8, 16))
    with pytest.raises(ValueError, match="activations"):
        packed.matmul(torch.zeros(x_shape))
    with pytest.raises(ValueError, match="activations"):
        bf16_gemv.dense_matmul(torch.zeros(8, 16, dtype=torch.bfloat16), torch.zeros(x_shape))


@pytest.mark.parametrize(
    "weight",
    [torch.zeros(8, 16), torch.zeros(6, 16, dtype=torch.bfloat16), torch.zeros(16, 8, dtype=torch.bfloat16).t()],
)
def test_a_dense_weight_it_cannot_read_is_refused(weight):
    """float32, a ragged row count, a transposed view: each would be read as something else."""
    with pytest.raises(ValueError, match="contiguous bf16 weight"):
        bf16_gemv.dense_matmul(weight, torch.zeros(1, weight.shape[1]))


def _reference_attention(q, cache, table, lens, heads, kv_heads, dim, scale, window, softcap=None):
    """Dense per-sequence attention over the gathered keys, in float64."""
    bs = cache.shape[1]
    flat = cache.reshape(-1, cache.shape[2]).double()
    out = torch.empty(q.shape[0], heads * dim, dtype=torch.float64)
    for s in range(q.shape[0]):
        length = int(lens[s])
        start = max(0, length - window) if window else 0
        pos = torch.arange(start, length)
        kv = flat[table[s][pos // bs] * bs + pos % bs].view(-1, 2, kv_heads, dim)
        k = kv[:, 0].transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        v = kv[:, 1].transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        qs = q[s, : heads * dim].double().view(heads, 1, dim)
        scores = qs @ k.transpose(1, 2) * scale
        p = torch.softmax(scores if softcap is None else torch.tanh(scores / softcap) * softcap, -1)
        out[s] = (p @ v).view(-1)
    return out


@pytest.mark.parametrize("allow_avx512", [True, False], ids=["best-isa", "avx2"])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "heads,kv_heads,dim,block_size,window",
    [
        (9, 3, 64, 16, None),
        (4, 4, 128, 4, None),
        (8, 2, 8, 1, 5),
        (6, 3, 24, 8, 13),
        (2, 1, 256, 16, None),
        (16, 2, 48, 16, None),
        (7, 7, 40, 2, 9),
    ],
)
def test_paged_decode_attention_matches_dense_attention(
    cache_dtype, heads, kv_heads, dim, block_size, window, allow_avx512
):
    # The kernel has an AVX2 and an AVX-512 variant (chosen by CPUID); the second id forces the
    # first, so an AVX-512 CPU checks both. Shapes cover 1-8 query heads per KV head (passes of
    # up to 3), head dims with every remainder mod 32, and lengths around the 4/8-key blocks.
    gen = torch.Generator().manual_seed(heads * dim + block_size)
    num_blocks, seqs = 1000, 7
    cache = torch.randn(num_blocks, block_size, 2 * kv_heads * dim, generator=gen).to(cache_dtype)
    lens = torch.tensor([1, 2, block_size, block_size + 1, 3 * block_size - 1, 37, 100])
    nb = -(-int(lens.max()) // block_size)
    table = (torch.randperm(num_blocks - 1, generator=gen)[: seqs * nb] + 1).view(seqs, nb)
    qkv = torch.randn(seqs, (heads + 2 * kv_heads) * dim, generator=gen)  # q is a strided slice of it
    got = decode_attention(qkv, cache, table, lens, heads, kv_heads, dim, dim**-0.5, window, allow_avx512)
    want = _reference_attention(qkv, cache, table, lens, heads, kv_heads, dim, dim**-0.5, window)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("allow_avx512", [True, False], ids=["best-isa", "avx2"])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("softcap", [0.5, 5.0, 50.0])
def test_paged_decode_attention_soft_caps_scores_as_gemma2(softcap, cache_dtype, allow_avx512):
    """Scores capped as cap * tanh(s / cap) before the softmax: from caps that flatten nearly every
    score (0.5) to one that touches only large ones (50), lengths around the 8-key blocks and
    the scalar tail, a window."""
    gen = torch.Generator().manual_seed(int(softcap * 10))
    heads, kv_heads, dim, block_size, window = 8, 2, 32, 4, 19
    cache = (torch.randn(200, block_size, 2 * kv_heads * dim, generator=gen) * 2).to(cache_dtype)
    lens = torch.tensor([1, 3, 8, 9, 17, 40])
    nb = -(-int(lens.max()) // block_size)
    table = (torch.randperm(199, generator=gen)[: len(lens) * nb] + 1).view(len(lens), nb)
    q = torch.randn(len(lens), heads * dim, generator=gen) * 2
    got = decode_attention(
        q, cache, table, lens, heads, kv_heads, dim, dim**-0.5, window, allow_avx512, softcap=softcap
    )
    want = _reference_attention(q, cache, table, lens, heads, kv_heads, dim, dim**-0.5, window, softcap)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_paged_decode_attention_of_bf16_queries_answers_in_bf16():
    # A bf16 model's decode queries: widened for the kernel, the answer rounded back to bf16.
    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, dim, block_size = 9, 3, 64, 16
    cache = torch.randn(40, block_size, 2 * kv_heads * dim, generator=gen).to(torch.bfloat16)
    lens = torch.tensor([1, 17, 100])
    table = (torch.randperm(39, generator=gen)[: 3 * 7] + 1).view(3, 7)
    qkv = torch.randn(3, (heads + 2 * kv_heads) * dim, generator=gen).to(torch.bfloat16)
    got = decode_attention(qkv, cache, table, lens, heads, kv_heads, dim, dim**-0.5, None)
    assert got.dtype == torch.bfloat16 and got.shape == (3, heads * dim)
    want = _reference_attention(qkv, cache, table, lens, heads, kv_heads, dim, dim**-0.5, None)
    torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-2)  # bf16 rounding of the answer


def test_paged_decode_attention_softmax_of_extreme_scores():
    """Scores hundreds apart: the winning key takes all the weight, nothing overflows."""
    dim, bs = 8, 4
    cache = torch.zeros(3, bs, 2 * dim)
    cache[1, :, :dim] = torch.arange(bs, dtype=torch.float32)[:, None] * 30  # K rows 0, 30, 60, 90
    cache[1, :, dim:] = torch.arange(bs, dtype=torch.float32)[:, None] + 1  # V rows 1, 2, 3, 4
    q = torch.ones(1, dim)
    out = decode_attention(q, cache, torch.tensor([[1]]), torch.tensor([4]), 1, 1, dim, 1.0, None)
    assert torch.equal(out, torch.full((1, dim), 4.0))
    assert torch.isfinite(
        decode_attention(-q, cache, torch.tensor([[1]]), torch.tensor([4]), 1, 1, dim, 1.0, None)
    ).all()


@pytest.mark.parametrize("table,lens", [([[5]], [3]), ([[-1]], [3]), ([[1]], [5]), ([[1]], [0])])
def test_paged_decode_attention_refuses_out_of_range_tables(table, lens):
    cache = torch.zeros(4, 4, 16)
    with pytest.raises(ValueError, match="rejected"):
        decode_attention(torch.zeros(1, 8), cache, torch.tensor(table), torch.tensor(lens), 1, 1, 8, 1.0, None)


@pytest.mark.parametrize("rows,cols", [(1, 8), (3, 576), (64, 64), (5, 40)])
def test_rms_norm_matches_torch(rows, cols):
    gen = torch.Generator().manual_seed(rows * cols)
    x, w = torch.randn(rows, cols, generator=gen) * 3, torch.randn(cols, generator=gen)
    torch.testing.assert_close(activation.rms_norm(x, w, 1e-5), F.rms_norm(x, (cols,), w, 1e-5))


def test_rms_norm_fused_with_the_residual_add():
    gen = torch.Generator().manual_seed(7)
    x, h, w = torch.randn(4, 64, generator=gen), torch.randn(4, 64, generator=gen), torch.randn(64, generator=gen)
    expected_sum = h + x
    out = activation.rms_norm(x, w, 1e-6, residual=h)
    torch.testing.assert_close(h, expected_sum)  # updated in place
    torch.testing.assert_close(out, F.rms_norm(expected_sum, (64,), w, 1e-6))


@pytest.mark.parametrize("scale", [1.0, 40.0, 1000.0])
def test_silu_and_mul_matches_torch_including_the_tails(scale):
    gen = torch.Generator().manual_seed(int(scale))
    x = torch.randn(6, 2 * 48, generator=gen) * scale
    want = F.silu(x[:, :48]) * x[:, 48:]
    got = activation.silu_and_mul(x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)


def test_activation_kernels_refuse_ragged_widths():
    with pytest.raises(ValueError, match="rejected"):
        activation.rms_norm(torch.zeros(2, 12), torch.ones(12), 1e-5)
    with pytest.raises(ValueError, match="rejected"):
        activation.silu_and_mul(torch.zeros(2, 12))


bf16_kernels = pytest.mark.skipif(
    not activation.supports(torch.device("cpu"), torch.bfloat16, 16),
    reason="the bf16 activation kernels need AVX-512 BF16",
)


def _bf16(t: torch.Tensor) -> torch.Tensor:
    """float64 values rounded to bf16 where transformers' bf16 modules round (via float32)."""
    return t.float().bfloat16().double()


def _assert_within_bf16_rounding(got: torch.Tensor, exact: torch.Tensor, roundings: int) -> None:
    """Each rounding to bf16 is off by at most half an ulp, 2^-9 relative (normal range)."""
    assert got.dtype == torch.bfloat16
    err = (got.double() - exact).abs()
    assert (err <= exact.abs() * roundings * 2.0**-8 + 1e-30).all(), err.max()


@bf16_kernels
@pytest.mark.parametrize("rows,cols", [(1, 16), (3, 576), (64, 64), (5, 48)])
def test_bf16_rms_norm_rounds_where_transformers_does(rows, cols):
    gen = torch.Generator().manual_seed(rows * cols)
    x = (torch.randn(rows, cols, generator=gen, dtype=torch.float64) * 3).bfloat16()
    w = torch.randn(cols, generator=gen, dtype=torch.float64).bfloat16()
    got = activation.rms_norm(x, w, 1e-5)
    xd = x.double()
    normed = xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5)
    _assert_within_bf16_rounding(got, normed * w.double(), roundings=2)
    want = _bf16(_bf16(normed) * w.double())  # transformers' LlamaRMSNorm in bf16
    assert (got.double() != want).float().mean() < 0.01  # ties of float32 vs float64 rounding only


@bf16_kernels
def test_bf16_rms_norm_fused_with_the_residual_add():
    gen = torch.Generator().manual_seed(11)
    x, h = torch.randn(4, 64, generator=gen).bfloat16(), torch.randn(4, 64, generator=gen).bfloat16()
    w = torch.randn(64, generator=gen).bfloat16()
    expected_sum = h + x  # torch's bf16 add: the float32 sum rounded once
    out = activation.rms_norm(x, w, 1e-6, residual=h)
    assert torch.equal(h, expected_sum)  # updated in place, rounded as torch rounds
    torch.testing.assert_close(out, activation.rms_norm(expected_sum, w, 1e-6), rtol=0, atol=0)


@bf16_kernels
@pytest.mark.parametrize("scale", [1.0, 40.0, 1000.0])
def test_bf16_silu_and_mul_against_float64(scale):
    gen = torch.Generator().manual_seed(int(scale) + 1)
    x = (torch.randn(6, 2 * 48, generator=gen, dtype=torch.float64) * scale).bfloat16()
    got = activation.silu_and_mul(x)
    gate, up = x[:, :48].double(), x[:, 48:].double()
    exact = gate * torch.sigmoid(gate) * up
    assert torch.isfinite(got).all()
    _assert_within_bf16_rounding(got, exact, roundings=2)
    # torch's bf16 silu then multiply: the same two roundings, so at most one bf16 ulp apart
    # (its exp differs in the last float32 bits, and its far tail is 0 where ours is ~1e-35)
    want = (F.silu(x[:, :48]) * x[:, 48:]).double()
    assert ((got.double() - want).abs() <= want.abs() * 2.0**-7 + 1e-30).all()


@bf16_kernels
def test_bf16_rounding_keeps_nan_and_infinity():
    x = torch.tensor([[float("nan"), float("inf"), -float("inf"), 1.0] * 4 + [2.0] * 16], dtype=torch.bfloat16)
    got = activation.silu_and_mul(x)[0]
    assert torch.isnan(got[0]) and got[1] == float("inf")  # silu(inf) * 2 = inf, never rounded into NaN


def _rotate_reference(
    qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, heads: int, head_dim: int
) -> torch.Tensor:
    """Adjacent-pair rotation in float64, untouched columns after the first heads * head_dim."""
    out = qkv.double().clone()
    cols = heads * head_dim
    pairs = out[:, :cols].view(len(positions), heads, head_dim // 2, 2)
    cs = cos_sin.double()[positions][:, None]  # [tokens, 1, d/2, 2]
    re, im = pairs[..., 0].clone(), pairs[..., 1].clone()
    pairs[..., 0] = re * cs[..., 0] - im * cs[..., 1]
    pairs[..., 1] = im * cs[..., 0] + re * cs[..., 1]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_rotary_matches_float64_and_leaves_v_alone(dtype, head_dim):
    if not activation.supports(torch.device("cpu"), dtype, head_dim):
        pytest.skip(f"no {dtype} activation kernels on this CPU")
    gen = torch.Generator().manual_seed(head_dim)
    heads, kv_tail, tokens, max_pos = 5, 2 * head_dim, 7, 40
    angles = torch.rand(max_pos, head_dim // 2, generator=gen, dtype=torch.float64) * 6.3
    cos_sin = torch.stack([angles.cos(), angles.sin()], -1).float().contiguous()
    base = torch.randn(tokens, heads * head_dim + kv_tail, generator=gen).to(dtype)
    positions = torch.tensor([0, 39, 3, 3, 17, 1, 22])
    qkv = base.clone()
    assert activation.rotary_(qkv, positions, cos_sin, heads, head_dim) is qkv
    want = _rotate_reference(base, positions, cos_sin, heads, head_dim)
    if dtype == torch.float32:
        torch.testing.assert_close(qkv.double(), want, rtol=1e-6, atol=1e-6)
    else:
        torch.testing.assert_close(qkv.double(), _bf16(want), rtol=2.0**-8, atol=1e-6)
    assert torch.equal(qkv[:, heads * head_dim :], base[:, heads * head_dim :])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_refuses_positions_past_the_table_and_writes_nothing(dtype):
    if not activation.supports(torch.device("cpu"), dtype, 16):
        pytest.skip(f"no {dtype} activation kernels on this CPU")
    cos_sin = torch.zeros(8, 8, 2)
    qkv = torch.ones(3, 32, dtype=dtype)
    for bad in ([0, 8, 1], [0, -1, 1]):
        with pytest.raises(ValueError, match="position outside"):
            activation.rotary_(qkv, torch.tensor(bad), cos_sin, 2, 16)
        assert torch.equal(qkv, torch.ones(3, 32, dtype=dtype))
    with pytest.raises(ValueError, match="cos_sin"):
        activation.rotary_(qkv, torch.tensor([0, 1, 2]), torch.zeros(8, 4, 2), 2, 16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_calls_split_over_threads_give_the_single_thread_result(dtype):
    """With torch threads > 1 a large call runs in row slices on torch's OpenMP pool; every slice
    must land where one call would have put it (residual updates and positions included)."""
    if not activation.supports(torch.device("cpu"), dtype, 16):
        pytest.skip(f"no {dtype} activation kernels on this CPU")
    gen = torch.Generator().manual_seed(5)
    rows, cols, d = 701, 576, 1536  # every call over csrc/cpu/parallel.h's PAR_MIN_BYTES, bf16 included
    x, h = torch.randn(rows, cols, generator=gen).to(dtype), torch.randn(rows, cols, generator=gen).to(dtype)
    w, gu = torch.randn(cols, generator=gen).to(dtype), torch.randn(rows, 2 * d, generator=gen).to(dtype)
    angles = torch.rand(600, 32, generator=gen) * 6.3
    cos_sin = torch.stack([angles.cos(), angles.sin()], -1).contiguous()
    positions = torch.randint(0, 600, (rows,), generator=gen)
    qkv = torch.randn(rows, 15 * 64, generator=gen).to(dtype)

    def run_all():
        hh, q = h.clone(), qkv.clone()
        return (
            activation.rms_norm(x, w, 1e-5, residual=hh),
            hh,
            activation.silu_and_mul(gu),
            activation.rotary_(q, positions, cos_sin, 12, 64),
        )

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run_all()
        torch.set_num_threads(3)
        split = run_all()
        bad = positions.clone()
        bad[-1] = 600  # in the last slice: nothing may be written by the others either
        q = qkv.clone()
        with pytest.raises(ValueError, match="position outside"):
            activation.rotary_(q, bad, cos_sin, 12, 64)
        assert torch.equal(q, qkv)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, split):
        assert torch.equal(a, b)
