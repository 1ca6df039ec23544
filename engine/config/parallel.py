"""``ParallelConfig``: data parallelism (one EngineCore per rank). Each core runs the whole model
on one device, so vLLM's tensor and pipeline parallel keywords are accepted only at 1."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from engine.config.checks import positive_int

if TYPE_CHECKING:
    from engine.config.args import EngineArgs


@dataclass(frozen=True)
class ParallelConfig:
    data_parallel_size: int
    data_parallel_rank: Optional[int]
    data_parallel_external_lb: bool

    @property
    def frontend_engine_indices(self) -> list[int]:
        """The ranks one frontend launches and talks to: all of them, or only its own when an
        external load balancer spreads requests over one frontend per rank."""
        if self.data_parallel_size > 1 and self.data_parallel_external_lb:
            return [self.data_parallel_rank or 0]
        return list(range(self.data_parallel_size))


def create_parallel_config(args: EngineArgs) -> ParallelConfig:
    dp = positive_int("data_parallel_size", args.data_parallel_size, 1, 64)
    if args.data_parallel_rank is not None:
        positive_int("data_parallel_rank", args.data_parallel_rank, 0, dp - 1)
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        value = getattr(args, name)
        if value != 1:
            raise ValueError(
                f"{name}={value!r} is not supported: each EngineCore runs the whole model on one "
                f"device, so {name} must be 1 (for more engines use data_parallel_size)"
            )
    return ParallelConfig(
        data_parallel_size=dp,
        data_parallel_rank=args.data_parallel_rank,
        data_parallel_external_lb=args.data_parallel_external_lb,
    )
