"""``EngineConfig``: the whole configuration of one engine, as vLLM's VllmConfig: one typed,
frozen sub-config per concern, derived once in the frontend by ``create_engine_config`` and sent
whole to the EngineCore (engine/config/wire.py). Nothing past ``create_engine_config`` reads the
arguments: every consumer reads a typed field here.

Adding a setting: a field in ``EngineArgs`` (args.py), its check and its field in the sub-config
it belongs to (one module each: model.py, cache.py, scheduler.py, parallel.py, frontend.py), or a
new sub-config module with its ``create_*_config(args)`` called from create.py and a field here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from engine.config.cache import CacheConfig
from engine.config.compilation import CompilationConfig
from engine.config.frontend import FrontendConfig
from engine.config.model import ModelConfig
from engine.config.parallel import ParallelConfig
from engine.config.scheduler import SchedulerConfig
from engine.kv_events_config import KVEventsConfig
from engine.kv_transfer.config import KVTransferConfig
from engine.lora.config import LoRAConfig
from engine.spec_decode.config import SpeculativeConfig
from engine.structured_output.config import StructuredOutputsConfig

SEQS_PER_REQUEST_IN_BATCHES = 8  # see EngineConfig.max_seqs_per_request


@dataclass(frozen=True)
class EngineConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig
    compilation_config: CompilationConfig
    device: str  # resolved: cpu | cuda
    num_threads: int  # torch threads in the process that runs the model
    transport: str  # shm | zmq
    ring_capacity: int  # bytes per ring direction
    disable_log_stats: bool
    frontend_config: FrontendConfig = field(default_factory=FrontendConfig)
    structured_outputs_config: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)
    worker_cls: Any = "auto"  # "auto", a dotted path or an engine.worker.Worker subclass (checked)
    kv_transfer_config: Optional[KVTransferConfig] = None  # validated; None: no KV connector
    kv_events_config: Optional[KVEventsConfig] = None  # validated; None: no KV events published
    speculative_config: Optional[SpeculativeConfig] = None  # validated; None: no speculative decoding
    # speculative_config's draft model (method "draft_model"), derived here like the target's
    draft_model_config: Optional[ModelConfig] = None
    lora_config: Optional[LoRAConfig] = None  # validated; None: no LoRA adapters (enable_lora=False)
    # num_threads is the engine's own default (engine/thread_policy.py) and above 1: the runner
    # picks 1..num_threads per step from measured step times (engine/worker/thread_tuner.py)
    adapt_threads: bool = False

    @property
    def max_seqs_per_request(self) -> int:
        """The most sequences (prompts x n) one request may ask for: SEQS_PER_REQUEST_IN_BATCHES
        scheduler batches (max_num_seqs, over all data-parallel ranks). More could never run
        together and would hold the engine for many batch lengths; the server refuses such a
        request with a 400 (split it), and every entry point refuses such an ``n``."""
        batch = self.scheduler_config.max_num_seqs * self.parallel_config.data_parallel_size
        return SEQS_PER_REQUEST_IN_BATCHES * batch
