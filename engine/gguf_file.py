"""A GGUF file's header, metadata and tensor index, read without torch or ``gguf.GGUFReader``.

Why: ``GGUFReader`` builds a numpy view of every metadata value, the default model's
49k-token vocabulary and merges included: 8 of the loader's 8.4 s on a loaded 2-core host.
transformers' ``AutoConfig`` on a GGUF reads it all too (~10-20 s), once in each process.
Here the header, the scalar metadata and the tensor infos are parsed (GGUF v2/v3), arrays
are skipped over, and tensors are uint8 views of the mapped file. ``config_dict`` maps the
metadata of the architectures ringllm runs to config.json's fields, as transformers'
GGUF mapping does, so the config comes from engine/hf_config.py like a directory's. The
``gguf`` package still gives the block sizes (``GGML_QUANT_SIZES``).
"""

from __future__ import annotations

import mmap
import struct
from typing import Any, Optional

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    def __init__(self, buf: Any) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("<Q")
        self.pos += n
        return bytes(self.buf[self.pos - n : self.pos]).decode("utf-8", "replace")

    def value(self, vtype: int) -> Any:
        """A metadata value; an array is skipped over and given as ``ArrayLength``."""
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.take("<I"), self.take("<Q")
            if etype in _SCALARS:
                self.pos += struct.calcsize(_SCALARS[etype]) * count
            else:
                for _ in range(count):
                    self.value(etype)
            return ArrayLength(count)
        return self.take(_SCALARS[vtype])


class ArrayLength(int):
    """A metadata array, skipped: its length only."""


class TensorInfo:
    __slots__ = ("name", "shape", "qtype", "data")

    def __init__(self, name: str, shape: list[int], qtype: int, data: Any) -> None:
        self.name, self.shape, self.qtype, self.data = name, shape, qtype, data  # shape: ne0 (in) first


def read_tensor_index(path: str, with_data: bool = True) -> tuple[dict[str, Any], list["TensorInfo"]]:
    """(scalar metadata, tensors as uint8 views of the mapped file) of a GGUF v2/v3 file;
    arrays in the metadata are given as their length. ``with_data=False``: tensors without
    their data (no numpy, no gguf package: what the frontend's config needs)."""
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    cur = _Cursor(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"model: {path} is not a GGUF file")
    cur.pos = 4
    version, n_tensors, n_kv = cur.take("<I"), cur.take("<Q"), cur.take("<Q")
    if version not in (2, 3):
        raise ValueError(f"model: {path}: GGUF version {version} is not supported (2 or 3)")
    meta = {}
    for _ in range(n_kv):
        key, vtype = cur.string(), cur.take("<I")
        meta[key] = cur.value(vtype)
    infos = []
    for _ in range(n_tensors):
        name, n_dims = cur.string(), cur.take("<I")
        shape = [cur.take("<Q") for _ in range(n_dims)]
        infos.append((name, shape, cur.take("<I"), cur.take("<Q")))
    if not with_data:
        return meta, [TensorInfo(name, shape, qtype, None) for name, shape, qtype, _ in infos]
    import gguf
    import numpy as np

    align = int(meta.get("general.alignment") or 32)
    start = -(-cur.pos // align) * align
    whole = np.frombuffer(buf, dtype=np.uint8)
    tensors = []
    for name, shape, qtype, offset in infos:
        per_block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
        nbytes = int(np.prod(shape)) // per_block * block_bytes
        tensors.append(TensorInfo(name, shape, qtype, whole[start + offset : start + offset + nbytes]))
    return meta, tensors


# llama.cpp's metadata key (after "<arch>.") -> config.json's field, for the architectures ringllm runs
_FIELDS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "rope.dimension_count": "head_dim",
    "attention.key_length": "head_dim",
    "vocab_size": "vocab_size",
    "attention.sliding_window": "sliding_window",
    # Gemma 2/3 (the pattern and local base where the file has them; else the families' defaults,
    # which are llama.cpp's own: every 2nd / 6th layer global, local base 10000)
    "attn_logit_softcapping": "attn_logit_softcapping",
    "final_logit_softcapping": "final_logit_softcapping",
    "attention.sliding_window_pattern": "sliding_window_pattern",
    "rope.freq_base_swa": "rope_local_base_freq",
    "rope.scaling.original_context_length": "original_max_position_embeddings",
    # experts (Qwen3-MoE, Mixtral as "llama" with an expert count, OLMoE): see _moe_fields
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
    "expert_weights_norm": "norm_topk_prob",
}
_ARCHS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
}
_MODEL_TYPES = {"gemma3": "gemma3_text", "qwen3moe": "qwen3_moe"}
# llama.cpp's graphs renormalise the top-k expert weights for these architectures when the file has no
# expert_weights_norm (its qwen3moe and llama graphs always do, its olmoe graph never does)
_MOE_NORM_TOPK = {"qwen3moe": True, "llama": True, "olmoe": False}
_F32 = 0  # GGML's type id  # the text model's config class in transformers
# llama.cpp's Gemma rule for query_pre_attn_scalar, which its files do not store: head_dim, except
# the 27B models (46 layers for Gemma 2, 62 for Gemma 3), whose scalar is hidden / heads.
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def config_dict(path: str) -> Optional[dict[str, Any]]:
    """config.json's fields from a GGUF's metadata, or None for an architecture not mapped here
    (transformers reads those)."""
    meta, tensors = read_tensor_index(path, with_data=False)
    arch = meta.get("general.architecture")
    if arch not in _ARCHS:
        return None
    cfg: dict[str, Any] = {"model_type": _MODEL_TYPES.get(arch, arch), "architectures": [_ARCHS[arch]]}
    for key, field in _FIELDS.items():
        value = meta.get(f"{arch}.{key}")
        if isinstance(value, str) or (isinstance(value, bool) and field != "norm_topk_prob"):  # numbers but one
            raise ValueError(f"model: {path}: {arch}.{key} must be a number, got {value!r}")
        if value is not None and not isinstance(value, ArrayLength):
            cfg[field] = value
    _required(path, arch, meta, cfg)
    if "vocab_size" not in cfg and isinstance(meta.get("tokenizer.ggml.tokens"), ArrayLength):
        cfg["vocab_size"] = int(meta["tokenizer.ggml.tokens"])
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        if f"tokenizer.ggml.{key}" in meta:
            cfg[key.replace("padding", "pad")] = meta[f"tokenizer.ggml.{key}"]
    cfg["tie_word_embeddings"] = not any(t.name == "output.weight" for t in tensors)
    if arch in _GEMMA_27B_LAYERS:
        _gemma_fields(arch, meta, cfg)
    elif arch == "phi3":
        _phi3_fields(path, meta, cfg, {t.name for t in tensors})
    if arch in _MOE_NORM_TOPK:
        _moe_fields(path, arch, cfg, tensors)
    return cfg


# Keys llama.cpp's loader requires of these architectures (as one number each): a file without one
# is refused, never filled from a transformers class default. feed_forward_length may be missing
# from a Qwen3-MoE file whose every layer is sparse (its dense width is then never used).
_REQUIRED = (
    "context_length",
    "embedding_length",
    "block_count",
    "attention.head_count",
    "attention.layer_norm_rms_epsilon",
    "feed_forward_length",
)
LLAMA_CPP_ROPE_BASE = 10000.0  # llama.cpp's rope base for a file without rope.freq_base


def _required(path: str, arch: str, meta: dict[str, Any], cfg: dict[str, Any]) -> None:
    """The keys every file must state, and llama.cpp's rope base where it states none (not the
    class default of transformers, which is 1e6 for Mixtral and Gemma 3's global layers)."""
    for key in _REQUIRED:
        if key == "feed_forward_length" and arch == "qwen3moe":
            continue  # checked by _moe_fields, which knows the dense layers
        if not isinstance(meta.get(f"{arch}.{key}"), (int, float)) or isinstance(meta[f"{arch}.{key}"], ArrayLength):
            raise ValueError(
                f"model: {path}: {arch}.{key} must be one number in the file, got "
                f"{_described(meta.get(f'{arch}.{key}'))}"
            )
    cfg.setdefault("rope_theta", LLAMA_CPP_ROPE_BASE)


def _described(value: Any) -> str:
    return f"an array of {int(value)} values" if isinstance(value, ArrayLength) else repr(value)


def _moe_fields(path: str, arch: str, cfg: dict[str, Any], tensors: list[TensorInfo]) -> None:
    """Experts as the file states them: a "llama" file with an expert count is Mixtral; the
    count and the experts used per token must be in the file (a class default of 128 or 8 would
    be a guess); the experts' width is expert_feed_forward_length for Qwen3-MoE (else its
    tensors' own), feed_forward_length for the others; top-k renormalisation is
    expert_weights_norm where the file has it, else llama.cpp's rule for the architecture.
    Qwen3-MoE layers without a router are dense (its ``mlp_only_layers``)."""
    if arch == "llama":
        if not cfg.get("num_experts"):
            for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob"):
                cfg.pop(key, None)
            return  # a dense Llama
        cfg.update(model_type="mixtral", architectures=["MixtralForCausalLM"])
    for key, field in (("expert_count", "num_experts"), ("expert_used_count", "num_experts_per_tok")):
        value = cfg.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"model: {path}: {arch}.{key} must be a positive integer, got {value!r}")
    cfg.setdefault("norm_topk_prob", _MOE_NORM_TOPK[arch])
    if arch == "llama":
        cfg["num_local_experts"] = cfg.pop("num_experts")
    if arch != "qwen3moe":
        cfg.pop("moe_intermediate_size", None)
        return
    if "moe_intermediate_size" not in cfg:
        gate = next((t for t in tensors if t.name.endswith("ffn_gate_exps.weight") and len(t.shape) == 3), None)
        if gate is None:
            raise ValueError(
                f"model: {path}: qwen3moe.expert_feed_forward_length is missing and no expert tensor has it"
            )
        cfg["moe_intermediate_size"] = int(gate.shape[1])
    routed = {t.name.split(".")[1] for t in tensors if t.name.startswith("blk.") and ".ffn_gate_inp." in t.name}
    cfg["decoder_sparse_step"] = 1
    cfg["mlp_only_layers"] = [i for i in range(int(cfg.get("num_hidden_layers") or 0)) if str(i) not in routed]
    if cfg["mlp_only_layers"] and "intermediate_size" not in cfg:
        raise ValueError(
            f"model: {path}: qwen3moe.feed_forward_length is missing and layers {cfg['mlp_only_layers'][:8]} are dense"
        )
    cfg.setdefault("intermediate_size", cfg["moe_intermediate_size"])  # no dense layer: never used


def _gemma_fields(arch: str, meta: dict[str, Any], cfg: dict[str, Any]) -> None:
    big = cfg.get("num_hidden_layers") == _GEMMA_27B_LAYERS[arch]
    cfg["query_pre_attn_scalar"] = cfg["hidden_size"] // cfg["num_attention_heads"] if big else cfg["head_dim"]
    kind = meta.get(f"{arch}.rope.scaling.type")
    if kind not in (None, "none"):
        if f"{arch}.rope.scaling.factor" not in meta:
            raise ValueError(f"model: {arch}.rope.scaling.type is {kind!r} but {arch}.rope.scaling.factor is missing")
        cfg["rope_scaling"] = {"rope_type": kind, "factor": meta[f"{arch}.rope.scaling.factor"]}


def _phi3_fields(path: str, meta: dict[str, Any], cfg: dict[str, Any], names: set[str]) -> None:
    """Phi-3's rope dims are the rotary ones (Phi-4-mini rotates 3/4 of each head), a window of
    0 means none (llama.cpp's mark for Phi-4), and longrope's factors are two small tensors."""
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    rotary = cfg.pop("head_dim", head_dim)
    cfg["head_dim"] = head_dim
    if rotary != head_dim:
        cfg["partial_rotary_factor"] = rotary / head_dim
    if not cfg.get("sliding_window"):
        cfg["sliding_window"] = None
    if {"rope_factors_long.weight", "rope_factors_short.weight"} <= names:
        import numpy as np

        factors = {t.name: t for t in read_tensor_index(path)[1] if t.name.startswith("rope_factors_")}
        if any(t.qtype != _F32 for t in factors.values()):
            raise ValueError(f"model: {path}: rope_factors_long/short must be F32 tensors")
        factors = {name: t.data.view(np.float32).tolist() for name, t in factors.items()}
        cfg["rope_scaling"] = {
            "rope_type": "longrope",
            "long_factor": factors["rope_factors_long.weight"],
            "short_factor": factors["rope_factors_short.weight"],
        }
        if "phi3.rope.scaling.attn_factor" in meta:
            cfg["rope_scaling"]["attention_factor"] = meta["phi3.rope.scaling.attn_factor"]
        if cfg.get("partial_rotary_factor"):
            cfg["rope_scaling"]["partial_rotary_factor"] = cfg["partial_rotary_factor"]
