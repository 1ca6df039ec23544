"""What the EngineCore's READY handshake states about its config, and the frontend's check of it.

Both processes derive their ``EngineConfig`` with the same function (``create_engine_config``)
from the same arguments; the core does so on its own so that it can load the model while the
frontend reads the tokenizer. The two derivations can still part (a file changed between the
reads, an environment variable that only one side sees, a bug): the frontend would then
tokenize, bound and schedule for a model the core does not run. The core reports what it
derived, and the frontend refuses to start on any difference, naming the field.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.exceptions import EngineStartupError

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.protocol import EngineReady


def ready_fields(config: EngineConfig) -> dict[str, Any]:
    """The config fields a READY carries (the core sends them, the frontend expects them)."""
    return {"block_size": config.cache_config.block_size, "max_model_len": config.model_config.max_model_len,
            "vocab_size": config.model_config.vocab_size, "dtype": config.model_config.dtype,
            "max_num_seqs": config.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens}


def check_ready(ready: EngineReady, config: EngineConfig, core_name: str) -> None:
    """EngineStartupError unless ``ready`` states the config this frontend derived."""
    differ = [f"{name}: core {getattr(ready, name)!r}, frontend {value!r}"
              for name, value in ready_fields(config).items() if getattr(ready, name) != value]
    if differ:
        raise EngineStartupError(f"{core_name} derived another config than this frontend ({'; '.join(differ)})")
