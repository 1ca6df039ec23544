"""An EngineConfig on its way to the EngineCore: its canonical encoding, the digest that names it,
and the decoding back (pickle-free: JSON through msgspec).

Canonical: fields and keys sorted (``order="sorted"``), so one config has one encoding and one
digest on both sides. The core decodes what the frontend derived, encodes it again and refuses to
start unless the digest matches the one sent: a core whose code reads the config differently (a
field it does not know, a value that does not survive the trip) stops at launch, naming both
digests, instead of running another config. READY then carries the digest back, so a frontend
attaching to a core it did not start (``--api-server-count``) checks it too.

Two fields are objects rather than data. The model's ``hf_config`` (and the draft model's) travels as its ``to_dict()``
and is rebuilt in its class (ringllm's HFConfig, or transformers' class for its model type).
A ``worker_cls`` given as a class is encoded as its name here (it is part of the digest) and
travels by value as a cloudpickle beside the config (engine/client/core_launcher.py), as before.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable, Optional

import msgspec

from engine.config.engine import EngineConfig
from engine.hf_config import HFConfig

_HF_KIND_RINGLLM = "ringllm"  # engine.hf_config.HFConfig
_HF_KIND_TRANSFORMERS = "transformers"  # a transformers PretrainedConfig, rebuilt for its model_type


def encode_config(config: EngineConfig) -> bytes:
    """The canonical JSON of ``config``: fields and keys sorted."""
    wire = dataclasses.replace(
        config,
        model_config=_model_with(config.model_config, _hf_config_wire),
        draft_model_config=_model_with(config.draft_model_config, _hf_config_wire),
    )
    return msgspec.json.encode(wire, enc_hook=_enc_hook, order="sorted")


def config_digest(config: EngineConfig) -> str:
    return digest_of(encode_config(config))


def digest_of(encoded: bytes) -> str:
    """The name of an encoded config: SHA-256 of its canonical JSON, as hex."""
    return hashlib.sha256(encoded).hexdigest()


def decode_config(encoded: bytes | str, worker_cls: Optional[type] = None) -> EngineConfig:
    """``encode_config``'s output back as an EngineConfig; ``worker_cls``: the class that travelled
    beside it (None when the config names its worker by a string)."""
    config = msgspec.json.decode(encoded, type=EngineConfig)
    return dataclasses.replace(
        config,
        model_config=_model_with(config.model_config, _hf_config_from),
        draft_model_config=_model_with(config.draft_model_config, _hf_config_from),
        worker_cls=config.worker_cls if worker_cls is None else worker_cls,
    )


def _model_with(model: Any, convert: Callable[[Any], Any]) -> Any:
    """A ModelConfig (the target's, or the draft model's: None when there is none) with its
    ``hf_config`` converted for the wire or back."""
    return None if model is None else dataclasses.replace(model, hf_config=convert(model.hf_config))


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, type):  # worker_cls as a class: named here, sent by value beside the config
        return f"{obj.__module__}.{obj.__qualname__}"
    raise NotImplementedError(f"an EngineConfig cannot carry a {type(obj).__name__} ({obj!r})")


def _hf_config_wire(hf_config: Any) -> dict[str, Any]:
    """The model's config as its class's kind and its ``to_dict()``, every key a string as JSON
    has them (``id2label``'s are ints in transformers' to_dict, and come back as ints from its
    class). Explicit, not an enc_hook: transformers 5's configs are dataclasses, which msgspec
    would encode field by field."""
    kind = _HF_KIND_RINGLLM if isinstance(hf_config, HFConfig) else _HF_KIND_TRANSFORMERS
    return {"kind": kind, "values": msgspec.to_builtins(hf_config.to_dict(), str_keys=True, enc_hook=_enc_hook)}


def _hf_config_from(wire: Any) -> Any:
    kind, values = wire["kind"], wire["values"]
    if kind == _HF_KIND_RINGLLM:
        return HFConfig(**values)
    from transformers import AutoConfig  # deferred: only models outside engine/hf_config.py need it

    return AutoConfig.for_model(**values)
