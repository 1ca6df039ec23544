"""Gemma 2, Gemma 3 (text) and Phi-3 / Phi-4-mini against transformers in float32 (eager attention),
from HF directories and from GGUF files written here with ``gguf.GGUFWriter``.

Each family is a tiny random-weight checkpoint with its real head/group structure (4 query heads
over 2 KV heads), >= 2 layers, and what makes the family: Gemma's offset norms (random, not
zero), four norms a layer, scaled embeddings, gelu-tanh MLP, query_pre_attn_scalar apart from
head_dim, soft-caps (Gemma 2), sliding windows of 5 tokens interleaved with global layers, Gemma
3's local rope base, linear-scaled global rope and q/k norms; Phi-3's fused checkpoint
projections and longrope (short factors below 32 positions, long from there: the 40 generated
tokens cross it), Phi-4-mini's partial rotary factor. Prompts run through prefill in one piece
and in chunks over 4-token KV blocks, then greedy decode.
"""

from __future__ import annotations

import numpy as np
import pytest
from transformers import Gemma2Config, Gemma3TextConfig, Phi3Config, Qwen3Config

from engine.config import EngineArgs
from engine.models import get_model_class
from engine.models.default_model import default_tokenizer_path
from tests.helpers.hf_families import (
    add_gguf_tensor,
    as_read_back,
    chunked_prompt_logprobs,
    finish_gguf,
    generate_prompts,
    gguf_writer,
    random_hf_model,
    saved_family,
    use_torch_ops,
)
from tests.helpers.runner_utils import generate, make_request, make_runner, step
from tests.unit.test_models import PROMPTS, hf_greedy, hf_prompt_logprobs

TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    initializer_range=0.2,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)
_GEMMA = dict(sliding_window=5, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=16)
_LONGROPE = dict(
    rope_type="longrope",
    rope_theta=10000.0,
    short_factor=[1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
    long_factor=[1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 12.0, 16.0],
)
FAMILIES = {
    "gemma2": (
        Gemma2Config,
        dict(_GEMMA, architectures=["Gemma2ForCausalLM"], attn_logit_softcapping=4.0, final_logit_softcapping=6.0),
    ),
    "gemma2-scalar": (
        Gemma2Config,
        dict(
            _GEMMA,
            architectures=["Gemma2ForCausalLM"],
            query_pre_attn_scalar=24,
            attn_logit_softcapping=4.0,
            final_logit_softcapping=6.0,
        ),
    ),
    "gemma3": (
        Gemma3TextConfig,
        dict(
            _GEMMA,
            architectures=["Gemma3ForCausalLM"],
            sliding_window_pattern=2,
            rope_parameters={
                "full_attention": dict(rope_type="linear", factor=2.0, rope_theta=1e6),
                "sliding_attention": dict(rope_type="default", rope_theta=100.0),
            },
        ),
    ),
    "phi3": (
        Phi3Config,
        dict(
            architectures=["Phi3ForCausalLM"],
            sliding_window=7,
            original_max_position_embeddings=32,
            rope_parameters=dict(_LONGROPE),
        ),
    ),
    "phi4-mini": (
        Phi3Config,
        dict(
            architectures=["Phi3ForCausalLM"],
            original_max_position_embeddings=32,
            tie_word_embeddings=True,
            rope_parameters=dict(
                _LONGROPE,
                partial_rotary_factor=0.75,
                short_factor=_LONGROPE["short_factor"][:6],
                long_factor=_LONGROPE["long_factor"][:6],
            ),
        ),
    ),
    # YaRN on a family that ships it (Qwen's long-context configs): interpolated low frequencies,
    # cos and sin scaled by its attention factor
    "qwen3-yarn": (
        Qwen3Config,
        dict(
            architectures=["Qwen3ForCausalLM"],
            max_position_embeddings=128,
            rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=32),
        ),
    ),
}


def _hf_model(name: str, **changes):
    cls, extra = FAMILIES[name]

    def adjust(pname, p):
        if pname.endswith("norm.weight"):  # Gemma's are offsets (zero = identity), Phi's scales
            p.uniform_(-0.5, 0.5) if name.startswith("gemma") else p.uniform_(0.5, 1.5)

    return random_hf_model(cls, {**TINY, **extra, **changes}, adjust)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(name, checkpoint dir, HF model) for one family, random weights."""
    return saved_family(request.param, tmp_path_factory, _hf_model)


@pytest.mark.parametrize("chunk", [None, 5])
def test_prompt_logprobs_match_transformers(family, chunk):
    name, path, hf = family
    runner = make_runner(path, block_size=4)
    reqs, got = chunked_prompt_logprobs(runner, PROMPTS, chunk)
    for r in reqs:
        want = hf_prompt_logprobs(hf, r.prompt_token_ids)
        assert got[r.request_id] == pytest.approx(want, abs=2e-4)


@pytest.mark.parametrize("kernels", [True, False], ids=["c-kernels", "torch-ops"])
@pytest.mark.parametrize("chunk", [None, 4])
def test_greedy_batch_matches_transformers(family, chunk, kernels, monkeypatch):
    """Decodes and prefill chunks share steps; the 40 tokens of the longest request cross the
    5-token windows (and Phi-3's 32-position switch to the long rope factors). Both CPU forwards:
    the C kernels (norms, rope, the paged decode kernel with its window) and torch's ops (SDPA
    over gathered blocks and window masks)."""
    if not kernels:
        use_torch_ops(monkeypatch)
    name, path, hf = family
    runner = make_runner(path, block_size=4)
    assert runner.model.backend == ("cpu-kernels" if kernels else "torch")
    for r in generate_prompts(runner, PROMPTS, 40, chunk):
        assert r.output_token_ids == hf_greedy(hf, r.prompt_token_ids, 40)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_tracks_float32(family, dtype):
    """Half precision (Gemma's (1 + w) norms rounded to it, its scaled embeddings too) stays
    within half-precision error of transformers in float32: 0.25 nat, as transformers' own bf16
    moves by up to 0.18 on these random weights (measured when written: Phi-3 0.15, YaRN 0.18)."""
    name, path, hf = family
    runner = make_runner(path, dtype=dtype, block_size=4)
    req = make_request("h", PROMPTS[0], prompt_logprobs=0)
    out, out2 = step(runner, [req], 8), step(runner, [req])
    got = [row[0] for o in (out, out2) for row in o.prompt_logprobs["h"].logprobs]
    assert got == pytest.approx(hf_prompt_logprobs(hf, PROMPTS[0]), abs=0.25)


def test_soft_capped_attention_in_bounded_slices_matches_transformers(tmp_path, monkeypatch):
    """Soft-capped scores are materialised; in slices of at most CAPPED_SCORES_MAX (here 64, so
    a 21-token prompt over 4 heads goes a row or less at a time) the result is the same."""
    from engine.models import attention

    monkeypatch.setattr(attention, "CAPPED_SCORES_MAX", 64)
    hf = _hf_model("gemma2")
    hf.save_pretrained(str(tmp_path))
    runner = make_runner(str(tmp_path), block_size=4)
    reqs = [make_request(str(i), p, prompt_logprobs=0) for i, p in enumerate(PROMPTS)]
    out = step(runner, reqs, 8)
    rows = out.prompt_logprobs["0"].logprobs
    assert [row[0] for row in rows] == pytest.approx(hf_prompt_logprobs(hf, PROMPTS[0])[: len(rows)], abs=2e-4)
    generate(runner, reqs, 12, 8)
    for r in reqs:
        assert r.output_token_ids == hf_greedy(hf, r.prompt_token_ids, 12)


def test_each_family_is_its_registered_class_and_keeps_its_features(family):
    name, path, _ = family
    runner = make_runner(path, block_size=4)
    model, dims = runner.model, runner.model.dims
    assert type(model) is get_model_class(runner.config.model_config.architecture)
    if name.startswith("gemma"):
        assert dims.sandwich_norms and dims.act == "gelu_tanh" and dims.embed_scale == 8.0
        assert [layer.sliding for layer in model.layers] == [True, False, True]
    if name == "gemma3":
        assert dims.qk_norm and [layer.rope for layer in model.layers] == [1, 0, 1]
    if name == "phi4-mini":
        assert dims.rotary_dim == 12 and dims.head_dim == 16


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    from engine.models.default_model import write_tiny_model

    path = write_tiny_model(str(tmp_path), architectures=["Gemma3ForConditionalGeneration"])
    with pytest.raises(
        ValueError,
        match=r"Gemma3ForConditionalGeneration.*supported: LlamaForCausalLM.*"
        r"Gemma2ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM",
    ):
        EngineArgs(model=path, load_format="dummy").create_engine_config()


def test_dynamic_rope_is_refused_naming_the_supported_types(tmp_path):
    """Dynamic NTK re-rotates every cached key as a sequence grows, which a paged cache cannot do."""
    from engine.models.default_model import write_tiny_model

    path = write_tiny_model(str(tmp_path), rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(
        ValueError, match="rope type 'dynamic' is not supported; supported: default, linear, llama3, yarn, longrope"
    ):
        make_runner(path, load_format="dummy")


@pytest.mark.parametrize(
    "field, value", [("query_pre_attn_scalar", 0), ("attn_logit_softcapping", -1.0), ("final_logit_softcapping", 0.0)]
)
def test_gemma_config_values_that_cannot_run_are_refused_naming_the_field(field, value, tmp_path):
    cls, extra = FAMILIES["gemma2"]
    cls(**{**TINY, **extra, field: value}).save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match=f"{field} must be a positive number, got {value}"):
        make_runner(str(tmp_path), load_format="dummy")


# ---------------------------------------------------------------- the same weights as GGUF files

_GGUF_ARCH = {"gemma2": "gemma2", "gemma3": "gemma3", "phi3": "phi3", "phi4-mini": "phi3"}
_LAYER_GGUF = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.qkv_proj": "attn_qkv",
    "mlp.gate_up_proj": "ffn_up",
}


def _gguf_name(hf: str, arch: str) -> str:
    base = hf.removeprefix("model.").removesuffix(".weight")
    if base.startswith("layers."):
        _, idx, part = base.split(".", 2)
        if arch == "phi3" and part == "post_attention_layernorm":
            return f"blk.{idx}.ffn_norm.weight"  # Phi's pre-MLP norm
        return f"blk.{idx}.{_LAYER_GGUF[part]}.weight"
    return {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output"}[base] + ".weight"


def write_gguf(hf, name: str, path: str, qtype_name: str) -> None:
    """``hf``'s weights and config as llama.cpp's converter writes them: its key names, Gemma's
    norms with the 1 added, Phi-3's rope factors as tensors; matrices in ``qtype_name``, norms F32."""
    import gguf

    arch, cfg = _GGUF_ARCH[name], hf.config
    w = gguf_writer(path, arch, cfg)
    if arch.startswith("gemma"):
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        w.add_sliding_window(cfg.sliding_window)
        if arch == "gemma2":
            w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
            w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
            w.add_final_logit_softcapping(cfg.final_logit_softcapping)
        else:
            full, local = cfg.rope_parameters["full_attention"], cfg.rope_parameters["sliding_attention"]
            w.add_rope_freq_base(full["rope_theta"])
            w.add_float32(gguf.Keys.Rope.FREQ_BASE_SWA.format(arch=arch), local["rope_theta"])
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(full["factor"])
            w.add_uint32(gguf.Keys.Attention.SLIDING_WINDOW_PATTERN.format(arch=arch), 2)
    else:
        rope = cfg.rope_parameters
        w.add_rope_freq_base(rope["rope_theta"])
        w.add_rope_dimension_count(int(cfg.head_dim * rope.get("partial_rotary_factor", 1.0)))
        w.add_rope_scaling_orig_ctx_len(cfg.original_max_position_embeddings)
        w.add_sliding_window(cfg.sliding_window or 0)
        for which in ("long", "short"):
            w.add_tensor(f"rope_factors_{which}.weight", np.array(rope[f"{which}_factor"], dtype=np.float32))
    for hf_name, tensor in hf.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        data = tensor.float().numpy()
        if arch.startswith("gemma") and hf_name.endswith("norm.weight"):
            data = data + 1.0
        add_gguf_tensor(w, _gguf_name(hf_name, arch), data, qtype_name)
    finish_gguf(w)


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0"])
@pytest.mark.parametrize("name", list(_GGUF_ARCH))
def test_gguf_file_loads_to_transformers_tokens(name, qtype, tmp_path, monkeypatch):
    """The family's weights written as a GGUF file (its metadata read from the file: windows,
    soft-caps, rope bases and scaling, longrope factors) load to the tokens of transformers run
    on the values the file holds, and to its logprobs within 2e-4.

    The quantized types run on their blocks (Q5_0 as Q8_0 blocks of its values), whose kernels
    quantize activations per block of 32 as llama.cpp does: there the logprobs are held within
    0.3 (measured when written: 0.19 at most, Phi-3's random weights, whose norms scale by up to
    1.5), as near-ties of random weights flip under that rounding. The same file with the kernels
    off (its blocks dequantized once at load) is then held to the exact tokens, which shows the
    gap is the activations' rounding alone. (The K-quants need rows of 256: not at hidden 64.)"""
    from engine.kernels import quant

    path = str(tmp_path / f"{name}.{qtype}.gguf")
    write_gguf(_hf_model(name), name, path, qtype)
    hf = as_read_back(_hf_model(name), qtype)
    want = hf_prompt_logprobs(hf, PROMPTS[0])
    runner = make_runner(path, block_size=4, tokenizer=default_tokenizer_path())
    assert type(runner.model) is get_model_class(FAMILIES[name][1]["architectures"][0])
    if qtype not in ("F32", "F16"):
        runs_as = "Q8_0" if qtype == "Q5_0" else qtype
        assert {p.method.format for layer in runner.model.layers for p in layer.linears()} == {runs_as}
        rows = step(runner, [make_request("p", PROMPTS[0], prompt_logprobs=0)]).prompt_logprobs["p"].logprobs
        assert [row[0] for row in rows] == pytest.approx(want, abs=0.3)
        monkeypatch.setattr(quant, "SUPPORTED_TYPES", ())
        runner = make_runner(path, block_size=4, tokenizer=default_tokenizer_path())
    rows = step(runner, [make_request("p", PROMPTS[0], prompt_logprobs=0)]).prompt_logprobs["p"].logprobs
    assert [row[0] for row in rows] == pytest.approx(want, abs=2e-4)
    for r in generate_prompts(runner, PROMPTS, 40, 4):
        assert r.output_token_ids == hf_greedy(hf, r.prompt_token_ids, 40)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("attn_logit_softcapping", "fifty", "gemma2.attn_logit_softcapping must be a number, got 'fifty'"),
        ("block_count", 0, "num_hidden_layers must be a positive integer, got 0"),
    ],
)
def test_gguf_metadata_that_cannot_build_the_model_is_refused_naming_the_key(key, value, message, tmp_path):
    """A file's metadata is input: a value of the wrong type or size is a ValueError naming it,
    before any model is built."""
    name, path = "gemma2", str(tmp_path / "bad.gguf")
    write_gguf(_hf_model(name), name, path, "F32")
    import gguf

    reader_meta = {f.name: f for f in gguf.GGUFReader(path).fields.values()}
    w = gguf.GGUFWriter(str(tmp_path / "worse.gguf"), "gemma2")
    for field_name, field in reader_meta.items():
        if field_name.startswith(("GGUF.", "general.architecture")) or field_name == f"gemma2.{key}":
            continue
        w.add_key_value(field_name, field.contents(), field.types[0])
    w.add_key_value(
        f"gemma2.{key}", value, gguf.GGUFValueType.STRING if isinstance(value, str) else gguf.GGUFValueType.UINT32
    )
    w.add_tensor("token_embd.weight", np.zeros((512, 64), dtype=np.float32))
    finish_gguf(w)
    with pytest.raises(ValueError, match=message):
        EngineArgs(model=str(tmp_path / "worse.gguf"), tokenizer=default_tokenizer_path()).create_engine_config()


def test_a_fused_projection_of_the_wrong_shape_is_refused_naming_it(tmp_path):
    """Phi-3's fused qkv_proj is reordered only once its shape is the config's: a checkpoint whose
    tensor has other rows is the loader's one-line error naming the tensor, not an IndexError."""
    from safetensors.torch import load_file, save_file

    hf = _hf_model("phi3")
    hf.save_pretrained(str(tmp_path))
    weights = load_file(f"{tmp_path}/model.safetensors")
    weights["model.layers.1.self_attn.qkv_proj.weight"] = weights["model.layers.1.self_attn.qkv_proj.weight"][:40]
    save_file(weights, f"{tmp_path}/model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"tensor 'model.layers.1.self_attn.qkv_proj.weight' has shape \[40, 64\]"):
        make_runner(str(tmp_path))
