"""Every GGUF type the quantized kernels run (and Q5_0, run as Q8_0 blocks), in every family's GGUF
layout, the experts of the sparse families included: each file's matrices run on their blocks and
its logprobs track transformers run on the values the file holds.

The families are those of tests/unit/test_model_families.py and test_moe_families.py, written by
their own writers, at a size whose rows are whole K-quant super-blocks (hidden 256, 16 query heads
of 16 over 8 KV heads, MLP and experts 256 wide): their tests run at hidden 64, where only the
32-weight types fit. K-quant blocks come from engine/kernels/quant_blocks.py's quantizer (the gguf
package has none). Each file runs twice: the prompt in one step (a batch of rows: the tiled GEMMs
where this CPU has them) and one token a step (the GEMV, and a sparse layer's single-token path).

Held as test_moe_families.assert_tracks says (median gap under 0.15, maximum under 2.0): the kernels
quantize activations to int8 per block (per 256 values for the K-quants), which a file's own
values do not show. Measured when written (an AVX2 host: the GEMV at every row count; one step):
medians 0.012-0.122 and maxima 0.05-0.91 over these 49 files (the largest, Mixtral's Q4_0, an
expert choice flipped at a near-tie); with the kernels off the same files are within 3e-5, so the
gap is the activations' rounding alone. Random weights at initializer_range 0.1, not the family
tests' 0.2: at hidden 256 that scale made Mixtral and OLMoE chaotic enough for gaps of 3-4 nats
from rounding alone.
"""

from __future__ import annotations

import pytest

from engine.models.default_model import default_tokenizer_path
from tests.helpers.hf_families import as_read_back, chunked_prompt_logprobs
from tests.helpers.runner_utils import make_runner
from tests.unit import test_model_families as dense
from tests.unit import test_moe_families as moe
from tests.unit.test_models import PROMPTS, hf_prompt_logprobs

gguf = pytest.importorskip("gguf")
from engine.kernels import quant  # noqa: E402

pytestmark = pytest.mark.skipif(quant.lib is None, reason="kernels not built")

K_SIZE = dict(
    hidden_size=256,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=16,
    intermediate_size=256,
    initializer_range=0.1,
)
_QWEN3_MOE = {"qwen3-moe": dict(intermediate_size=512, moe_intermediate_size=256)}  # its dense layer wider
# name -> (build the HF model, write its GGUF file)
FAMILIES = {
    **{name: (lambda n=name: dense._hf_model(n, **K_SIZE), dense.write_gguf) for name in dense._GGUF_ARCH},
    **{
        name: (lambda n=name: moe.hf_moe_model(n, **{**K_SIZE, **_QWEN3_MOE.get(n, {})}), moe.write_moe_gguf)
        for name in moe.FAMILIES
    },
}
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]


def _runs_as(qtype: str) -> str:
    return "Q8_0" if qtype == "Q5_0" else qtype


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_kernel_type_runs_every_family_on_its_blocks(name, qtype, tmp_path):
    build, write = FAMILIES[name]
    path = str(tmp_path / f"{name}.{qtype}.gguf")
    write(build(), name, path, qtype)
    keep = (lambda pname: pname.endswith("gate.weight")) if name in moe.FAMILIES else (lambda pname: False)
    want = hf_prompt_logprobs(as_read_back(build(), qtype, keep=keep), PROMPTS[0])
    runner = make_runner(path, block_size=4, tokenizer=default_tokenizer_path())
    formats = {
        p.method.format
        for layer in runner.model.layers
        for p in layer.linears()
        if layer.moe is None or p is not layer.moe.router
    }
    assert formats == {_runs_as(qtype)}
    for chunk in (None, 1):
        runner = make_runner(path, block_size=4, tokenizer=default_tokenizer_path())
        _, got = chunked_prompt_logprobs(runner, [PROMPTS[0]], chunk)
        moe.assert_tracks(got["0"], want)


# llama.cpp's Q4_K_M: Q6_K for attn_v and ffn_down (on some layers; here on all) beside Q4_K; here
# the dense MLP's up too, so that a dense gate/up mixes types as well
_MORE_BITS = ("attn_v", "ffn_down", "ffn_down_exps", "ffn_up")


def _more_bits(pname: str) -> bool:
    """Whether the transformers parameter is one of _MORE_BITS (stacked experts' down included)."""
    return pname.removesuffix(".weight").endswith(("v_proj", "down_proj", "mlp.up_proj"))


@pytest.mark.parametrize("name", ["gemma2", "qwen3-moe", "mixtral"])
def test_a_fused_projection_of_two_types_runs_each_part_on_its_blocks(name, tmp_path, monkeypatch):
    """q/k in Q4_K with v in Q6_K (and Gemma's gate in Q4_K with its up in Q6_K) fuse into one
    projection of two parts, each on its own blocks, not one dequantized float matrix; experts
    whose down is Q6_K run it so."""
    from tests.helpers import hf_families

    def mixed(w, tname, data, qtype_name, f32=False):
        more = tname.split(".")[2] in _MORE_BITS if tname.startswith("blk.") else False
        hf_families.add_gguf_tensor(w, tname, data, "Q6_K" if more else qtype_name, f32)

    monkeypatch.setattr(moe if name in moe.FAMILIES else dense, "add_gguf_tensor", mixed)
    build, write = FAMILIES[name]
    path = str(tmp_path / f"{name}.mixed.gguf")
    write(build(), name, path, "Q4_K")
    router = (lambda pname: pname.endswith("gate.weight")) if name in moe.FAMILIES else (lambda pname: False)
    hf = as_read_back(build(), "Q4_K", keep=lambda pname: router(pname) or _more_bits(pname))
    hf = as_read_back(hf, "Q6_K", keep=lambda pname: router(pname) or not _more_bits(pname))
    want = hf_prompt_logprobs(hf, PROMPTS[0])
    runner = make_runner(path, block_size=4, tokenizer=default_tokenizer_path())
    layer = runner.model.layers[0]
    assert layer.qkv.method.format == "Q4_K+Q6_K"
    if layer.moe is None:
        assert (layer.gate_up.method.format, layer.down.method.format) == ("Q4_K+Q6_K", "Q6_K")
    else:
        assert (layer.moe.gate_up[0].method.format, layer.moe.down[0].method.format) == ("Q4_K", "Q6_K")
    _, got = chunked_prompt_logprobs(runner, [PROMPTS[0]], None)
    moe.assert_tracks(got["0"], want)
