"""Tiny random-weight transformers checkpoints for the model-family tests: building them, running a
runner's prompts over them, writing their weights as GGUF files (llama.cpp's layout) and the values
a GGUF type reads back as, and ``LLM`` end to end on a directory of them."""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from tests.helpers.runner_utils import generate, make_request, step

# the prompts ``LLM`` generates from end to end
TEXTS = ["The capital of France is", "Once upon a time, in a small village by the sea, there lived"]


def random_hf_model(config_cls, config: dict, adjust: Callable[[str, torch.nn.Parameter], None]):
    """An eager float32 transformers model of ``config``, seeded; ``adjust(name, param)`` runs on each
    parameter under no_grad (non-default norms, scaled routers)."""
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config_cls(**config), dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            adjust(pname, p)
    return hf


def saved_family(name: str, tmp_path_factory, build: Callable[[str], object]):
    """(name, checkpoint dir, HF model): ``build(name)`` saved to a fresh directory."""
    path = str(tmp_path_factory.mktemp(name))
    hf = build(name)
    hf.save_pretrained(path)
    return name, path, hf


def use_torch_ops(monkeypatch) -> None:
    """The CPU forward on torch's ops: the C kernels and the paged decode kernel reported unsupported."""
    from engine.kernels import paged_attention
    from engine.models import cpu_forward

    monkeypatch.setattr(cpu_forward.CKernelForward, "supports", staticmethod(lambda *a: False))
    monkeypatch.setattr(paged_attention, "supports", lambda *a: False)


def chunked_prompt_logprobs(
    runner,
    prompts: list[list[int]],
    chunk: Optional[int],
    around: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
):
    """(requests, {request id: each prompt token's logprob}): the prompts prefilled in steps of
    ``chunk`` tokens (all at once with None), each step inside ``around()``."""
    reqs = [make_request(str(i), p, prompt_logprobs=0) for i, p in enumerate(prompts)]
    got = {r.request_id: [] for r in reqs}
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in reqs):
        with around():
            out = step(runner, [r for r in reqs if r.num_computed_tokens < r.num_prompt_tokens], chunk)
        for req_id, rows in out.prompt_logprobs.items():
            got[req_id].extend(row[0] for row in rows.logprobs)
    return reqs, got


def generate_prompts(runner, prompts: list[list[int]], n: int, chunk: Optional[int] = None):
    """One greedy request per prompt, ``n`` tokens each, generated together; the requests."""
    reqs = [make_request(str(i), p) for i, p in enumerate(prompts)]
    generate(runner, reqs, n, chunk)
    return reqs


# ---------------------------------------------------------------- GGUF files


def gguf_writer(path: str, arch: str, cfg):
    """A ``gguf.GGUFWriter`` with the metadata every family's file has, read from ``cfg``."""
    import gguf

    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_embedding_length(cfg.hidden_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    return w


def quantize(data: np.ndarray, qtype_name: str) -> np.ndarray:
    """``data`` (``[..., in]``) as the blocks of a quantized GGUF type: gguf's quantizer for the
    32-weight types, engine/kernels/quant_blocks.py's for the K-quants (which gguf lacks)."""
    import gguf

    qtype = gguf.GGMLQuantizationType[qtype_name]
    if qtype_name not in ("Q4_K", "Q5_K", "Q6_K"):
        return gguf.quants.quantize(data, qtype)
    from engine.kernels.quant_blocks import quantize_k

    rows = data.reshape(-1, data.shape[-1])
    return quantize_k(rows, int(qtype)).reshape(*data.shape[:-1], -1)


def add_gguf_tensor(w, name: str, data: np.ndarray, qtype_name: str, f32: bool = False) -> None:
    """``data`` as ``qtype_name`` (F32, F16 or a quantized type); vectors, and ``f32`` tensors, F32."""
    import gguf

    if f32 or data.ndim == 1 or qtype_name == "F32":
        w.add_tensor(name, data.astype(np.float32))
    elif qtype_name == "F16":
        w.add_tensor(name, data.astype(np.float16))
    else:
        q = quantize(data, qtype_name)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType[qtype_name])


def llama_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's q/k row order for a "llama" file (its ``LlamaModel.permute``)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def finish_gguf(w) -> None:
    """Header, metadata and tensors written; the file closed."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def as_read_back(hf, qtype_name: str, keep: Callable[[str], bool] = lambda pname: False):
    """``hf`` with each matrix (but those ``keep`` names) replaced by the values its GGUF type holds
    (the float32 reference)."""
    import gguf

    qtype = gguf.GGMLQuantizationType[qtype_name]
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if p.dim() >= 2 and qtype_name != "F32" and not keep(pname):
                data = p.numpy()
                back = (
                    data.astype(np.float16).astype(np.float32)
                    if qtype_name == "F16"
                    else gguf.quants.dequantize(quantize(data, qtype_name), qtype)
                )
                p.copy_(torch.from_numpy(back))
    return hf


# ---------------------------------------------------------------- end to end


def llm_generate_texts(hf, path: str):
    """``hf`` saved to ``path`` and run by ``LLM`` (float32, CPU, the default model's tokenizer) on
    TEXTS, 24 greedy tokens each past eos; [(output, the text's token ids)]."""
    from transformers import AutoTokenizer

    from engine import LLM, SamplingParams
    from engine.models.default_model import default_tokenizer_path

    hf.save_pretrained(path)
    tok = AutoTokenizer.from_pretrained(default_tokenizer_path())
    llm = LLM(
        model=path,
        tokenizer=default_tokenizer_path(),
        dtype="float32",
        device="cpu",
        max_model_len=256,
        kv_cache_memory=32 << 20,
        block_size=16,
    )
    try:
        outs = llm.generate(TEXTS, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    finally:
        llm.shutdown()
    return [(out, tok(text, add_special_tokens=False)["input_ids"]) for text, out in zip(TEXTS, outs)]
