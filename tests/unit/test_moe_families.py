"""Qwen3-MoE, Mixtral and OLMoE against transformers in float32 (eager attention), from HF
directories and from GGUF files written here with ``gguf.GGUFWriter`` as llama.cpp's converter
writes them (stacked expert tensors, its metadata keys).

Each family is a tiny random-weight checkpoint with its real head/group structure (4 query heads
over 2 KV heads), >= 2 layers, 4 experts with top-2 routing, and what makes the family: Qwen3-MoE's
per-head q/k norms, renormalised top-k (``norm_topk_prob``) and a dense layer among sparse ones
(``mlp_only_layers``), its experts narrower than its dense MLP; Mixtral's always renormalised
top-2 and its checkpoint names (``block_sparse_moe``, ``w1/w2/w3``); OLMoE's q/k norms over the
whole projections and top-k weights left as the softmax gave them. Norm weights are random, so a
q/k norm applied per head where it should be whole (or the reverse) shows.
"""

from __future__ import annotations

import numpy as np
import pytest
from transformers import MixtralConfig, OlmoeConfig, Qwen3MoeConfig

from engine.models import get_model_class
from engine.models.default_model import default_tokenizer_path
from tests.helpers.hf_families import (
    add_gguf_tensor,
    as_read_back,
    chunked_prompt_logprobs,
    finish_gguf,
    generate_prompts,
    gguf_writer,
    llama_permute,
    random_hf_model,
    saved_family,
    use_torch_ops,
)
from tests.helpers.runner_utils import generate, make_request, make_runner, step
from tests.unit.test_models import PROMPTS, hf_greedy, hf_prompt_logprobs

TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=64,
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
    num_experts_per_tok=2,
)
FAMILIES = {
    "qwen3-moe": (
        Qwen3MoeConfig,
        dict(
            architectures=["Qwen3MoeForCausalLM"],
            num_experts=4,
            intermediate_size=96,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            mlp_only_layers=[1],
        ),
    ),
    "mixtral": (MixtralConfig, dict(architectures=["MixtralForCausalLM"], num_local_experts=4)),
    "olmoe": (OlmoeConfig, dict(architectures=["OlmoeForCausalLM"], num_experts=4, norm_topk_prob=False)),
}
NUM_TOKENS = 32
ROUTER_SCALE = 4.0


def _adjust(pname, p):
    if pname.endswith("norm.weight"):
        p.uniform_(0.5, 1.5)
    if pname.endswith("gate.weight"):  # routers: margins between experts above Q8_0's rounding
        p.mul_(ROUTER_SCALE)


def hf_moe_model(name: str, **changes):
    cls, extra = FAMILIES[name]
    return random_hf_model(cls, {**TINY, **extra, **changes}, _adjust)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(name, checkpoint dir, HF model) for one family, random weights."""
    return saved_family(request.param, tmp_path_factory, hf_moe_model)


@pytest.mark.parametrize("chunk", [None, 5])
def test_prompt_logprobs_match_transformers(family, chunk):
    name, path, hf = family
    runner = make_runner(path, block_size=4)
    reqs, got = chunked_prompt_logprobs(runner, PROMPTS, chunk)
    for r in reqs:
        assert got[r.request_id] == pytest.approx(hf_prompt_logprobs(hf, r.prompt_token_ids), abs=2e-4)


@pytest.mark.parametrize("kernels", [True, False], ids=["c-kernels", "torch-ops"])
@pytest.mark.parametrize("chunk", [None, 4])
def test_greedy_batch_matches_transformers(family, chunk, kernels, monkeypatch):
    """Decodes and prefill chunks share steps, so a step's experts see tokens of several
    requests at once; both CPU forwards."""
    if not kernels:
        use_torch_ops(monkeypatch)
    name, path, hf = family
    runner = make_runner(path, block_size=4)
    assert runner.model.backend == ("cpu-kernels" if kernels else "torch")
    for r in generate_prompts(runner, PROMPTS, NUM_TOKENS, chunk):
        assert r.output_token_ids == hf_greedy(hf, r.prompt_token_ids, NUM_TOKENS)


@pytest.mark.parametrize(
    "args",
    [dict(dtype="bfloat16"), dict(dtype="float16"), dict(quantization="int8"), dict(deterministic=True)],
    ids=["bf16", "fp16", "int8", "deterministic"],
)
def test_other_weight_formats_track_float32(family, args):
    """Half precision, W8A8 experts and the deterministic path run the experts too: held as
    ``assert_tracks`` says (the deterministic path, float32, to 2e-4)."""
    name, path, hf = family
    runner = make_runner(path, block_size=4, **args)
    req = make_request("h", PROMPTS[0], prompt_logprobs=0)
    out, out2 = step(runner, [req], 8), step(runner, [req])
    got = [row[0] for o in (out, out2) for row in o.prompt_logprobs["h"].logprobs]
    want = hf_prompt_logprobs(hf, PROMPTS[0])
    if args.get("deterministic"):
        assert got == pytest.approx(want, abs=2e-4)
        return
    assert_tracks(got, want)


def assert_tracks(got: list[float], want: list[float]) -> None:
    """Logprobs under rounding (half precision, quantized weights or activations) against
    float32's: a median gap under 0.15, which a wrong expert or weight would exceed at once, and
    a maximum under 2.0, since rounding flips an expert choice where two probabilities nearly
    tie, and a flipped choice moves that position's logprob by up to a nat or so (measured when
    written: median 0.04-0.10; maximum 1.53, Mixtral's W8A8, 0.54 its Q8_0, where layer 0 token 3
    chose between experts at 0.0183 and 0.0169). Routers are scaled up (ROUTER_SCALE) to make such
    ties rarer; at scale 1 Q8_0 flipped four of Mixtral's 20 positions."""
    gaps = sorted(abs(g - w) for g, w in zip(got, want))
    assert gaps[len(gaps) // 2] < 0.15 and gaps[-1] < 2.0, gaps


def test_a_single_stream_decodes_to_transformers_tokens(family):
    """One request alone: every decode step is one token (``SparseMoE``'s single-token path)."""
    name, path, hf = family
    runner = make_runner(path, block_size=4)
    req = make_request("s", PROMPTS[1])
    generate(runner, [req], NUM_TOKENS)
    assert req.output_token_ids == hf_greedy(hf, PROMPTS[1], NUM_TOKENS)


def _count_expert_calls(model) -> list[list[int]]:
    """Per sparse layer, how many times each expert's gate/up projection runs (wrapped in place)."""
    counts = []
    for layer in model.layers:
        if layer.moe is None:
            continue
        calls = [0] * layer.moe.dims.num_experts
        for e, linear in enumerate(layer.moe.gate_up):
            method, apply = linear.method, linear.method.apply

            def counted(x, bias=None, _e=e, _calls=calls, _apply=apply):
                _calls[_e] += 1
                return _apply(x, bias)

            method.apply = counted
        counts.append(calls)
    return counts


def test_a_step_runs_each_chosen_expert_once_and_a_single_decode_only_its_top_k(family):
    """Grouped by expert: a prefill step of three prompts calls each expert at most once per
    layer (one GEMM over all its rows); a one-token decode calls exactly top-k experts, so no
    other expert's weights are read."""
    name, path, _ = family
    runner = make_runner(path, block_size=4)
    counts = _count_expert_calls(runner.model)
    assert len(counts) == (2 if name == "qwen3-moe" else 3)  # Qwen3-MoE's layer 1 is dense
    reqs = [make_request(str(i), p) for i, p in enumerate(PROMPTS)]
    step(runner, reqs)
    assert all(max(calls) == 1 and sum(calls) >= 2 for calls in counts)
    for calls in counts:
        calls[:] = [0] * len(calls)
    step(runner, reqs[2:])  # one request, one token
    assert all(sorted(calls) == [0, 0, 1, 1] for calls in counts)


def test_each_family_is_its_registered_class_with_its_routing(family):
    name, path, _ = family
    runner = make_runner(path, block_size=4)
    model, moe = runner.model, runner.model.dims.moe
    assert type(model) is get_model_class(runner.config.model_config.architecture)
    assert (moe.num_experts, moe.top_k) == (4, 2)
    assert moe.renormalize is (name != "olmoe")
    assert runner.model.dims.qk_norm is (name != "mixtral") and runner.model.dims.qk_norm_whole is (name == "olmoe")
    assert moe.sparse_layers == ((True, False, True) if name == "qwen3-moe" else (True, True, True))


def test_dummy_weights_build_every_family(family):
    """load_format='dummy' (benchmarks) builds the experts and router under each family's names."""
    name, path, _ = family
    runner = make_runner(path, block_size=4, load_format="dummy")
    out = step(runner, [make_request("d", PROMPTS[0])])
    assert len(out.sampled_token_ids) == 1


@pytest.mark.parametrize(
    "name, changes, message",
    [
        ("mixtral", dict(num_experts_per_tok=5), r"num_experts_per_tok \(5\) must not exceed num_experts \(4\)"),
        ("qwen3-moe", dict(num_experts=0), "num_experts must be a positive integer, got 0"),
        ("qwen3-moe", dict(num_experts=10**9), "num_experts must be at most 4096, got 1000000000"),
        ("qwen3-moe", dict(decoder_sparse_step=0), "decoder_sparse_step must be a positive integer, got 0"),
        ("olmoe", dict(clip_qkv=8.0), "clip_qkv=8.0 is not supported"),
    ],
)
def test_expert_config_values_that_cannot_run_are_refused_naming_the_field(name, changes, message, tmp_path):
    cls, extra = FAMILIES[name]
    cls(**{**TINY, **extra, **changes}).save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match=message):
        make_runner(str(tmp_path), load_format="dummy")


def test_an_expert_past_num_experts_is_refused_naming_it(tmp_path):
    from safetensors.torch import load_file, save_file

    hf_moe_model("olmoe").save_pretrained(str(tmp_path))
    weights = load_file(f"{tmp_path}/model.safetensors")
    down = "model.layers.0.mlp.experts.{}.down_proj.weight"
    weights[down.format(4)] = weights[down.format(3)].clone()
    save_file(weights, f"{tmp_path}/model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"layers\.0\.experts\.4\.down"):
        make_runner(str(tmp_path))


# ---------------------------------------------------------------- the same weights as GGUF files

_GGUF_ARCH = {"qwen3-moe": "qwen3moe", "mixtral": "llama", "olmoe": "olmoe"}
_LAYER_GGUF = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "block_sparse_moe.gate": "ffn_gate_inp",
}


def _gguf_tensors(hf, arch: str) -> dict[str, np.ndarray]:
    """``hf``'s weights under llama.cpp's names, experts stacked ``[experts, rows, in]`` (transformers
    holds them stacked too, gate and up fused: ``mlp.experts.gate_up_proj`` / ``down_proj``)."""
    cfg, out = hf.config, {}
    for hf_name, tensor in hf.state_dict().items():
        data = tensor.float().numpy()
        base = hf_name.removeprefix("model.").removesuffix(".weight")
        if not base.startswith("layers."):
            out[{"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output"}[base] + ".weight"] = data
            continue
        _, idx, part = base.split(".", 2)
        if part == "mlp.experts.gate_up_proj":
            gate, up = np.split(data, 2, axis=1)
            out[f"blk.{idx}.ffn_gate_exps.weight"], out[f"blk.{idx}.ffn_up_exps.weight"] = gate, up
            continue
        if part == "mlp.experts.down_proj":
            out[f"blk.{idx}.ffn_down_exps.weight"] = data
            continue
        if arch == "llama" and part in ("self_attn.q_proj", "self_attn.k_proj"):
            data = llama_permute(data, cfg.num_attention_heads if "q_proj" in part else cfg.num_key_value_heads)
        out[f"blk.{idx}.{_LAYER_GGUF[part]}.weight"] = data
    return out


def write_moe_gguf(hf, name: str, path: str, qtype_name: str, per_expert: bool = False) -> None:
    """``hf``'s weights and config as llama.cpp's converter writes them; matrices (experts
    included) in ``qtype_name``, norms and the router F32 (llama.cpp never quantizes routers).
    ``per_expert``: one 2-D tensor per expert (``blk.N.ffn_gate.E``), as Mixtral files converted
    before llama.cpp stacked experts are."""
    arch, cfg = _GGUF_ARCH[name], hf.config
    w = gguf_writer(path, arch, cfg)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_expert_count(cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    if arch == "qwen3moe":
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    tensors = _gguf_tensors(hf, arch)
    if per_expert:
        for stacked in [n for n in tensors if "_exps" in n]:
            for e, matrix in enumerate(tensors.pop(stacked)):
                tensors[stacked.replace("_exps.", f".{e}.")] = matrix
    for tname, data in tensors.items():
        add_gguf_tensor(w, tname, data, qtype_name, f32="ffn_gate_inp" in tname)
    finish_gguf(w)


def _as_read_back(hf, qtype_name: str):
    """``hf`` with each matrix but the routers replaced by the values its GGUF type holds."""
    return as_read_back(hf, qtype_name, keep=lambda pname: pname.endswith("gate.weight"))


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_gguf_file_loads_to_transformers_tokens(name, qtype, tmp_path, monkeypatch):
    """The family's weights as a GGUF file (expert count, experts used, expert width, top-k
    renormalisation and Qwen3-MoE's dense layer read from the file) load to the tokens of
    transformers run on the values the file holds, and to its logprobs within 2e-4. Q8_0 experts
    run on their blocks, one quantized linear each, whose kernels quantize activations per block
    as llama.cpp does, each layer's experts stacked for one kernel call per projection
    (engine/models/moe_gguf.py): held as ``assert_tracks`` says. The same file with the kernels off (blocks
    dequantized once) is then held to the exact tokens and 2e-4, which shows the gap is the
    activations' rounding alone."""
    from engine.kernels import quant

    path = str(tmp_path / f"{name}.{qtype}.gguf")
    write_moe_gguf(hf_moe_model(name), name, path, qtype)
    hf = _as_read_back(hf_moe_model(name), qtype)
    want = hf_prompt_logprobs(hf, PROMPTS[0])
    runner = make_runner(path, block_size=4, tokenizer=default_tokenizer_path())
    assert type(runner.model) is get_model_class(FAMILIES[name][1]["architectures"][0])
    assert runner.model.dims.moe == make_runner_dims(name)
    if qtype == "Q8_0":
        experts = {p.method.format for layer in runner.model.layers if layer.moe for p in layer.moe.gate_up}
        assert experts == {"Q8_0"}
        assert all(layer.moe.gguf is not None for layer in runner.model.layers if layer.moe)  # one call a projection
        rows = step(runner, [make_request("p", PROMPTS[0], prompt_logprobs=0)]).prompt_logprobs["p"].logprobs
        assert_tracks([row[0] for row in rows], want)
        monkeypatch.setattr(quant, "SUPPORTED_TYPES", ())
        runner = make_runner(path, block_size=4, tokenizer=default_tokenizer_path())
    rows = step(runner, [make_request("p", PROMPTS[0], prompt_logprobs=0)]).prompt_logprobs["p"].logprobs
    assert [row[0] for row in rows] == pytest.approx(want, abs=2e-4)
    for r in generate_prompts(runner, PROMPTS, NUM_TOKENS, 4):
        assert r.output_token_ids == hf_greedy(hf, r.prompt_token_ids, NUM_TOKENS)


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_an_early_mixtral_gguf_with_one_tensor_per_expert_loads_to_transformers_tokens(qtype, tmp_path, monkeypatch):
    """Mixtral files converted before llama.cpp stacked experts (``blk.N.ffn_gate.E.weight``, e.g.
    the widely shared Q4_K_M conversions of early 2024) load to the same tokens."""
    from engine.kernels import quant

    path = str(tmp_path / "mixtral.gguf")
    write_moe_gguf(hf_moe_model("mixtral"), "mixtral", path, qtype, per_expert=True)
    hf = _as_read_back(hf_moe_model("mixtral"), qtype)
    monkeypatch.setattr(quant, "SUPPORTED_TYPES", ())  # exact: the blocks dequantized once
    runner = make_runner(path, block_size=4, tokenizer=default_tokenizer_path())
    for r in generate_prompts(runner, PROMPTS, NUM_TOKENS, 4):
        assert r.output_token_ids == hf_greedy(hf, r.prompt_token_ids, NUM_TOKENS)


def make_runner_dims(name: str):
    """The expert dims the HF directory gives: what the GGUF's metadata must give too."""
    return get_model_class(FAMILIES[name][1]["architectures"][0]).dims_from_config(hf_moe_model(name).config).moe


def _without_key(name: str, drop: str, tmp_path) -> str:
    """The family's F32 GGUF file written again without the metadata key ``<arch>.<drop>``."""
    import gguf

    arch = _GGUF_ARCH[name]
    src = str(tmp_path / "src.gguf")
    write_moe_gguf(hf_moe_model(name), name, src, "F32")
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture" or field.name == f"{arch}.{drop}":
            continue
        w.add_key_value(field.name, field.contents(), field.types[0])
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_shape=list(reversed([int(n) for n in t.shape])))
    finish_gguf(w)
    return str(tmp_path / "bad.gguf")


@pytest.mark.parametrize(
    "name, drop, message",
    [
        ("qwen3-moe", "expert_count", "qwen3moe.expert_count must be a positive integer, got None"),
        ("olmoe", "expert_used_count", "olmoe.expert_used_count must be a positive integer, got None"),
        (
            "mixtral",
            "attention.layer_norm_rms_epsilon",
            "llama.attention.layer_norm_rms_epsilon must be one number in the file, got None",
        ),
        ("olmoe", "feed_forward_length", "olmoe.feed_forward_length must be one number in the file, got None"),
    ],
)
def test_a_gguf_without_a_key_llama_cpp_requires_is_refused_naming_it(name, drop, message, tmp_path):
    """The expert counts, the norms' epsilon and the MLP width come from the file, never from a
    transformers class default (Mixtral's would be 8 experts of 14336, OLMoE's 64 of 2048)."""
    with pytest.raises(ValueError, match=message):
        make_runner(_without_key(name, drop, tmp_path), block_size=4, tokenizer=default_tokenizer_path())


def test_a_mixtral_gguf_without_a_rope_base_takes_llama_cpps_not_transformers(tmp_path):
    """llama.cpp reads a file without rope.freq_base at base 10000; MixtralConfig's default is 1e6."""
    from engine.gguf_file import LLAMA_CPP_ROPE_BASE, config_dict
    from engine.hf_config import config_from_dict

    path = _without_key("mixtral", "rope.freq_base", tmp_path)
    cfg = config_from_dict(config_dict(path), path)
    assert cfg.rope_theta == LLAMA_CPP_ROPE_BASE == 10000.0
    assert cfg.num_experts == 4 and cfg.intermediate_size == TINY["intermediate_size"]
