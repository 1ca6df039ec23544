"""``CustomOp``: one operation with several implementations, one of them chosen at construction.

vLLM's ``model_executor/custom_op.py`` shape at our size: ``dispatch_forward`` runs once, in
``__init__``, and every call goes straight to the chosen method, so no call site asks which
device, dtype or mode it runs in. The implementations:

- ``forward_native``: torch ops only; any device, and what ``torch.compile`` fuses best.
- ``forward_cpu``: the raw C-kernel call (cffi, engine/kernels/*.py), the eager CPU path. It is
  opaque to dynamo, so it never runs inside a compiled graph.
- ``forward_op``: the same kernel through its registered torch op (engine/kernels/ops.py), which
  a compiled graph traces as one node; it costs torch's dispatcher on every call, so eager
  forwards do not use it.
- ``forward_cuda``: CUDA's implementation (native unless a subclass has one).

``in_graph``: the instance runs inside a ``torch.compile`` graph. A subclass whose kernel has no
torch equivalent worth compiling (the GGUF, int8 and bf16 GEMVs) sets ``OP_IN_GRAPH`` so such an
instance runs ``forward_op``; the others run ``forward_native`` there, as vLLM leaves its
elementwise custom ops to inductor by default.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


class CustomOp:
    OP_IN_GRAPH = False  # in a compiled graph: forward_op (the kernel) rather than forward_native

    def __init__(self, device: torch.device, in_graph: bool = False) -> None:
        self._forward_method = self.dispatch_forward(torch.device(device), in_graph)

    def dispatch_forward(self, device: torch.device, in_graph: bool) -> Callable[..., Any]:
        if device.type == "cuda":
            return self.forward_cuda
        if device.type != "cpu":
            return self.forward_native
        if in_graph:
            return self.forward_op if self.OP_IN_GRAPH else self.forward_native
        return self.forward_cpu

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward_method(*args, **kwargs)

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no torch implementation")

    def forward_cpu(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_native(*args, **kwargs)

    def forward_op(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_native(*args, **kwargs)

    def forward_cuda(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_native(*args, **kwargs)
