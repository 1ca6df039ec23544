"""``CacheConfig``: the paged KV cache's block size, prefix caching and size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from engine.config.checks import bad_value, positive_int

if TYPE_CHECKING:
    from engine.config.args import EngineArgs

DEFAULT_CPU_KV_CACHE_BYTES = 2 << 30


@dataclass(frozen=True)
class CacheConfig:
    block_size: int
    enable_prefix_caching: bool
    kv_cache_memory: Optional[int]  # bytes; None (CUDA, not given): the runner sizes by gpu_memory_utilization
    gpu_memory_utilization: float


def check_block_size(value: object) -> int:
    block_size = positive_int("block_size", value, 1, 1024)
    if block_size & (block_size - 1):
        raise bad_value("block_size", "a power of two in [1, 1024]", block_size)
    return block_size


def create_cache_config(args: EngineArgs, device: str, mean_pooling: bool) -> CacheConfig:
    """MEAN pooling needs every prompt row computed, so it turns the prefix cache off."""
    if not 0.0 < args.gpu_memory_utilization <= 1.0:
        raise bad_value("gpu_memory_utilization", "in (0, 1]", args.gpu_memory_utilization)
    return CacheConfig(
        block_size=check_block_size(args.block_size),
        enable_prefix_caching=bool(args.enable_prefix_caching) and not mean_pooling,
        kv_cache_memory=_kv_cache_memory_bytes(args, device),
        gpu_memory_utilization=args.gpu_memory_utilization,
    )


def _kv_cache_memory_bytes(args: EngineArgs, device: str) -> Optional[int]:
    """``kv_cache_memory_bytes``, or its alias ``kv_cache_memory``; by default 2 GiB on CPU and,
    on CUDA, None: the runner sizes the cache from free memory and ``gpu_memory_utilization``."""
    given = {
        name: getattr(args, name)
        for name in ("kv_cache_memory_bytes", "kv_cache_memory")
        if getattr(args, name) is not None
    }
    if len(set(given.values())) > 1:
        raise ValueError(f"kv_cache_memory_bytes and its alias kv_cache_memory disagree: {given}")
    if not given:
        return DEFAULT_CPU_KV_CACHE_BYTES if device == "cpu" else None
    name, value = next(iter(given.items()))
    return positive_int(name, value, 1)
