"""``compilation_config``: whether the model's forward runs eagerly or through torch.compile, and
which decode batch sizes are captured as CUDA graphs (vLLM's CompilationConfig)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from engine.config.checks import bad_value


@dataclass
class CompilationConfig:
    """mode 0 runs the model eagerly; mode >= 1 runs its forward through torch.compile.
    cudagraph_capture_sizes: decode batch sizes captured as CUDA graphs on a GPU (None: the
    default ladder, engine/worker/cuda_graphs.py; []: none, as ``enforce_eager=True`` sets)."""

    mode: int = 0
    cudagraph_capture_sizes: Optional[list[int]] = None

    def __post_init__(self) -> None:
        if not isinstance(self.mode, int) or not 0 <= self.mode <= 3:
            raise bad_value("compilation_config.mode", "an int in [0, 3]", self.mode)
        sizes = self.cudagraph_capture_sizes
        if sizes is not None and not (
            isinstance(sizes, (list, tuple))
            and all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes)
        ):
            raise bad_value("compilation_config.cudagraph_capture_sizes", "a list of positive ints", sizes)


def resolve_compilation_config(value: Any, enforce_eager: bool) -> CompilationConfig:
    """``compilation_config`` (None, a mode as an int, a dict or a CompilationConfig); with
    ``enforce_eager`` always mode 0 and no CUDA graphs."""
    if value is None:
        cfg = CompilationConfig()
    elif isinstance(value, CompilationConfig):
        cfg = value
    elif isinstance(value, int) and not isinstance(value, bool):
        cfg = CompilationConfig(mode=value)
    elif isinstance(value, dict):
        cfg = CompilationConfig(**value)
    else:
        raise bad_value("compilation_config", "an int, a dict or a CompilationConfig", value)
    return CompilationConfig(mode=0, cudagraph_capture_sizes=[]) if enforce_eager else cfg
