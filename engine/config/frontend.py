"""``FrontendConfig``: what only the frontend process reads: its renderer pool's size and how long
shutting down waits for the EngineCores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.config.checks import bad_value, positive_int

if TYPE_CHECKING:
    from engine.config.args import EngineArgs


@dataclass(frozen=True)
class FrontendConfig:
    renderer_num_workers: int = 1  # threads that tokenize, render templates and detokenize (renderer.py)
    shutdown_timeout: float = 5.0  # seconds AsyncLLM.shutdown() gives the EngineCore(s) before killing them


def create_frontend_config(args: EngineArgs) -> FrontendConfig:
    timeout = args.shutdown_timeout
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 <= timeout < float("inf"):
        raise bad_value("shutdown_timeout", "a finite number of seconds >= 0", timeout)
    return FrontendConfig(
        renderer_num_workers=positive_int("renderer_num_workers", args.renderer_num_workers, 1),
        shutdown_timeout=float(timeout),
    )
