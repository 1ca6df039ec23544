"""``Worker``: what the EngineCore drives to run the model (vLLM's worker interface).

The EngineCore builds one worker per process, from ``worker_cls`` ("auto": this class; a
subclass given as a class or a dotted path replaces it), and calls, in order:

- ``init_device()``: bind the process to its device;
- ``load_model()``: load the weights;
- ``initialize_kv_cache() -> int``: size and allocate the paged KV cache, returning its
  number of blocks (vLLM's ``determine_num_available_blocks`` + ``initialize_cache``);
- ``execute_model(scheduler_output) -> ModelRunnerOutput``: once per step that runs
  requests (contract: engine/core/sched_output.py).

A method marked ``@rpc_method`` may be called by name from the frontend through
``LLM.collective_rpc`` / ``AsyncLLM.collective_rpc`` (its result must be msgspec-encodable);
nothing else is reachable, so a frontend can never call ``load_model`` or a helper that was
public only for the worker's own use.
A step that raises fails the requests it ran, not the engine (engine/core/engine_core.py).

This module imports no torch: the frontend imports it to check a ``worker_cls``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, Union

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.core.sched_output import ModelRunnerOutput, SchedulerOutput

_F = TypeVar("_F", bound=Callable[..., Any])
_RPC_MARK = "_ringllm_rpc_method"


def rpc_method(fn: _F) -> _F:
    """Marks a worker method as callable through ``collective_rpc``."""
    setattr(fn, _RPC_MARK, True)
    return fn


def rpc_callable(worker: Any, name: Any) -> Optional[Callable[..., Any]]:
    """The bound method ``name`` of ``worker`` if it is marked ``@rpc_method``, else None."""
    if not isinstance(name, str) or name.startswith("_"):
        return None
    fn = getattr(type(worker), name, None)
    if not getattr(fn, _RPC_MARK, False):
        return None
    return getattr(worker, name)


class Worker:
    """The default worker: owns a ``ModelRunner`` and hands it each step."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_runner = None  # set by load_model

    def init_device(self) -> None:
        if self.config.device == "cuda":
            import torch

            torch.cuda.set_device(0)

    def load_model(self) -> None:
        from engine.worker.model_runner import ModelRunner

        self.model_runner = ModelRunner(self.config)

    def initialize_kv_cache(self) -> int:
        return self.model_runner.initialize_kv_cache()

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.model_runner.execute_model(scheduler_output)

    @rpc_method
    def thread_choices(self) -> dict[str, int]:
        """The model's thread count the runner runs now per step size ("up to N scheduled tokens"
        -> threads; engine/worker/thread_tuner.py); empty when the count is fixed (given by the
        user, or one thread)."""
        tuner = getattr(self.model_runner, "thread_tuner", None)
        if tuner is None:
            return {}
        return {str((1 << key) - 1): threads for key, threads in tuner.choices().items()}

    def add_lora(self, lora_request: Any) -> bool:
        """Load and check an adapter (engine/lora/manager.py); ValueError naming what is wrong."""
        return self._lora().add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self._lora().remove_lora(lora_int_id)

    def list_loras(self) -> list[int]:
        return self._lora().list_loras()

    def _lora(self) -> Any:
        lora = getattr(self.model_runner, "lora", None)
        if lora is None:
            raise ValueError("lora_request: LoRA adapters are not enabled; start the engine with enable_lora=True")
        return lora

    @property
    def kv_connector(self) -> Optional[Any]:
        """The KV connector the scheduler consults (engine/kv_transfer/), or None."""
        return getattr(self.model_runner, "kv_connector", None)

    @property
    def draft_proposer(self) -> Optional[Any]:
        """speculative_config's draft model, which the scheduler asks for drafts
        (engine/spec_decode/draft_model.py), or None."""
        return getattr(self.model_runner, "drafter", None)


def resolve_worker_cls(value: Union[str, type]) -> type[Worker]:
    """``worker_cls`` as a class: Worker for "auto", the class a dotted path "module.Class"
    names, or the class given. ValueError unless it is a Worker subclass."""
    if isinstance(value, str):
        if value == "auto":
            return Worker
        module_name, _, class_name = value.rpartition(".")
        if not module_name:
            raise ValueError(f"worker_cls must be 'auto', a dotted path 'module.Class' or a class, got {value!r}")
        try:
            cls = getattr(importlib.import_module(module_name), class_name, None)
        except ImportError as e:
            raise ValueError(f"worker_cls: cannot import module {module_name!r} ({e})") from None
        if cls is None:
            raise ValueError(f"worker_cls: module {module_name!r} has no {class_name!r}")
    elif isinstance(value, type):
        cls = value
    else:
        raise ValueError(f"worker_cls must be 'auto', a dotted path 'module.Class' or a class, got {value!r}")
    if not (isinstance(cls, type) and issubclass(cls, Worker)):
        raise ValueError(f"worker_cls must be a subclass of engine.worker.Worker, got {value!r}")
    return cls
