"""The model side of the EngineCore: the Worker it drives, weights loading, the model runner
and the sampler. ``engine.worker.Worker`` is the base class a ``worker_cls`` subclasses."""

from engine.worker.worker import Worker, resolve_worker_cls, rpc_callable, rpc_method

__all__ = ["Worker", "resolve_worker_cls", "rpc_callable", "rpc_method"]
