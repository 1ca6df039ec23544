"""``EngineArgs``: the one argument schema shared by ``LLM``, ``AsyncLLM`` and the ``ringllm serve``
flags (vLLM's field names; engine/entrypoints/cli_args.py makes one flag per field).

Raw and unchecked on purpose: ``create_engine_config`` (engine/config/create.py) is the only
place the arguments become a config, and nothing past it reads them. A new argument is a field
here, its check and its place in a typed sub-config there, and its help line in cli_args.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from engine.config.compilation import CompilationConfig
from engine.config.create import create_engine_config
from engine.config.engine import EngineConfig
from engine.config.model_discovery import DEFAULT_MODEL
from engine.kv_events_config import KVEventsConfig
from engine.kv_transfer.config import KVTransferConfig
from engine.pooler_config import PoolerConfig
from engine.spec_decode.config import SpeculativeConfig
from engine.structured_output.config import StructuredOutputsConfig


@dataclass
class EngineArgs:
    model: str = DEFAULT_MODEL
    tokenizer: Optional[str] = None
    trust_remote_code: bool = False
    dtype: str = "auto"
    seed: Optional[int] = 0
    max_model_len: Optional[int] = None
    block_size: int = 16
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    # Most prompt tokens computed in one step (decodes not counted); None/0: no cap; "auto": as
    # many as fit a time budget per step, measured (engine/core/prefill_pacer.py). `ringllm
    # serve` on CPU uses "auto" (see engine/entrypoints/serve.py).
    max_num_prefill_tokens: Optional[Union[int, Literal["auto"]]] = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    load_format: str = "auto"
    device: str = "auto"
    # KV cache bytes (vLLM's name; CPU default 2 GiB, CUDA: gpu_memory_utilization)
    kv_cache_memory_bytes: Optional[int] = None
    kv_cache_memory: Optional[int] = None  # the same, by its older ringllm name
    gpu_memory_utilization: float = 0.9
    max_logprobs: int = 20
    max_prompt_logprobs_entries: int = 65536  # prompt tokens x (prompt_logprobs + 1) x n, per request
    num_threads: Optional[int] = None  # torch threads in the process that runs the model
    enforce_eager: bool = False
    compilation_config: Optional[CompilationConfig | int | dict] = None
    data_parallel_size: int = 1
    data_parallel_rank: Optional[int] = None
    data_parallel_external_lb: bool = False
    transport: Literal["shm", "zmq"] = "shm"
    ring_capacity: int = 1 << 22  # bytes per ring direction
    skip_tokenizer_init: bool = False
    disable_log_stats: bool = False
    renderer_num_workers: int = 1
    served_model_name: Optional[str] = None
    hf_overrides: Optional[dict] = None
    # vLLM keywords for what ringllm runs one way only: accepted at that value, refused otherwise.
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    quantization: Optional[str] = None
    # Seconds AsyncLLM.shutdown() gives the EngineCore(s) to exit before killing them.
    shutdown_timeout: float = 5.0
    # The EngineCore's worker: "auto" (engine.worker.Worker), a dotted path "module.Class" or
    # a Worker subclass, cloudpickled to the EngineCore process at launch (engine/client/core_launcher.py).
    worker_cls: Union[str, type] = "auto"
    # vLLM's KV connector config (engine/kv_transfer/): a dict or a KVTransferConfig.
    kv_transfer_config: Optional[KVTransferConfig | dict] = None
    # vLLM's KV-cache events (engine/core/kv_events.py): a dict or a KVEventsConfig.
    kv_events_config: Optional[KVEventsConfig | dict] = None
    # Structured outputs (engine/structured_output/): {"backend": "auto" | "xgrammar" | "guidance", ...}.
    structured_outputs_config: Optional[StructuredOutputsConfig | dict] = None
    # vLLM's runner and convert: "pooling" serves a *ForCausalLM as an embedding model
    # (convert "embed": the final normed hidden states, pooled as pooler_config says).
    runner: Literal["auto", "generate", "pooling"] = "auto"
    convert: Literal["auto", "none", "embed"] = "auto"
    pooler_config: Optional[PoolerConfig | dict] = None
    # Greedy output (tokens and logprobs) the same at any batch size and with or without
    # prefix-cache hits: one kernel path per op whatever the row count (vLLM's batch invariance,
    # VLLM_BATCH_INVARIANT). CPU, eager forward only; costs speed (README, "Determinism").
    deterministic: bool = False
    # vLLM's speculative decoding (engine/spec_decode/): a dict, e.g. {"method": "ngram",
    # "num_speculative_tokens": 4, "prompt_lookup_max": 5}, or a SpeculativeConfig.
    speculative_config: Optional[SpeculativeConfig | dict] = None
    # vLLM's LoRA serving (engine/lora/): requests may name an adapter (lora_request); at most
    # max_loras adapters run in one step, each of rank <= max_lora_rank; max_cpu_loras stay loaded.
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: Optional[int] = None

    def create_engine_config(self, sync_frontend: bool = False) -> EngineConfig:
        """``sync_frontend``: for ``LLM``/``LLMEngine``, whose caller waits while the core steps, so
        the model's default threads take every core (engine/thread_policy.py)."""
        return create_engine_config(self, sync_frontend)

    @classmethod
    def from_cli_args(cls, args: Any) -> "EngineArgs":
        """From an argparse namespace holding one attribute per field, as the flags that
        ``engine.entrypoints.cli_args.add_engine_args`` generates from this dataclass."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


@dataclass
class AsyncEngineArgs(EngineArgs):
    enable_log_requests: bool = False


def non_default_args(args: EngineArgs) -> dict[str, Any]:
    """The fields a user set, for the one log line LLM prints at start-up."""
    defaults = type(args)()
    return {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(args)
        if getattr(args, f.name) != getattr(defaults, f.name)
    }
