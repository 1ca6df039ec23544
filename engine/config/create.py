"""``create_engine_config``: the only place the arguments become a config. It runs once, in the
frontend, before any EngineCore starts; every bad value raises a ValueError naming the field and
what is allowed. The core receives the result whole (engine/config/wire.py) and derives nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

import engine.config.device_config as device_config
from engine.config.cache import check_block_size, create_cache_config
from engine.config.checks import bad_value, positive_int
from engine.config.compilation import resolve_compilation_config
from engine.config.engine import EngineConfig
from engine.config.frontend import create_frontend_config
from engine.config.model import check_quantization_name, create_model_config
from engine.config.parallel import create_parallel_config
from engine.config.scheduler import POLICIES, create_scheduler_config
from engine.config.speculative import create_draft_model_config
from engine.kv_events_config import resolve_kv_events_config
from engine.kv_transfer.config import resolve_kv_transfer_config
from engine.lora.config import resolve_lora_config
from engine.spec_decode.config import resolve_speculative_config
from engine.structured_output.config import resolve_structured_outputs_config
from engine.thread_policy import model_threads, threads_adapt
from engine.worker.worker import resolve_worker_cls

if TYPE_CHECKING:
    from engine.config.args import EngineArgs

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
TRANSPORTS = ("shm", "zmq")


def create_engine_config(args: EngineArgs, sync_frontend: bool = False) -> EngineConfig:
    # 1) what needs no model (milliseconds): a value wrong on its face never reads a model file
    if args.load_format not in LOAD_FORMATS:
        raise bad_value("load_format", f"one of {LOAD_FORMATS}", args.load_format)
    if args.transport not in TRANSPORTS:
        raise bad_value("transport", "'shm' or 'zmq'", args.transport)
    if args.scheduling_policy not in POLICIES:
        raise bad_value("scheduling_policy", "'fcfs' or 'priority'", args.scheduling_policy)
    check_block_size(args.block_size)
    parallel = create_parallel_config(args)
    positive_int("max_logprobs", args.max_logprobs, 0)
    positive_int("max_prompt_logprobs_entries", args.max_prompt_logprobs_entries, 0)
    frontend = create_frontend_config(args)
    ring_capacity = positive_int("ring_capacity", args.ring_capacity, 1 << 12, 1 << 32)
    if ring_capacity & (ring_capacity - 1):
        raise bad_value("ring_capacity", "a power of two in [4096, 2**32]", ring_capacity)
    check_quantization_name(args.quantization)
    compilation = resolve_compilation_config(args.compilation_config, args.enforce_eager)
    if args.deterministic and compilation.mode != 0:
        raise ValueError(
            "deterministic: runs the eager forward (its kernels are chosen per op, not per "
            "graph); drop compilation_config or set its mode to 0"
        )
    worker_cls = _checked_worker_cls(args.worker_cls)
    kv_transfer = resolve_kv_transfer_config(args.kv_transfer_config)
    kv_events = resolve_kv_events_config(args.kv_events_config)
    structured_outputs = resolve_structured_outputs_config(args.structured_outputs_config)
    speculative = resolve_speculative_config(args.speculative_config)
    lora = resolve_lora_config(args)
    if lora is not None and compilation.mode != 0:
        raise ValueError(
            "enable_lora: the compiled graphs do not carry the adapters' per-row updates; drop "
            "compilation_config or set its mode to 0"
        )
    num_threads = positive_int("num_threads", model_threads(args.num_threads, args.model, sync_frontend), 1, 1024)

    # 2) the model's files, read once here (the core reads none of them for its config)
    device = device_config.resolve_device(args.device)
    model = create_model_config(args, device)
    # MEAN pooling needs every prompt row computed: no prefix cache, no KV loaded by a connector
    # (LAST pooling always computes the last prompt token, so both are fine there).
    mean_pooling = model.pooler_config is not None and model.pooler_config.pooling_type == "MEAN"
    if mean_pooling and kv_transfer is not None:
        raise ValueError(
            "kv_transfer_config: MEAN pooling computes every prompt token, so KV loaded from a "
            "connector cannot be used; drop kv_transfer_config or use pooling_type LAST"
        )
    draft = (
        create_draft_model_config(args, speculative.model, model, device)
        if speculative is not None and speculative.method == "draft_model"
        else None
    )

    # 3) what follows from the model
    return EngineConfig(
        model_config=model,
        cache_config=create_cache_config(args, device, mean_pooling),
        scheduler_config=create_scheduler_config(args, model.max_model_len),
        parallel_config=parallel,
        compilation_config=compilation,
        device=device,
        num_threads=num_threads,
        adapt_threads=threads_adapt(args.num_threads, num_threads),
        transport=args.transport,
        ring_capacity=ring_capacity,
        disable_log_stats=args.disable_log_stats,
        frontend_config=frontend,
        structured_outputs_config=structured_outputs,
        worker_cls=worker_cls,
        kv_transfer_config=kv_transfer,
        kv_events_config=kv_events,
        speculative_config=speculative,
        draft_model_config=draft,
        lora_config=lora,
    )


def _checked_worker_cls(value: Any) -> Union[str, type]:
    """``worker_cls`` checked before any launch: "auto", a dotted path (imported here, and by
    the EngineCore at launch) or a class (cloudpickled into the launch spec,
    engine/client/core_launcher.py). ValueError unless it names an ``engine.worker.Worker``."""
    if not (isinstance(value, str) and value == "auto"):
        resolve_worker_cls(value)
    return value
