"""The Triton kernels (engine/kernels/triton/) against torch references.

Without a GPU (CI) the kernels run on CPU tensors through Triton's interpreter. It needs
``TRITON_INTERPRET=1`` when a kernel is decorated (at import) and while it runs (triton
reads the flag again on first launch), so this module sets it while importing the kernels
and around each of its own tests, and restores the environment after each: other modules'
triton use (torch.compile) is unchanged. On a CUDA machine the same tests run the compiled
kernels on the GPU, and the ``gpu`` tests add what only a GPU has (graph capture). Shapes
are tiny: the interpreter runs every program in Python.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from engine.models.attention import AttentionMetadata, PrefillChunk, build_decode_masks, build_prefill_masks
from engine.models.attention import paged_attention as engine_paged_attention

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
_FLAG_BEFORE = os.environ.get("TRITON_INTERPRET")


def _import_kernels():
    """engine.kernels.triton with every kernel decorated (interpreted when there is no GPU)."""
    import engine.kernels.triton as kernels

    if ON_GPU:
        return kernels
    loaded = [m for m in sys.modules if m.startswith("engine.kernels.triton.")]
    if loaded:
        raise RuntimeError(
            f"{loaded} were imported before this module could set TRITON_INTERPRET=1; without a GPU they cannot run"
        )
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        for name in kernels.__all__:
            getattr(kernels, name)
    finally:
        if _FLAG_BEFORE is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _FLAG_BEFORE
    return kernels


K = _import_kernels()
_FLAG_AFTER_IMPORT = os.environ.get("TRITON_INTERPRET")


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    if not ON_GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")

# Against a float64 reference on the same (rounded) inputs: float32 is near exact; bf16 is
# within its rounding of the output (and, for attention, of the probabilities).
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}
# Where a GPU rounds exactly as torch does. The interpreter truncates float32 -> bf16 (the GPU
# rounds to nearest even), which moves a value by at most one bf16 ulp (2 ** -7 relative).
SAME_ROUNDING = dict(rtol=0, atol=0) if ON_GPU else dict(rtol=2**-7, atol=0)


def _randn(*shape, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)


# ---------------------------------------------------------------- paged attention
class Step:
    """A flattened batch like the runner's: sequences of (context_len, query_len) over a random
    cache whose older slots stand for earlier steps and prefix-cached blocks."""

    def __init__(self, seqs, heads, kv_heads, head_dim, block_size, dtype, shared_prefix=False, seed=0):
        self.seqs, self.h, self.hkv, self.d, self.bs = seqs, heads, kv_heads, head_dim, block_size
        need = [-(-(c + n) // block_size) for c, n in seqs]
        num_blocks = sum(need) + 2
        gen = torch.Generator().manual_seed(seed)
        ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()  # block 0 stays unused padding
        self.tables = []
        for s, nb in enumerate(need):
            row = [ids.pop() for _ in range(nb)]
            if shared_prefix and s and seqs[s][0] >= block_size and seqs[0][0] >= block_size:
                row[0] = self.tables[0][0]  # a full, cached first block shared by two sequences
            self.tables.append(row)
        width = max(need)
        self.block_tables = torch.tensor([r + [0] * (width - len(r)) for r in self.tables], dtype=torch.int32)
        self.cache = _randn(num_blocks, block_size, 2 * kv_heads * head_dim, dtype=dtype, seed=seed + 1)
        tokens = sum(n for _, n in seqs)
        self.qkv = _randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype, seed=seed + 2)
        self.slots = torch.tensor([self.slot(s, p) for s, (c, n) in enumerate(seqs) for p in range(c, c + n)])
        self.cu_seqlens = torch.tensor([0] + torch.tensor([n for _, n in seqs]).cumsum(0).tolist(), dtype=torch.int32)
        self.context_lens = torch.tensor([c for c, _ in seqs], dtype=torch.int32)

    def slot(self, seq: int, pos: int) -> int:
        return self.tables[seq][pos // self.bs] * self.bs + pos % self.bs

    def write_kv(self) -> None:
        """The torch path's cache write (engine/models/attention.py)."""
        flat = self.cache.view(-1, self.cache.shape[-1])
        flat.index_copy_(0, self.slots.to(DEVICE), self.qkv[:, self.h * self.d :].to(flat.dtype))

    def q(self) -> torch.Tensor:
        return self.qkv[:, : self.h * self.d].view(-1, self.h, self.d)

    def run(self, window=None) -> torch.Tensor:
        return K.paged_attention(
            self.q(),
            self.cache,
            self.block_tables.to(DEVICE),
            self.cu_seqlens.to(DEVICE),
            self.context_lens.to(DEVICE),
            self.d**-0.5,
            window,
        )

    def reference(self, window=None) -> torch.Tensor:
        """Dense float64 attention per sequence over keys gathered slot by slot."""
        flat = self.cache.view(-1, 2, self.hkv, self.d).double().cpu()
        q = self.q().double().cpu()
        out, row = [], 0
        for s, (c, n) in enumerate(self.seqs):
            kv = flat[torch.tensor([self.slot(s, p) for p in range(c + n)])]
            k = kv[:, 0].repeat_interleave(self.h // self.hkv, dim=1)  # query head h reads KV head h // G
            v = kv[:, 1].repeat_interleave(self.h // self.hkv, dim=1)
            scores = torch.einsum("nhd,khd->hnk", q[row : row + n], k) * self.d**-0.5
            q_pos, k_pos = torch.arange(c, c + n)[:, None], torch.arange(c + n)[None, :]
            visible = k_pos <= q_pos
            if window is not None:
                visible &= k_pos > q_pos - window
            probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
            out.append(torch.einsum("hnk,khd->nhd", probs, v).reshape(n, -1))
            row += n
        return torch.cat(out)


# (context_len, query_len): decodes first, then prefill chunks, as the runner orders them.
BLOCK_EDGES = [(3, 1), (4, 1), (5, 1), (0, 7), (4, 5), (9, 4)]  # contexts at block_size - 1, =, + 1 (block 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (6, 2)])
def test_attention_of_a_mixed_step_across_block_boundaries(dtype, heads, kv_heads):
    step = Step(BLOCK_EDGES, heads, kv_heads, head_dim=16, block_size=4, dtype=dtype)
    step.write_kv()
    got = step.run()
    assert got.shape == (step.qkv.shape[0], heads * 16) and got.dtype == dtype
    torch.testing.assert_close(got.double().cpu(), step.reference(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_attention_of_a_decode_only_step(dtype):
    """The short tile a decode-only step gets; contexts at block_size - 1, =, + 1 (block 16)."""
    step = Step([(15, 1), (16, 1), (17, 1), (0, 1), (40, 1)], 3, 1, head_dim=32, block_size=16, dtype=dtype, seed=9)
    step.write_kv()
    torch.testing.assert_close(step.run().double().cpu(), step.reference(), **TOL[dtype])


@pytest.mark.parametrize("window", [1, 5, 16])
def test_attention_with_a_sliding_window(window):
    step = Step([(20, 1), (2, 1), (11, 6), (0, 9)], 3, 1, head_dim=24, block_size=4, dtype=torch.float32, seed=3)
    step.write_kv()
    torch.testing.assert_close(step.run(window).double().cpu(), step.reference(window), **TOL[torch.float32])


def test_attention_of_a_long_chunk_spanning_many_tiles_and_a_shared_prefix():
    """Odd head_dim (padded), a chunk longer than one program's 16 queries (4 heads per KV
    head in 64 rows), context over many key tiles, and two sequences reading the same cached
    first block."""
    step = Step(
        [(40, 1), (33, 30), (16, 3)], 8, 2, head_dim=20, block_size=16, dtype=torch.bfloat16, shared_prefix=True, seed=5
    )
    assert step.tables[1][0] == step.tables[0][0]
    step.write_kv()
    torch.testing.assert_close(step.run().double().cpu(), step.reference(), **TOL[torch.bfloat16])


def test_attention_matches_the_engine_torch_path():
    """The same step through engine/models/attention.py (metadata built as the model runner
    builds it) gives the same output: the kernel reads ringllm's layout and batch order."""
    seqs, window, heads, kv_heads, d, bs = [(5, 1), (8, 1), (0, 6), (7, 3)], 6, 4, 2, 16, 4
    step = Step(seqs, heads, kv_heads, d, bs, torch.float32, seed=7)
    cache = step.cache.clone()
    decodes = [(s, c) for s, (c, n) in enumerate(seqs) if n == 1]
    nb = max(-(-(c + 1) // bs) for _, c in decodes)
    md = AttentionMetadata(slot_mapping=step.slots.to(DEVICE), num_decodes=len(decodes))
    md.decode_blocks = torch.tensor([(step.tables[s] + [0] * nb)[:nb] for s, _ in decodes]).view(-1).to(DEVICE)
    md.decode_len = nb * bs
    md.decode_mask, md.decode_window_mask = build_decode_masks(
        torch.tensor([c + 1 for _, c in decodes], device=DEVICE), md.decode_len, window
    )
    row = len(decodes)
    for s, (c, n) in enumerate(seqs[len(decodes) :], start=len(decodes)):
        chunk = PrefillChunk(row, n)
        chunk.mask, chunk.window_mask = build_prefill_masks(c, n, window, DEVICE)
        if c:
            chunk.kv_slots = torch.tensor([step.slot(s, p) for p in range(c + n)], device=DEVICE)
        md.prefills.append(chunk)
        row += n
    for sliding in (False, True):
        want = engine_paged_attention(step.qkv, cache, md, heads, kv_heads, d, d**-0.5, sliding)
        K.reshape_and_cache(step.qkv[:, heads * d :], step.cache, step.slots.to(DEVICE))
        got = step.run(window if sliding else None)
        torch.testing.assert_close(step.cache, cache, rtol=0, atol=0)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- reshape and cache
@pytest.mark.parametrize(
    "qkv_dtype,cache_dtype",
    [(torch.float32, torch.float32), (torch.float32, torch.bfloat16), (torch.bfloat16, torch.bfloat16)],
)
def test_reshape_and_cache_writes_each_token_kv_row_into_its_slot(qkv_dtype, cache_dtype):
    step = Step([(3, 1), (0, 5), (6, 3)], 3, 1, head_dim=20, block_size=4, dtype=qkv_dtype, seed=11)
    step.cache = step.cache.to(cache_dtype)
    want = step.cache.clone()
    want.view(-1, want.shape[-1]).index_copy_(0, step.slots.to(DEVICE), step.qkv[:, 3 * 20 :].to(cache_dtype))
    slots = step.slots.clone()
    slots[1] = -1  # a padded token: writes nothing
    want.view(-1, want.shape[-1])[step.slots[1]] = step.cache.view(-1, want.shape[-1])[step.slots[1]]
    K.reshape_and_cache(step.qkv[:, 3 * 20 :], step.cache, slots.to(DEVICE))
    torch.testing.assert_close(step.cache, want, **SAME_ROUNDING)


# ---------------------------------------------------------------- RMSNorm, SiLU-and-mul, RoPE
def _hf_rms_norm(x, weight, eps):
    """transformers' LlamaRMSNorm."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows,width", [(1, 8), (5, 72), (3, 200)])
def test_rms_norm_alone_and_fused_with_the_residual_add(dtype, rows, width):
    x = _randn(rows, width, dtype=dtype, seed=rows)
    residual = _randn(rows, width, dtype=dtype, seed=rows + 1) * 4
    weight = (1 + _randn(width, dtype=torch.float32, seed=2) * 0.1).to(dtype)
    torch.testing.assert_close(K.rms_norm(x, weight, 1e-6), _hf_rms_norm(x, weight, 1e-6), **TOL[dtype])
    summed = residual + x
    got = K.rms_norm(x, weight, 1e-5, residual=residual)
    torch.testing.assert_close(residual, summed, **SAME_ROUNDING)  # updated in place, rounded as torch does
    torch.testing.assert_close(got, _hf_rms_norm(summed, weight, 1e-5), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows,inter", [(1, 8), (4, 40), (3, 1500)])
def test_silu_and_mul(dtype, rows, inter):
    x = _randn(rows, 2 * inter, dtype=dtype, seed=inter) * 3
    want = F.silu(x[:, :inter]) * x[:, inter:]
    torch.testing.assert_close(K.silu_and_mul(x), want, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(2, 2, 16), (3, 1, 24), (4, 2, 6)])
def test_rotary_embedding_in_place_matches_the_models_complex_multiply(dtype, heads, kv_heads, head_dim):
    """Only the q and k columns of the fused rows turn, by the model's own angle table."""
    from engine.models.llama import rope_inv_freq

    tokens, cols = 5, (heads + kv_heads) * head_dim
    angles = torch.arange(64, dtype=torch.float32)[:, None] * rope_inv_freq(
        head_dim, {"rope_theta": 10000.0, "rope_type": "default"}
    )
    rope_cis = torch.complex(angles.cos(), angles.sin()).to(DEVICE)
    positions = torch.tensor([0, 1, 17, 63, 5], device=DEVICE)
    qkv = _randn(tokens, cols + 2 * kv_heads * head_dim, dtype=dtype, seed=head_dim)
    pairs = qkv[:, :cols].float().view(tokens, -1, head_dim // 2, 2)
    turned = torch.view_as_real(torch.view_as_complex(pairs) * rope_cis[positions].unsqueeze(1))
    want = torch.cat([turned.reshape(tokens, cols).to(dtype), qkv[:, cols:]], dim=1)
    K.rotary_embedding(qkv[:, :cols], positions, torch.view_as_real(rope_cis), head_dim)
    torch.testing.assert_close(qkv, want, **TOL[dtype])


# ---------------------------------------------------------------- the package itself
def test_importing_this_module_leaves_the_environment_as_found():
    assert _FLAG_AFTER_IMPORT == _FLAG_BEFORE


def test_import_on_a_cpu_install_is_silent():
    """Importing the package and its kernels without the interpreter flag neither fails nor prints."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "import engine.kernels.triton as k; print(k.available()); [getattr(k, name) for name in k.__all__]"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(ON_GPU) and proc.stderr == ""


# Each kernel as the wrappers launch it for the default model (9 query / 3 KV heads of 64,
# hidden 576, intermediate 1536, blocks of 16): pointer types, scalar types, constexprs.
_ATTENTION_ARGS = dict(
    block_tables_ptr="*i32",
    cu_seqlens_ptr="*i32",
    context_lens_ptr="*i32",
    scale="fp32",
    num_seqs="i32",
    window="i32",
    stride_ot="i32",
    stride_qt="i32",
    stride_qh="i32",
    stride_cb="i32",
    stride_cs="i32",
    stride_bt="i32",
)
_ATTENTION_CONST = dict(NUM_KV_HEADS=3, GROUP=3, HEAD_DIM=64, D_PAD=64, BLOCK_SIZE=16, TILE_N=32, UPCAST=False)
AOT_CASES = [
    *[
        (
            "attention",
            "_unified_attention_kernel",
            dict(out_ptr=f"*{t}", q_ptr=f"*{t}", cache_ptr=f"*{t}", **_ATTENTION_ARGS),
            dict(_ATTENTION_CONST, BLOCK_M=m, BLOCK_Q=m // 3, SLIDING=sliding, PRECISION=precision),
            arch,
        )
        for t, precision, arch, m, sliding in [
            ("bf16", "tf32", 90, 16, False),
            ("bf16", "tf32", 90, 64, True),
            ("bf16", "tf32", 80, 64, False),
            ("fp16", "tf32", 75, 16, True),
            ("fp32", "ieee", 90, 64, False),
        ]
    ],
    (
        "cache",
        "_reshape_and_cache_kernel",
        dict(kv_ptr="*bf16", cache_ptr="*bf16", slot_ptr="*i64", stride_kv="i32"),
        dict(WIDTH=384, BLOCK=512),
        90,
    ),
    *[
        (
            "norm",
            "_rms_norm_kernel",
            dict(
                x_ptr="*bf16",
                residual_ptr="*bf16",
                weight_ptr="*bf16",
                out_ptr="*bf16",
                stride_x="i32",
                stride_r="i32",
                stride_o="i32",
                width="i32",
                eps="fp32",
            ),
            dict(BLOCK=1024, HAS_RESIDUAL=residual),
            90,
        )
        for residual in (False, True)
    ],
    (
        "activation",
        "_silu_and_mul_kernel",
        dict(x_ptr="*bf16", out_ptr="*bf16", stride_x="i32", stride_o="i32", width="i32"),
        dict(BLOCK=1024),
        90,
    ),
    (
        "rotary",
        "_rotary_kernel",
        dict(x_ptr="*bf16", positions_ptr="*i64", cos_sin_ptr="*fp32", stride_x="i32", stride_p="i32"),
        dict(NUM_HEADS=12, HALF=32, HEADS_PAD=16, HALF_PAD=32),
        90,
    ),
]
_AOT_SCRIPT = """
import json, sys, triton
from importlib import import_module
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from engine.kernels.triton import LAUNCH_OPTIONS
for module, kernel, args, const, arch in json.loads(sys.argv[1]):
    fn = getattr(import_module("engine.kernels.triton." + module), kernel)
    signature = dict(args, **{name: "constexpr" for name in const})
    compiled = triton.compile(ASTSource(fn, signature, const), target=GPUTarget("cuda", arch, 32),
                              options=LAUNCH_OPTIONS)
    assert compiled.asm["cubin"], (kernel, arch)
"""


def test_every_kernel_compiles_to_a_cubin_for_cuda_gpus(tmp_path):
    """Triton's compiler and bundled ptxas need no GPU: a kernel that would not compile on
    sm_75 (fp16 only), sm_80 or sm_90 fails here, in CI, not on the first GPU it meets."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", _AOT_SCRIPT, json.dumps(AOT_CASES)], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Warning" not in proc.stderr, proc.stderr[-4000:]


@gpu
@needs_gpu
def test_available_on_a_cuda_machine():
    assert K.available()


@gpu
@needs_gpu
def test_decode_step_replays_in_a_cuda_graph():
    """A captured decode step (cache write then attention) follows new inputs copied into its
    buffers, as the runner's graphs for decode will."""
    first = Step([(3, 1), (9, 1), (16, 1)], 4, 2, 16, 16, torch.bfloat16, seed=1)
    second = Step([(15, 1), (1, 1), (30, 1)], 4, 2, 16, 16, torch.bfloat16, seed=2)
    second.cache = first.cache  # one cache, as in the runner
    inputs = [t.to(DEVICE) for t in (first.qkv, first.slots, first.block_tables, first.cu_seqlens, first.context_lens)]
    width = max(first.block_tables.shape[1], second.block_tables.shape[1])
    inputs[2] = F.pad(inputs[2], (0, width - inputs[2].shape[1]))
    qkv, slots, tables, cu, ctx = inputs

    def decode():
        K.reshape_and_cache(qkv[:, 64:], first.cache, slots)
        return K.paged_attention(qkv[:, :64].view(-1, 4, 16), first.cache, tables, cu, ctx, 16**-0.5)

    decode()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode()
    for step in (first, second):
        qkv.copy_(step.qkv)
        slots.copy_(step.slots)
        tables.copy_(F.pad(step.block_tables, (0, width - step.block_tables.shape[1])))
        ctx.copy_(step.context_lens)
        graph.replay()
        torch.testing.assert_close(out.double().cpu(), step.reference(), **TOL[torch.bfloat16])
