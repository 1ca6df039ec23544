"""The engine's configuration: ``EngineArgs`` (what a user passes, args.py), ``create_engine_config``
(the one derivation, create.py) and ``EngineConfig`` (its typed, frozen result, engine.py) with
one sub-config module per concern; ``wire.py`` carries a config to the EngineCore and names it by
a digest. The names below are the package's public ones (``from engine.config import ...``)."""

from engine.config.args import AsyncEngineArgs, EngineArgs, non_default_args
from engine.config.cache import CacheConfig
from engine.config.compilation import CompilationConfig
from engine.config.create import create_engine_config
from engine.config.device_config import resolve_device
from engine.config.engine import SEQS_PER_REQUEST_IN_BATCHES, EngineConfig
from engine.config.frontend import FrontendConfig
from engine.config.model import ModelConfig
from engine.config.model_discovery import DEFAULT_MODEL
from engine.config.parallel import ParallelConfig
from engine.config.scheduler import PACED_INITIAL_TOKENS, PACED_STEP_TARGET_S, SchedulerConfig
from engine.kv_events_config import KVEventsConfig
from engine.kv_transfer.config import KVTransferConfig
from engine.spec_decode.config import SpeculativeConfig
from engine.structured_output.config import StructuredOutputsConfig

__all__ = [
    "DEFAULT_MODEL",
    "PACED_INITIAL_TOKENS",
    "PACED_STEP_TARGET_S",
    "SEQS_PER_REQUEST_IN_BATCHES",
    "AsyncEngineArgs",
    "CacheConfig",
    "CompilationConfig",
    "EngineArgs",
    "EngineConfig",
    "FrontendConfig",
    "KVEventsConfig",
    "KVTransferConfig",
    "ModelConfig",
    "ParallelConfig",
    "SchedulerConfig",
    "SpeculativeConfig",
    "StructuredOutputsConfig",
    "create_engine_config",
    "non_default_args",
    "resolve_device",
]
